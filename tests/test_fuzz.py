"""A seeded, bounded fuzz of what users hand raytrain: run configs (files and --set values), manifests and chart
values files, mutated by structure (a value replaced by a hostile one, a key dropped, added, duplicated) and by
bytes (cut, non-UTF-8, tabs, stray YAML), then driven through the real entry points in-process: `raytrain.cli.main`
for `validate`, `load_config` for run configs. Every input must end in an answer (OK, or problems / one error with a
Fix), never a traceback, and within a few seconds. A failure prints the seed and case to replay it."""

from __future__ import annotations

import contextlib
import copy
import os
import random
import signal
import time
from pathlib import Path

import pytest
import yaml

from raytrain.cli import main
from raytrain.errors import RaytrainError
from raytrain.spec.config import PRESETS_DIR, load_config

REPO = Path(__file__).resolve().parents[1]
# Two seeds in the unit tier (seconds); RAYTRAIN_FUZZ_SEEDS=200 soaks seeds 0-199, =200:400 seeds 200-399.
_SOAK = os.environ.get("RAYTRAIN_FUZZ_SEEDS", "")
SEEDS = tuple(range(*map(int, _SOAK.split(":"))) if ":" in _SOAK else range(int(_SOAK))) if _SOAK else (29, 30)
CASE_LIMIT_S = 20  # one input: anything slower is a hang

HOSTILE = [True, False, None, 0, -1, -(2**31) - 1, 2**63, 10**40, 1e308, -1e-9, float("nan"), float("inf"), "", " ",
           "auto", "null", "true", "abc", "a b", "a\x00b", "\t", "x" * 300, "ünïcødé", "😀", "-1Gi", "1e3", "0x10",
           "70000", "../..", "/", "a/b", "{", "- x", [], [1, "a"], {}, {"k": "v"}, {"_component_": "os.system"},
           [[[[[[[[["deep"]]]]]]]]], "[" * 2000 + "]" * 2000, "a: 1\na: 2\n", "train:\n  epochs: true\n",
           "raytrain run job.yaml --set train.epochs=" + "9" * 5000, "raytrain run linear --name 2024 --set x",
           "raytrain run job.yaml --name null --storage /mnt/shared/runs --address auto --smoke-test"]
TEXT_NOISE = ["\t", "\x00", "---\n", "...\n", "&a ", "*a", "!!python/object:os.system ", "? ", ": ", "{", "]", "#",
              "%YAML 1.1\n", "\ufeff", "<<: *a\n"]


