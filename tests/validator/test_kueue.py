"""Kueue's rules for a RayJob or RayCluster it manages (validator/kueue.py), and the quota check of --kueue-queues.

Each case names the kubernetes-sigs/kueue source (main ff69552e) it mirrors; `broken` gets exactly that finding
from the whole `raytrain validate` path, `allowed` (its nearest neighbour Kueue admits) gets none.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from raytrain.validator.kueue import QUEUE_LABEL, QueuesFileError, load_queues, pod_sets
from raytrain.validator.problems import Doc
from raytrain.validator.render import render_chart
from raytrain.validator.validate import validate_paths
from tests.support.patch import DELETE, patched as support_patched

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "raytrain-cluster"
QUEUES = REPO / "examples" / "kueue" / "queues.yaml"
CHOSEN = REPO / "tests" / "support" / "chosen-values.yaml"
Q = {"metadata.labels": {QUEUE_LABEL: "team-a"}}

GROUP = {"groupName": "cpu", "replicas": 2, "minReplicas": 0, "maxReplicas": 2, "rayStartParams": {},
         "template": {"spec": {"containers": [{"name": "ray-worker", "image": "registry.example/app:1",
                                               "resources": {"limits": {"cpu": "4", "memory": "8Gi"}}}]}}}
CLUSTER = {
    "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
    "spec": {"rayVersion": "2.60.0",
             "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                 {"name": "ray-head", "image": "registry.example/app:1",
                  "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}}]}}},
             "workerGroupSpecs": [GROUP]},
}
JOB = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "job"},
       "spec": {"entrypoint": "python -c 'print(1)'", "shutdownAfterJobFinishes": True, "suspend": True,
                "rayClusterSpec": copy.deepcopy(CLUSTER["spec"])}}
SELECTOR_JOB = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "job"},
                "spec": {"entrypoint": "python -c 'print(1)'", "clusterSelector": {"ray.io/cluster": "rc"}}}


def patched(base: dict, patch: dict) -> dict:
    return support_patched(base, patch, merge_mappings=True)  # a mapping given for a mapping adds to it


def validate_obj(tmp_path, obj: dict, crd_dir, queues: Path | None = None):
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(obj, sort_keys=False))
    return path, validate_paths([path], crd_dir, kueue_queues=queues)


@dataclasses.dataclass
class Case:
    id: str
    base: dict
    broken: dict
    allowed: dict
    field: str
    words: str
    severity: str = "error"


C, J, S = patched(CLUSTER, Q), patched(JOB, Q), patched(SELECTOR_JOB, Q)
MANY = [{**GROUP, "groupName": f"g{i}"} for i in range(18)]

CASES = [
    # rayjob_webhook.go validateCreate, lines 120-124
    Case("job with clusterSelector and rayClusterSpec", J, {"spec.clusterSelector": {"ray.io/cluster": "rc"},
                                                            "spec.suspend": DELETE},  # KubeRay refuses suspend there
         {}, "spec.clusterSelector", "should not use an existing cluster"),
    # rayjob_webhook.go Default (line 87) -> jobframework ApplyDefaultForSuspend suspends every labelled RayJob;
    # rayjob_controller.go Skip (lines 115-119) never unsuspends a clusterSelector one; KubeRay v1.7.0
    # ValidateRayJobSpec refuses suspend in clusterSelector mode: the RayJob ends ValidationFailed
    Case("queue label on a clusterSelector job fails it", S, {}, {"metadata.labels": DELETE},
         f"metadata.labels.{QUEUE_LABEL}", "ValidationFailed"),
    # rayjob_webhook.go validateCreate returns on a clusterSelector (lines 126-130) before ValidateJobOnCreate
    # (line 150): the queue name itself is not checked, only the label's effect is named
    Case("clusterSelector job's queue name is not checked", S, {"metadata.labels": {QUEUE_LABEL: "Team_A"}},
         {"metadata.labels": DELETE}, f"metadata.labels.{QUEUE_LABEL}", "ValidationFailed"),
    # rayjob_webhook.go validateCreate, lines 139-142 (KubeRay needs shutdown for suspend: both unset)
    Case("job keeps its cluster", J, {"spec.shutdownAfterJobFinishes": False, "spec.suspend": DELETE}, {},
         "spec.shutdownAfterJobFinishes", "keeps its cluster"),
    # jobframework/defaults.go ApplyDefaultForSuspend, lines 36-46 (rayjob_webhook.go Default, line 87)
    Case("job not suspended at creation", J, {"spec.suspend": DELETE}, {}, "spec.suspend", "suspends the job",
         "note"),
    # common.go ValidateCreate, lines 301-311 (RayJob)
    Case("job's cluster autoscales", J, {"spec.rayClusterSpec.enableInTreeAutoscaling": True},
         {"spec.rayClusterSpec.enableInTreeAutoscaling": True,
          "metadata.annotations": {"kueue.x-k8s.io/elastic-job": "true"}},
         "spec.rayClusterSpec.enableInTreeAutoscaling", "refuses autoscaling"),
    # raycluster_webhook.go validateCreate, lines 143-157 (RayCluster)
    Case("cluster autoscales", C, {"spec.enableInTreeAutoscaling": True}, {"spec.enableInTreeAutoscaling": False},
         "spec.enableInTreeAutoscaling", "refuses autoscaling"),
    # raycluster_webhook.go validateCreate, lines 159-162; jobframework/constants.go MaxPodSets (line 21)
    Case("cluster with 18 worker groups", C, {"spec.workerGroupSpecs": MANY}, {"spec.workerGroupSpecs": MANY[:17]},
         "spec.workerGroupSpecs", "at most 18"),
    # common.go ValidateCreate, lines 313-316
    Case("job's cluster with 18 worker groups", J, {"spec.rayClusterSpec.workerGroupSpecs": MANY},
         {"spec.rayClusterSpec.workerGroupSpecs": MANY[:16]}, "spec.rayClusterSpec.workerGroupSpecs", "at most 18"),
    # rayjob_controller.go PodSets/expectedPodSetsCount (lines 132-163): a K8sJobMode job's submitter is a pod set
    # too, which the webhook does not count, and a Workload holds at most 18 (workload_types.go MaxItems=18)
    Case("job's workload with 19 pod sets", J, {"spec.rayClusterSpec.workerGroupSpecs": MANY[:17]},
         {"spec.rayClusterSpec.workerGroupSpecs": MANY[:16]}, "spec.rayClusterSpec.workerGroupSpecs",
         "cannot be created"),
    Case("sidecar job with 17 worker groups", J, {"spec.rayClusterSpec.workerGroupSpecs": MANY[:17]},
         {"spec.rayClusterSpec.workerGroupSpecs": MANY[:17], "spec.submissionMode": "SidecarMode"},
         "spec.rayClusterSpec.workerGroupSpecs", "stays suspended"),
    # raycluster_webhook.go validateCreate, lines 164-169
    Case("cluster worker group named head", C, {"spec.workerGroupSpecs[0].groupName": "head"},
         {"spec.workerGroupSpecs[0].groupName": "heads"}, "spec.workerGroupSpecs[0].groupName", "reserved"),
    # common.go ValidateCreate, lines 318-326
    Case("job worker group named head", J, {"spec.rayClusterSpec.workerGroupSpecs[0].groupName": "head"}, {},
         "spec.rayClusterSpec.workerGroupSpecs[0].groupName", "reserved"),
    # jobframework/validation.go validateCreateForMaxExecTime, lines 235-247 (strconv.Atoi, > 0)
    Case("max exec time not a number", J, {"metadata.labels": {"kueue.x-k8s.io/max-exec-time-seconds": "2h"}},
         {"metadata.labels": {"kueue.x-k8s.io/max-exec-time-seconds": "7200"}},
         "metadata.labels.kueue.x-k8s.io/max-exec-time-seconds", "not a whole number"),
    Case("max exec time zero", C, {"metadata.labels": {"kueue.x-k8s.io/max-exec-time-seconds": "0"}},
         {"metadata.labels": {"kueue.x-k8s.io/max-exec-time-seconds": "1"}},
         "metadata.labels.kueue.x-k8s.io/max-exec-time-seconds", "above 0"),
    # jobframework/validation.go ValidateQueueName, lines 174-178 (ValidateLabelAsCRDName, lines 146-154)
    Case("queue name not a DNS-1123 subdomain", C, {"metadata.labels": {QUEUE_LABEL: "Team_A"}},
         {"metadata.labels": {QUEUE_LABEL: "team.a"}}, f"metadata.labels.{QUEUE_LABEL}", "DNS-1123"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_broken_kueue_rule_gets_its_finding_alone_and_its_neighbour_passes(crd_dir, tmp_path, case):
    path, problems = validate_obj(tmp_path, patched(case.base, case.broken), crd_dir)
    assert [(p.field, p.severity) for p in problems] == [(case.field, case.severity)], "\n".join(map(str, problems))
    [problem] = problems
    assert case.words in str(problem) and problem.file == str(path) and problem.fix, str(problem)
    _, problems = validate_obj(tmp_path, patched(case.base, case.allowed), crd_dir)
    assert problems == [], "\n".join(map(str, problems))


def test_objects_without_the_queue_label_are_not_kueues(crd_dir, tmp_path):
    """Kueue validates only objects with a queue name (manageJobsWithoutQueueName aside)."""
    for obj in (patched(CLUSTER, {"spec.enableInTreeAutoscaling": True}), SELECTOR_JOB,
                patched(JOB, {"spec.suspend": DELETE, "spec.shutdownAfterJobFinishes": False})):
        assert validate_obj(tmp_path, obj, crd_dir)[1] == []


# ----------------------------------------------------------------------------------------------------------
# counting: common.go BuildPodSets, rayjob_controller.go PodSets


def test_pod_sets_count_replicas_hosts_and_the_submitter_as_kueue_does():
    job = patched(J, {"spec.rayClusterSpec.workerGroupSpecs[0].numOfHosts": 2,
                      "spec.rayClusterSpec.workerGroupSpecs[0].minReplicas": 1})
    sets = pod_sets(Doc("f", job))
    # head: requests win over limits; worker: limits stand in (UseLimitsAsMissingRequestsInPod); replicas x hosts
    assert [(s.name, s.count, s.requests) for s in sets] == [
        ("head", 1, {"cpu": 1.0, "memory": 2 * 2**30}), ("cpu", 4, {"cpu": 4.0, "memory": 8 * 2**30}),
        ("submitter", 1, {"cpu": 0.5, "memory": 200 * 2**20})]  # K8sJobMode's default submitter
    sidecar = pod_sets(Doc("f", patched(J, {"spec.submissionMode": "SidecarMode"})))
    assert [s.name for s in sidecar] == ["head", "cpu"] and sidecar[0].requests["cpu"] == 1.5
    unset = pod_sets(Doc("f", patched(C, {"spec.workerGroupSpecs[0].replicas": DELETE})))
    assert unset[1].count == 1  # effectiveWorkerCount: replicas defaults to 1
    assert pod_sets(Doc("f", S)) == [] and pod_sets(Doc("f", CLUSTER)) == []


# ----------------------------------------------------------------------------------------------------------
# the quota check


def _queues(tmp_path, resources: list, cohort: str | None = None, name="q.yaml") -> Path:
    spec: dict = {"resourceGroups": [{"coveredResources": [r["name"] for r in resources],
                                      "flavors": [{"name": "f", "resources": resources}]}]}
    if cohort:
        spec["cohortName"] = cohort
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "cq"}, "spec": spec},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "team-a"},
         "spec": {"clusterQueue": "cq"}}]))
    return path


# The cluster C asks for head 1 CPU/2Gi + 2 x 4 CPU/8Gi = 9 CPU, 18Gi.
FITS = [
    ("fits exactly", [{"name": "cpu", "nominalQuota": 9}, {"name": "memory", "nominalQuota": "18Gi"}], None, []),
    ("cpu short", [{"name": "cpu", "nominalQuota": "8500m"}, {"name": "memory", "nominalQuota": "18Gi"}], None,
     ["requests 9 cpu in all (head 1 x 1, cpu 2 x 4), more than ClusterQueue cq (LocalQueue team-a) can ever give "
      "it: 8.5 (nominalQuota"]),
    ("memory not covered", [{"name": "cpu", "nominalQuota": 9}], None, ["18Gi memory, which ClusterQueue cq"]),
    ("borrowing limit counts in a cohort", [{"name": "cpu", "nominalQuota": 5, "borrowingLimit": 4},
                                            {"name": "memory", "nominalQuota": "18Gi"}], "pool", []),
    ("borrowing without a cohort does not", [{"name": "cpu", "nominalQuota": 5, "borrowingLimit": 4},
                                             {"name": "memory", "nominalQuota": "18Gi"}], None, ["more than"]),
    ("a cohort without a borrowing limit may lend anything", [{"name": "cpu", "nominalQuota": 1},
                                                              {"name": "memory", "nominalQuota": "18Gi"}], "pool", []),
]


@pytest.mark.parametrize("resources,cohort,expected", [f[1:] for f in FITS], ids=[f[0] for f in FITS])
def test_a_job_larger_than_its_queue_can_ever_give_is_named(crd_dir, tmp_path, resources, cohort, expected):
    queues = _queues(tmp_path, resources, cohort)
    _, problems = validate_obj(tmp_path, C, crd_dir, queues)
    assert len(problems) == len(expected), "\n".join(map(str, problems))
    for problem, words in zip(problems, expected):
        assert problem.is_error and problem.field == f"metadata.labels.{QUEUE_LABEL}" and words in problem.message, \
            str(problem)
        assert "Kueue" in problem.message and problem.fix


def test_a_pod_set_larger_than_any_one_flavor_is_named(crd_dir, tmp_path):
    path = tmp_path / "q.yaml"
    flavors = [{"name": f"f{i}", "resources": [{"name": "cpu", "nominalQuota": 6}, {"name": "memory",
                                                                                  "nominalQuota": "64Gi"}]}
               for i in range(2)]
    path.write_text(yaml.safe_dump_all([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "cq"},
         "spec": {"resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": flavors}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "team-a"},
         "spec": {"clusterQueue": "cq"}}]))
    [problem] = validate_obj(tmp_path, C, crd_dir, path)[1]
    assert "pod set cpu requests 8 cpu (2 x 4), more than any one flavor" in problem.message, str(problem)


def test_an_unknown_local_queue_is_a_note(crd_dir, tmp_path):
    queues = _queues(tmp_path, [{"name": "cpu", "nominalQuota": 9}, {"name": "memory", "nominalQuota": "18Gi"}])
    [note] = validate_obj(tmp_path, patched(C, {"metadata.labels": {QUEUE_LABEL: "team-b"}}), crd_dir, queues)[1]
    assert not note.is_error and "LocalQueue 'team-b'" in note.message


@pytest.mark.parametrize("job_ns,queue_ns,found", [
    (None, None, True), (None, "ml", True), ("ml", None, True),  # either applied with kubectl -n
    ("ml", "ml", True), ("ml", "other", False)])
def test_a_local_queue_is_found_in_the_job_s_namespace(crd_dir, tmp_path, job_ns, queue_ns, found):
    """The LocalQueue named by the label, in the job's namespace; an object without one is applied with -n."""
    queues = _queues(tmp_path, [{"name": "cpu", "nominalQuota": 1}, {"name": "memory", "nominalQuota": "18Gi"}])
    if queue_ns:
        docs = list(yaml.safe_load_all(queues.read_text()))
        docs[1]["metadata"]["namespace"] = queue_ns
        queues.write_text(yaml.safe_dump_all(docs))
    job = patched(C, {"metadata.namespace": job_ns} if job_ns else {})
    [problem] = validate_obj(tmp_path, job, crd_dir, queues)[1]
    assert ("more than ClusterQueue cq" in problem.message) == found, str(problem)
    assert ("does not hold" in problem.message) == (not found), str(problem)


