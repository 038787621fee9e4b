"""raytrain's own checks read a RayJob's entrypoint as `raytrain run` reads its command line (the cross-checks
against run configs and clusters run through `validate_paths` in test_validate.py)."""

import pytest

from raytrain.validator.raytrain_rules import EntrypointError, RaytrainRun, parse_entrypoint

ENTRY = "raytrain run job.yaml --name linear --storage /mnt/shared/runs --address auto"


ENTRYPOINTS = [
    (ENTRY, RaytrainRun("job.yaml", [], "linear", "/mnt/shared/runs", "auto", False)),
    ("cd /x && raytrain run linear --set a=1 --set=b=2 --smoke-test --address auto; echo done",
     RaytrainRun("linear", ["a=1", "b=2"], None, None, "auto", True)),
    ("/opt/venv/bin/raytrain run 'my job.yaml' --name n", RaytrainRun("my job.yaml", [], "n", None, None, False)),
    ("raytrain run linear --wait-for-lease --address auto", RaytrainRun("linear", [], None, None, "auto", False)),
    ("python /home/ray/samples/sample_code.py", None),
]


@pytest.mark.parametrize("entrypoint,expected", ENTRYPOINTS)
def test_parse_entrypoint(entrypoint, expected):
    assert parse_entrypoint(entrypoint) == expected


def test_parse_entrypoint_errors():
    with pytest.raises(EntrypointError, match="the following arguments are required: CONFIG"):
        parse_entrypoint("raytrain run --address auto")
    with pytest.raises(EntrypointError, match="cannot be split"):
        parse_entrypoint("raytrain run 'job.yaml")