@contextlib.contextmanager
def deadline(seconds: int, what: str):
    def hang(signum, frame):
        raise AssertionError(f"no answer within {seconds}s (a hang?) for {what}")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _paths(node, prefix=()):
    """Every path to a value inside nested dicts and lists (the containers too)."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


def mutate_data(rng: random.Random, data):
    """One to three structural edits: replace a value, drop a key, add one, or swap a mapping for another type."""
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(data) if p]
        if not paths:
            return rng.choice(HOSTILE)
        path = rng.choice(paths)
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        action = rng.random()
        if action < 0.6:
            parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
        elif action < 0.75 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action < 0.9 and isinstance(parent, dict):
            parent[rng.choice(["extra", "name", "kind", "apiVersion", "metadata", "_component_", "smoke", "include",
                               str(path[-1]) + "x"])] = copy.deepcopy(rng.choice(HOSTILE))
        else:
            parent[path[-1]] = [parent[path[-1]]]
    return data


def mutate_text(rng: random.Random, text: str) -> bytes:
    """Byte-level damage: a cut, noise inserted, a line duplicated (a duplicate key), Latin-1 bytes."""
    action = rng.random()
    if action < 0.25:
        return text[: rng.randint(0, len(text))].encode()
    if action < 0.5:
        at = rng.randint(0, len(text))
        return (text[:at] + rng.choice(TEXT_NOISE) + text[at:]).encode()
    if action < 0.7:
        lines = text.splitlines(keepends=True)
        i = rng.randrange(len(lines)) if lines else 0
        return "".join(lines[: i + 1] + lines[i:]).encode()
    if action < 0.85:
        data = bytearray(text.encode())
        if data:
            data[rng.randrange(len(data))] = rng.choice([0xFF, 0xE9, 0x80, 0xC3])
        return bytes(data)
    return text.encode("utf-16")


def dump(rng: random.Random, docs: list) -> bytes:
    try:
        text = yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:
        text = "{}"
    return mutate_text(rng, text) if rng.random() < 0.3 else text.encode()


def run_cli(args: list[str], capsys, what: str) -> int:
    with deadline(CASE_LIMIT_S, what):
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse's own usage errors
            code = exit_.code
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err, f"{what}:\n{out.err}"
    assert code in (0, 1, 2), f"{what}: exit {code}\n{out.err}"
    if code:
        assert "Fix" in out.err or "usage:" in out.err, f"{what}: an error without a fix:\n{out.err}"
    return code


@pytest.mark.parametrize("seed", SEEDS)
def test_validate_answers_every_mutated_manifest(tmp_path, capsys, seed):
    rng = random.Random(seed)
    corpus = [[d for d in yaml.safe_load_all((REPO / "manifests" / name).read_text()) if d]
              for name in ("rayjob.yaml", "rayjob-standalone.yaml")]
    corpus.append(list(yaml.safe_load_all((Path(__file__).parent / "validator" / "test_corev1.py").read_text()
                                          .split('CORE = """')[1].split('"""')[0])))
    started = time.monotonic()
    for case in range(12):
        docs = [mutate_data(rng, d) if rng.random() < 0.5 else d for d in rng.choice(corpus)]
        path = tmp_path / f"case{case}.yaml"
        path.write_bytes(dump(rng, docs))
        run_cli(["validate", str(path)], capsys, f"seed {seed} manifest case {case}: {path.read_bytes()[:2000]!r}")
    assert time.monotonic() - started < 120


@pytest.mark.parametrize("seed", SEEDS)
def test_validate_answers_every_mutated_values_file(tmp_path, capsys, seed):
    rng = random.Random(seed)
    values = yaml.safe_load((REPO / "helm" / "raytrain-cluster" / "values-kind.yaml").read_text())
    for case in range(4):
        path = tmp_path / f"case{case}-values.yaml"
        path.write_bytes(dump(rng, [mutate_data(rng, values)]))
        run_cli(["validate", str(path)], capsys, f"seed {seed} values case {case}: {path.read_bytes()[:2000]!r}")


def _config_corpus() -> list[dict]:
    texts = [p.read_text() for p in sorted(PRESETS_DIR.glob("*.yaml"))]
    return [yaml.safe_load(t) for t in texts]


@pytest.mark.parametrize("seed", SEEDS)
def test_config_loading_answers_every_mutated_config(tmp_path, seed):
    """Each mutated file, with a random --set, loads or is one RaytrainError naming what to fix."""
    rng = random.Random(seed)
    corpus = _config_corpus()
    keys = ["train.epochs", "train.lr", "train.loss", "model.hidden", "model.width", "scaling.num_workers",
            "scaling.cpus_per_worker", "scaling.use_gpu", "run.name", "data.loader", "smoke.x", "train", "x.y.z",
            "model._component_"]
    answered = 0
    for case in range(40):
        path = tmp_path / f"case{case}.yaml"
        data = rng.choice(corpus)
        path.write_bytes(dump(rng, [mutate_data(rng, data) if rng.random() < 0.8 else data]))
        sets = [f"{rng.choice(keys)}={v if isinstance(v, str) else yaml.safe_dump(v).strip()}"
                for v in rng.sample(HOSTILE, rng.randint(0, 2))]
        what = f"seed {seed} config case {case}: {path.read_bytes()[:2000]!r} --set {sets}"
        with deadline(CASE_LIMIT_S, what):
            try:
                load_config(str(path), sets, smoke=rng.random() < 0.5)
            except RaytrainError as err:
                assert "Fix" in str(err), f"{what}: {err}"
                assert len(str(err)) < 3000, f"{what}: a message of {len(str(err))} characters"
            answered += 1
    assert answered == 40


# Objects of other operators' CRDs (issue 40): KubeRay's Gateway API sample, its GatewayClass and a Volcano Queue,
# with their group, version and kind mutated too, validated once with no schema for them (a note each) and once with
# --crds DIR holding Gateway API's GatewayClass CRD, itself mutated at times (checked against it).
OTHER_API_VERSIONS = ["gateway.networking.k8s.io/v1", "gateway.networking.k8s.io/v1beta1", "gateway.networking.k8s.io/v9",
                      "networking.k8s.io/v1", "v1", "apps/v1", "example.com/v1alpha1", "k8s.io/v1", "ray.io/v1", "x/v1"]
OTHER_KINDS = ["Gateway", "HTTPRoute", "GatewayClass", "Queue", "Pod2", "ConfigMap", "RayCluster", "A" * 63]


@pytest.mark.parametrize("seed", SEEDS)
def test_validate_answers_every_mutated_object_of_another_crd(tmp_path, capsys, crd_dir, seed):
    rng = random.Random(seed)
    data = Path(__file__).parent / "validator" / "data"
    corpus = [d for d in yaml.safe_load_all((data / "kuberay-v1.7.0-ray-cluster-agc-gatewayapi.yaml").read_text()) if d]
    corpus += [{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "istio"},
                "spec": {"controllerName": "istio.io/gateway-controller"}},
               {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"},
                "spec": {"weight": 1, "capability": {"cpu": 4}}}]
    crd = yaml.safe_load((data / "gateway-api-v1.6.1-gatewayclasses-crd.yaml").read_text())
    started = time.monotonic()
    for case in range(10):
        docs = [copy.deepcopy(d) for d in rng.sample(corpus, rng.randint(1, len(corpus)))]
        for doc in docs:
            if rng.random() < 0.3:
                doc["apiVersion"] = rng.choice(OTHER_API_VERSIONS)
            if rng.random() < 0.2:
                doc["kind"] = rng.choice(OTHER_KINDS)
        docs = [mutate_data(rng, d) if rng.random() < 0.4 else d for d in docs]
        path = tmp_path / f"case{case}.yaml"
        path.write_bytes(dump(rng, docs))
        crds = tmp_path / f"crds{case}"  # a directory per case: its CRDs are read once per directory
        crds.mkdir()
        for name in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"):
            (crds / name).write_bytes((Path(crd_dir) / name).read_bytes())
        (crds / "gatewayclasses.yaml").write_bytes(dump(rng, [mutate_data(rng, crd) if rng.random() < 0.5 else crd]))
        what = f"seed {seed} other-CRD case {case}: {path.read_bytes()[:2000]!r}"
        for args in (["validate", str(path)], ["validate", "--crds", str(crds), str(path)]):
            run_cli(args, capsys, f"{what} ({' '.join(args[:-1])})")
    assert time.monotonic() - started < 120


def test_the_unmutated_objects_of_other_crds_pass_with_a_note_each(capsys):
    """The fuzz's corpus itself: valid, and said to be unchecked, in the output `raytrain validate` prints."""
    sample = Path(__file__).parent / "validator" / "data" / "kuberay-v1.7.0-ray-cluster-agc-gatewayapi.yaml"
    assert main(["validate", str(sample)]) == 0
    out = capsys.readouterr()
    said = out.out + out.err
    assert said.count("is not checked: no schema") == 2 and "Gateway/ray-cluster-gateway" in said, said