def test_the_chart_with_kueue_values_passes_and_fits_the_example_queues(crd_dir, tmp_path):
    """examples/kueue/queues.yaml fits the chart's values.yaml and values-gpu.yaml, queued with kueue values."""
    values = tmp_path / "my-values.yaml"
    values.write_text(CHOSEN.read_text() + "\nkueue: {queueName: team-a, priorityClass: high}\n")
    assert validate_paths([values], crd_dir, kueue_queues=QUEUES) == []
    gpu = tmp_path / "gpu-values.yaml"
    gpu.write_text((CHART / "values-gpu.yaml").read_text() + "\n" + CHOSEN.read_text()
                   + "\nkueue: {queueName: team-a}\n")
    assert validate_paths([gpu], crd_dir, kueue_queues=QUEUES) == []
    queues = load_queues(QUEUES)
    assert queues.local_queues == {("default", "team-a"): "training"}
    [cluster] = [o for o in render_chart(CHART, [CHOSEN], {"kueue.queueName": "team-a"}) if o["kind"] == "RayCluster"]
    assert {s.name: s.count for s in pod_sets(Doc("chart", cluster))} == {"head": 1, "worker": 2}


# Malformed queues files: one problem naming the file (and the field), never a traceback.
BAD_QUEUES = [
    ("not yaml", b"\xff\xfe\x00kind: [", ""),
    ("a list", b"- 1\n- 2\n", "is list, not a Kubernetes object"),
    ("no cluster queue", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "holds no ClusterQueue"),
    ("a string document", b"hello\n", "not a Kubernetes object"),
    ("spec a list", b"apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {name: cq}\nspec: []\n",
     "ClusterQueue/cq: spec"),
    ("no name", b"apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {}\nspec: {}\n",
     "metadata.name"),
    ("resourceGroups a map", b"apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {name: cq}\n"
     b"spec: {resourceGroups: {a: 1}}\n", "spec.resourceGroups"),
    ("flavors missing", b"apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {name: cq}\n"
     b"spec: {resourceGroups: [{coveredResources: [cpu]}]}\n", "spec.resourceGroups[0].flavors"),
    ("resource without a name", b"apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {name: cq}\n"
     b"spec: {resourceGroups: [{flavors: [{name: f, resources: [{nominalQuota: 1}]}]}]}\n",
     "resources[0].name"),
    ("quota not a quantity", b"apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {name: cq}\n"
     b"spec: {resourceGroups: [{flavors: [{name: f, resources: [{name: cpu, nominalQuota: lots}]}]}]}\n",
     "nominalQuota"),
    ("quota a bool", b"apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {name: cq}\n"
     b"spec: {resourceGroups: [{flavors: [{name: f, resources: [{name: cpu, nominalQuota: 1, borrowingLimit: true}]}]}]}\n",
     "borrowingLimit"),
    ("local queue without a target", b"apiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata: {name: a}\n"
     b"spec: {clusterQueue: 3}\n", "spec.clusterQueue"),
]


