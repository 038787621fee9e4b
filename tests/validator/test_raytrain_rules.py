"""raytrain's own checks read a RayJob's entrypoint as `raytrain run` reads its command line (the cross-checks
against run configs and clusters run through `validate_paths` in test_validate.py)."""

from pathlib import Path

import pytest
import yaml

from raytrain.validator.raytrain_rules import EntrypointError, RaytrainRun, parse_entrypoint
from raytrain.validator.validate import validate_paths

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


# ----------------------------------------------------------------------------------------------------------
# the grace period against the preStop drain (issue 40): a negative terminationGracePeriodSeconds passes the API
# server, which stores 1 s; a grace period not above `raytrain drain --wait` kills the pod mid-drain.

S3_JOB = Path(__file__).resolve().parents[2] / "manifests" / "rayjob-s3.yaml"
GROUPS = {"head": ["spec", "rayClusterSpec", "headGroupSpec"], "worker": ["spec", "rayClusterSpec", "workerGroupSpecs", 0]}
KEEP = object()  # the manifest's own hook: raytrain drain --wait 50

GRACE = [
    # (case, group, terminationGracePeriodSeconds (None: left out), the Ray container's preStop command, words)
    ("shipped: 60 over a drain of 50", "worker", 60, KEEP, None),
    ("negative worker grace with the drain", "worker", -5, KEEP,
     "is -5 in group worker: the API server accepts a negative grace period and stores 1 s"),
    ("negative head grace with the drain", "head", -1, KEEP, "cutting off the preStop `raytrain drain --wait 50`"),
    ("negative grace without a hook", "worker", -30, None, "cutting off a run's checkpoint on SIGTERM"),
    ("grace equal to the drain's wait", "worker", 50, KEEP, "is 50 in group worker, not above its preStop"),
    ("grace below --wait=45", "head", 40, ["raytrain", "drain", "--wait=45"], "not above its preStop"),
    ("grace below the default wait of 50", "worker", 45, ["/opt/venv/bin/raytrain", "drain"], "--wait 50"),
    ("Kubernetes' 30 below the drain", "worker", None, KEEP, "is 30 in group worker, not above"),
    ("zero without a hook", "worker", 0, None, None),
    ("another preStop hook", "worker", 5, ["sh", "-c", "sleep 3"], None),
]


@pytest.mark.parametrize("case, group, grace, command, words", GRACE, ids=[c[0] for c in GRACE])
def test_the_grace_period_holds_the_drain(crd_dir, tmp_path, case, group, grace, command, words):
    docs = [d for d in yaml.safe_load_all(S3_JOB.read_text()) if d]
    [job] = [d for d in docs if d["kind"] == "RayJob"]
    node = job
    for key in GROUPS[group]:
        node = node[key]
    pod = node["template"]["spec"]
    pod.pop("terminationGracePeriodSeconds")
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace
    if command is None:
        pod["containers"][0].pop("lifecycle")
    elif command is not KEEP:
        pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] = command
    path = tmp_path / "rayjob.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    found = [p for p in validate_paths([path], crd_dir) if p.is_error]
    if words is None:
        assert found == [], "\n".join(map(str, found))
        return
    field = {"head": "spec.rayClusterSpec.headGroupSpec", "worker": "spec.rayClusterSpec.workerGroupSpecs[0]"}[group]
    assert [(p.field, words in p.message) for p in found] == \
        [(f"{field}.template.spec.terminationGracePeriodSeconds", True)], "\n".join(map(str, found))
    assert found[0].fix and found[0].obj == "RayJob/raytrain-linear-s3"