# The keys the last waves added (issue 40): each with values a user could type that are valid, wrong, or hostile.
NEW_KEYS = {
    "train.optimizer": ["adam", "sgd", "lion", {"_component_": "torch.optim.SGD", "lr": 0.1, "momentum": 0.9},
                        {"_component_": "torch.optim.AdamW", "betas": [0.9, 0.95, 0.99]},
                        {"_component_": "torch.optim.SGD", "lr": -1}, {"_component_": "os.system"},
                        {"_component_": "torch.optim.NoSuchOptimizer"}, {"_component_": "torch.optim.SGD", "nope": 1}],
    "train.scheduler": [{"_component_": "torch.optim.lr_scheduler.StepLR", "step_size": 2},
                        {"_component_": "torch.optim.lr_scheduler.StepLR", "step_size": 2, "interval": "step"},
                        {"_component_": "torch.optim.lr_scheduler.StepLR", "step_size": 2, "interval": "hourly"},
                        {"_component_": "torch.optim.lr_scheduler.StepLR"}, {"_component_": "json.loads"},
                        {"interval": "epoch"}, "cosine"],
    "train.grad_accum_steps": [1, 2, 3, 7, 24, 25, 2**31, 10**40],
    "train.batch_size": [24, 12, 2**31 - 1, 2**31, 10**30],
    "train.seed": [0, 2**63 - 1, 2**63, 2**64, 18446744073709551616],
    "train.epochs": [1, 10**7, 10**7 + 1, 10**30],
    "train.torch_threads": [0, 1024, 1025, 10**6],
    "run.checkpointer": ["auto", "file", "sharded", "zip"],
    "run.checkpoint_every_steps": [0, 5, 2**63, 10**30],
    "run.tracking": [{"mlflow": {"uri": "http://m:5000"}}, {"mlflow": {}}, {"wandb": {"project": "p"}},
                     {"wandb": {}}, {"mlflow": {"uri": "http://u:secret@m:5000"}}, {"mlflow": {"token": "t"}},
                     {"sync_every_s": 0}, {"sync_every_s": 10**9}, {"mlflow": {"uri": ""}}, {"neptune": {}}],
    "run.storage_path": ["s3://bucket/runs", "gs://bucket/runs", "s3://Bucket/runs", "s3://ab/runs", "s3:/b/runs",
                         "s3://bucket/../runs", "s3://bucket//runs", "hdfs://n/runs", "s3://", "gs://b/r\x00uns",
                         "s3://" + "b" * 64 + "/runs"],
    "scaling.num_workers": [1, 3, [1, 3], [2, 4], [4, 2], [1, 10**9], [1, 100000], [50000, 100000], [0, 3], 10**9,
                            [3], [1, 2, 3]],
    "scaling.elastic_resize_monitor_interval_s": [1, 86400, 86401, 1e300],
    "scaling.strategy": ["ddp", "fsdp", "zero3"],
    "data.num_samples": [200, 10**6, 10**12, 10**40],
    "scaling.fsdp_wrap": [[], ["Linear"], ["torch.nn.Linear"], ["NoSuchBlock"], ["os.system"], "Linear", [1]],
}