@pytest.mark.parametrize("data,words", [b[1:] for b in BAD_QUEUES], ids=[b[0] for b in BAD_QUEUES])
def test_a_malformed_queues_file_is_one_clear_problem(crd_dir, tmp_path, data, words):
    bad = tmp_path / "queues.yaml"
    bad.write_bytes(data)
    with pytest.raises(QueuesFileError):
        load_queues(bad)
    [problem] = validate_obj(tmp_path, C, crd_dir, bad)[1]
    assert problem.is_error and problem.file == str(bad) and words in str(problem) and problem.fix, str(problem)


def test_cli_takes_the_queues_file(raytrain, crd_dir, tmp_path):
    path = tmp_path / "rc.yaml"
    path.write_text(yaml.safe_dump(C))
    small = _queues(tmp_path, [{"name": "cpu", "nominalQuota": 2}, {"name": "memory", "nominalQuota": "18Gi"}])
    result = raytrain("validate", "--crds", str(crd_dir), "--kueue-queues", str(small), str(path))
    assert result.returncode == 1 and "can ever give it" in result.stderr and "Traceback" not in result.stderr
    missing = raytrain("validate", "--crds", str(crd_dir), "--kueue-queues", str(tmp_path / "none.yaml"), str(path))
    assert missing.returncode == 1 and "none.yaml" in missing.stderr and "Traceback" not in missing.stderr