@pytest.mark.parametrize("seed", SEEDS)
def test_the_new_keys_answer_every_mutation_in_bounded_time_and_memory(tmp_path, seed):
    """Optimizer and scheduler components, accumulation, the checkpointer, tracking, storage URLs, elastic worker
    counts and FSDP's wrap, mutated together: each config loads (and its model's FSDP units are checked, as a start
    does before Ray) or is refused in one paragraph that names a key; never a traceback, a hang or a machine's worth
    of memory (an elastic range of a billion counts once took 23 GB)."""
    import re
    import tracemalloc

    from raytrain.driver import preflight

    rng = random.Random(seed)
    names = list(NEW_KEYS)
    key_named = re.compile(r"\b(model|data|loop|train|scaling|run)\.[a-z_]+")
    # torch and the components imported first: what is traced below is each check's own memory
    preflight.check_model_builds(load_config("linear", [f"run.storage_path={tmp_path}", "scaling.strategy=fsdp"]))
    tracemalloc.start()
    try:
        for case in range(30):
            chosen = rng.sample(names, rng.randint(1, 4))
            sets = [f"{key}={yaml.safe_dump(rng.choice(NEW_KEYS[key]), default_flow_style=True)}"
                    .replace("\n...", "").strip() for key in chosen]
            what = f"seed {seed} case {case}: --set {sets}"
            tracemalloc.reset_peak()
            with deadline(CASE_LIMIT_S, what):
                try:
                    cfg = load_config("linear", [f"run.storage_path={tmp_path}", *sets])
                    preflight.check_tracking_destination(cfg)
                    preflight.check_model_builds(cfg)
                except RaytrainError as err:
                    message = str(err)
                    assert "Fix" in message and "\n" not in message.strip(), f"{what}: {message}"
                    assert key_named.search(message) or "MLFLOW_TRACKING_URI" in message, f"{what}: {message}"
                    assert not re.search(r"\w\[", message.split(" is not allowed")[0].split(": ", 1)[-1]), \
                        f"{what}: a pydantic type where the key belongs: {message}"
            peak = tracemalloc.get_traced_memory()[1]
            assert peak < 200 * 2**20, f"{what}: {peak / 2**20:.0f} MiB"
    finally:
        tracemalloc.stop()