def _mutations(node, rng):
    """Every value of the parsed example swapped, one at a time, for a value of another type."""
    odd = [None, 7, -1, "x", "", [], {}, [1], {"a": 1}, True, 1.5]
    if isinstance(node, dict):
        for key in list(node):
            for value in rng.sample(odd, 3):
                yield {**node, key: value}
            for child in _mutations(node[key], rng):
                yield {**node, key: child}
    elif isinstance(node, list):
        for i in range(len(node)):
            for child in _mutations(node[i], rng):
                yield node[:i] + [child] + node[i + 1:]


def test_fuzzed_queues_files_load_or_say_why(tmp_path):
    """Wrong types anywhere in the example, and its bytes cut or flipped: a queues file or a QueuesFileError."""
    import random

    rng = random.Random(27)
    docs = list(yaml.safe_load_all(QUEUES.read_text()))
    path = tmp_path / "q.yaml"
    cases = 0
    for i, doc in enumerate(docs):
        for mutated in _mutations(doc, rng):
            path.write_text(yaml.safe_dump_all(docs[:i] + [mutated] + docs[i + 1:]))
            try:
                load_queues(path)
            except QueuesFileError as exc:
                assert str(exc).startswith(str(path)) and "Traceback" not in str(exc)
            cases += 1
    raw = QUEUES.read_bytes()
    for _ in range(200):
        data = bytearray(raw[: rng.randrange(len(raw))])
        for _ in range(rng.randrange(4)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            load_queues(path)
        except QueuesFileError:
            pass
        cases += 1
    assert cases > 300


def test_the_standalone_rayjob_queued_as_the_readme_says_passes_and_fits(crd_dir, tmp_path):
    """manifests/rayjob-standalone.yaml with the queue label and suspend: true (docs/guides/shared-clusters.md)."""
    docs = list(yaml.safe_load_all((REPO / "manifests" / "rayjob-standalone.yaml").read_text()))
    for doc in docs:
        if doc["kind"] == "RayJob":
            doc["metadata"]["labels"][QUEUE_LABEL] = "team-a"
            doc["spec"]["suspend"] = True
    path = tmp_path / "standalone.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    problems = validate_paths([path], crd_dir, kueue_queues=QUEUES)
    assert [p for p in problems if p.is_error or "kueue" in str(p).lower()] == [], "\n".join(map(str, problems))
    [job] = [Doc("f", d) for d in docs if d["kind"] == "RayJob"]
    assert [s.name for s in pod_sets(job)] == ["head", "worker", "submitter"]


def test_the_example_queues_match_kueue_s_crd_schemas():
    """examples/kueue/queues.yaml against the v1beta2 openAPIV3Schema of Kueue's CRDs (main ff69552e, copied into
    data/ without descriptions; the API server's CEL rules are not evaluated), the way crds.py checks KubeRay's."""
    import json

    import jsonschema

    from raytrain.validator.crds import _to_jsonschema

    schemas = json.loads((Path(__file__).parent / "data" / "kueue-v1beta2-schemas.json").read_text())["schemas"]
    docs = [d for d in yaml.safe_load_all(QUEUES.read_text()) if d]
    assert sorted({d["kind"] for d in docs}) == ["ClusterQueue", "LocalQueue", "ResourceFlavor",
                                                  "WorkloadPriorityClass"]
    for doc in docs:
        assert doc["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        schema = copy.deepcopy(schemas[doc["kind"]])
        schema["properties"]["metadata"] = {"type": "object"}
        schema["properties"].pop("status", None)
        errors = [e.message for e in jsonschema.Draft7Validator(_to_jsonschema(schema)).iter_errors(doc)]
        assert errors == [], (doc["kind"], errors)
    # and a broken one is caught: the schema is really applied
    bad = copy.deepcopy(next(d for d in docs if d["kind"] == "ClusterQueue"))
    bad["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = [1]
    bad["spec"]["cohrt"] = "x"
    schema = copy.deepcopy(schemas["ClusterQueue"])
    schema["properties"]["metadata"] = {"type": "object"}
    assert len(list(jsonschema.Draft7Validator(_to_jsonschema(schema)).iter_errors(bad))) == 2


def test_gcs_fault_tolerance_counts_the_redis_cleanup_on_the_head():
    """common.go BuildPodSets, lines 93-97: the head's Ray container at least 200m/256Mi with GCS fault tolerance."""
    small = patched(C, {"spec.headGroupSpec.template.spec.containers[0].resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "100m"}}})
    assert pod_sets(Doc("f", small))[0].requests == {"cpu": 0.1}
    ft = patched(small, {"metadata.annotations": {"ray.io/ft-enabled": "True"}})
    assert pod_sets(Doc("f", ft))[0].requests == {"cpu": 0.2, "memory": 256 * 2**20}
    options = patched(small, {"spec.gcsFaultToleranceOptions": {"redisAddress": "redis:6379"}})
    assert pod_sets(Doc("f", options))[0].requests == {"cpu": 0.2, "memory": 256 * 2**20}


@pytest.mark.parametrize("extra", ["batchScheduler: {name: volcano, queue: training, priorityClassName: high}",
                                   "batchScheduler: {name: yunikorn, queue: root.training}"])
def test_the_chart_with_batch_scheduler_values_passes(crd_dir, tmp_path, extra):
    values = tmp_path / "my-values.yaml"
    values.write_text(CHOSEN.read_text() + "\n" + extra + "\n")
    assert validate_paths([values], crd_dir) == []


def test_init_containers_count_as_kubernetes_pod_requests_sum_them():
    """resourcehelpers.PodRequests (workload.go totalRequestsFromPodSets): max(containers + sidecars, the largest
    plain init container plus the sidecars before it)."""
    from raytrain.validator.kueue import pod_requests

    def c(cpu, **extra):
        return {"name": "c", "resources": {"requests": {"cpu": cpu}}, **extra}

    assert pod_requests({"containers": [c("1"), c("1")], "initContainers": [c("3")]}, "f") == {"cpu": 3.0}
    assert pod_requests({"containers": [c("1")], "initContainers": [c("500m")]}, "f") == {"cpu": 1.0}
    sidecar = c("1", restartPolicy="Always")
    assert pod_requests({"containers": [c("1")], "initContainers": [sidecar, c("2")]}, "f") == {"cpu": 3.0}
    assert pod_requests({"containers": [c("2")], "initContainers": [c("2"), sidecar]}, "f") == {"cpu": 3.0}
