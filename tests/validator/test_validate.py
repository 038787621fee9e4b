"""`raytrain validate`: what ships passes, other people's valid RayJobs pass, each kind of mistake is caught with a
message naming the file, the object, the field and the fix."""

import copy
from pathlib import Path

import pytest
import yaml

from raytrain.spec.config import load_config
from raytrain.validator.render import render_chart
from raytrain.validator.validate import validate_paths

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "raytrain-cluster"
MANIFESTS = REPO / "manifests"
DATA = Path(__file__).parent / "data"
DELETE = object()
# The installer's choices the chart leaves open (a pushed image, a storage source): the default cluster shape.
CHOSEN = REPO / "tests" / "support" / "chosen-values.yaml"


def notes_about(problems, words):
    return [p for p in problems if p.severity == "note" and words in p.message]


LOCAL_IMAGE_NOTE = "the local build's name that no registry publishes"
TO_CHOOSE_NOTE = "renders once the installer has chosen"


def test_what_ships_validates(crd_dir):
    """No error; notes for what only the installer can choose: the chart's defaults and GPU overlay leave the image
    and the storage open, and the RayJobs name the local build's image until kustomize renames it."""
    problems = validate_paths([CHART, MANIFESTS], crd_dir, values=CHOSEN)
    assert errors(problems) == []
    assert sorted(p.file.rsplit("(values: ", 1)[-1] for p in notes_about(problems, TO_CHOOSE_NOTE)) == \
        ["values-gpu.yaml)", "values.yaml)"]
    assert sorted(p.obj for p in notes_about(problems, LOCAL_IMAGE_NOTE)) == ["RayJob/raytrain-linear",
                                                                             "RayJob/raytrain-linear-s3",
                                                                             "RayJob/raytrain-linear-standalone"]
    assert len(problems) == 5


@pytest.mark.parametrize("values_name", ["values.yaml", "values-gpu.yaml", "values-kind.yaml"])
def test_each_values_file_and_its_rendered_yaml_validate(crd_dir, tmp_path, values_name):
    problems = validate_paths([CHART / values_name], crd_dir)
    assert problems == [] if values_name == "values-kind.yaml" else [p.severity for p in problems] == ["note"]
    files = [CHOSEN] + ([CHART / values_name] if values_name != "values.yaml" else [])
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(render_chart(CHART, files)))
    assert validate_paths([rendered], crd_dir) == []


@pytest.mark.parametrize("manifest", ["rayjob.yaml", "rayjob-standalone.yaml", "rayjob-s3.yaml"])
def test_the_rayjobs_fit_the_kind_cluster(crd_dir, manifest):
    problems = validate_paths([MANIFESTS / manifest], crd_dir, values=CHART / "values-kind.yaml")
    assert errors(problems) == [] and problems == notes_about(problems, LOCAL_IMAGE_NOTE)


def errors(problems):
    return [p for p in problems if p.is_error]


@pytest.mark.parametrize("sample", sorted(p.name for p in DATA.glob("kuberay-*.yaml")))
def test_valid_manifests_written_by_other_people_pass(crd_dir, sample):
    """Ours in KubeRay's style, and a few of KubeRay v1.7.0's own samples (all 65 of its RayCluster and RayJob
    samples pass; these are the ones that once failed, and small representative ones)."""
    assert errors(validate_paths([DATA / sample], crd_dir)) == []


def test_generate_name_is_valid_with_a_note(crd_dir):
    [note] = validate_paths([DATA / "kuberay-v1.7.0-ray-job.kueue-toy-sample.yaml"], crd_dir)
    assert not note.is_error and note.field == "metadata.generateName" and note.obj == "RayJob/rayjob-sample-*"
    assert "`kubectl apply -f` refuses" in note.message and "kubectl create" in note.fix


def test_a_worker_group_without_min_and_max_replicas_is_valid(crd_dir, tmp_path):
    """The CRD defaults them (0 and 2^31-1); the API server applies defaults before it checks what is required."""
    path = _write_broken(tmp_path, SA, [("RayJob", WORKER0 + ["minReplicas"], DELETE),
                                        ("RayJob", WORKER0 + ["maxReplicas"], DELETE)])
    assert errors(validate_paths([path], crd_dir)) == []


def test_a_folder_holding_a_chart_renders_it(crd_dir):
    """`raytrain validate helm manifests`: helm/raytrain-cluster is rendered with each values file, not parsed."""
    problems = validate_paths([REPO / "helm", MANIFESTS], crd_dir, values=CHOSEN)
    assert errors(problems) == [] and len(notes_about(problems, TO_CHOOSE_NOTE)) == 2


def test_a_values_file_outside_the_chart(crd_dir, tmp_path):
    mine = tmp_path / "elsewhere" / "my-values.yaml"
    mine.parent.mkdir()
    mine.write_text((CHART / "values-kind.yaml").read_text())
    assert errors(validate_paths([MANIFESTS / "rayjob.yaml"], crd_dir, values=mine)) == []  # --values /elsewhere/...
    assert validate_paths([mine], crd_dir) == []  # rendered with the default chart
    assert validate_paths([mine], crd_dir, chart=CHART) == []
    mine.write_text("worker:\n  replicas: 9\n")
    [problem] = validate_paths([mine], crd_dir)
    assert str(mine) in problem.file and "minReplicas <= replicas <= maxReplicas" in problem.message


@pytest.mark.parametrize("manifest", ["rayjob.yaml", "rayjob-standalone.yaml", "rayjob-s3.yaml"])
def test_the_job_configmap_is_the_linear_preset(tmp_path, manifest):
    docs = list(yaml.safe_load_all((MANIFESTS / manifest).read_text()))
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    job = tmp_path / "job.yaml"
    job.write_text(cm["data"]["job.yaml"])
    from_manifest = load_config(str(job)).to_dict()
    preset = load_config("linear").to_dict()
    from_manifest["run"]["name"] = preset["run"]["name"]
    assert from_manifest == preset


# ----------------------------------------------------------------------------------------------------------
# a table of broken manifests: (case, manifest, edits, expected field, expected words)


def _set(docs, kind, path, value):
    [doc] = [d for d in docs if d["kind"] == kind]
    node = doc
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


def _replace_in_job_config(docs, old, new):
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    assert old in cm["data"]["job.yaml"]
    cm["data"]["job.yaml"] = cm["data"]["job.yaml"].replace(old, new)


RJ, SA = "rayjob.yaml", "rayjob-standalone.yaml"
ENTRY = "raytrain run job.yaml --name linear --storage /mnt/shared/runs --address auto"
HEAD = ["spec", "rayClusterSpec", "headGroupSpec"]
WORKER0 = ["spec", "rayClusterSpec", "workerGroupSpecs", 0]

BROKEN = [
    # KubeRay admission rules that the CRD schema does not express
    ("clusterSelector with backoffLimit", RJ, [("RayJob", ["spec", "backoffLimit"], 2)],
     "spec.backoffLimit", "clusterSelector"),
    ("clusterSelector with suspend", RJ, [("RayJob", ["spec", "suspend"], True)],
     "spec.suspend", "clusterSelector mode does not support suspend"),
    ("clusterSelector in SidecarMode", RJ, [("RayJob", ["spec", "submissionMode"], "SidecarMode")],
     "spec.submissionMode", "SidecarMode does not support clusterSelector"),
    ("clusterSelector without the cluster name", RJ, [("RayJob", ["spec", "clusterSelector"], {"app": "x"})],
     "spec.clusterSelector", "no 'ray.io/cluster' key"),
    ("suspend without shutdownAfterJobFinishes", SA, [("RayJob", ["spec", "suspend"], True),
                                                      ("RayJob", ["spec", "shutdownAfterJobFinishes"], False),
                                                      ("RayJob", ["spec", "ttlSecondsAfterFinished"], DELETE)],
     "spec.suspend", "shutdownAfterJobFinishes false cannot be suspended"),
    ("deletionRules with shutdownAfterJobFinishes", SA, [("RayJob", ["spec", "deletionStrategy"], {"deletionRules": [
        {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED"}}]})],
     "spec.deletionStrategy.deletionRules", "cannot be combined with shutdownAfterJobFinishes"),
    ("deletion rule with two conditions (CEL rule)", RJ, [("RayJob", ["spec", "deletionStrategy"], {"deletionRules": [
        {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed"}}]})],
     "spec.deletionStrategy.deletionRules[0].condition", "exactly one of jobStatus and jobDeploymentStatus"),
    ("DeleteCluster with clusterSelector", RJ, [("RayJob", ["spec", "deletionStrategy"], {"deletionRules": [
        {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED"}}]})],
     "spec.deletionStrategy.deletionRules[0].policy", "not allowed with clusterSelector"),
    ("TTL without shutdown", RJ, [("RayJob", ["spec", "ttlSecondsAfterFinished"], 60)],
     "spec.ttlSecondsAfterFinished", "without shutdownAfterJobFinishes"),
    ("RayJob name over 47 characters", RJ, [("RayJob", ["metadata", "name"], "r" * 48)],
     "metadata.name", "at most 47"),
    ("RayJob name not DNS-1035", RJ, [("RayJob", ["metadata", "name"], "1-linear")],
     "metadata.name", "DNS-1035"),
    ("neither cluster spec nor selector", RJ, [("RayJob", ["spec", "clusterSelector"], DELETE)],
     "spec", "neither rayClusterSpec nor clusterSelector"),
    ("non-positive deadline", RJ, [("RayJob", ["spec", "activeDeadlineSeconds"], 0)],
     "spec.activeDeadlineSeconds", "positive"),
    ("submitter restartPolicy Always", RJ, [("RayJob", ["spec", "submitterPodTemplate", "spec", "restartPolicy"],
                                             "Always")],
     "spec.submitterPodTemplate.spec.restartPolicy", "Kubernetes Job"),
    ("runtimeEnvYAML not a mapping", RJ, [("RayJob", ["spec", "runtimeEnvYAML"], "- working_dir")],
     "spec.runtimeEnvYAML", "not a YAML mapping"),
    ("token auth with an old rayVersion", SA, [("RayJob", ["spec", "rayClusterSpec", "rayVersion"], "2.50.0")],
     "spec.rayClusterSpec.rayVersion", "needs Ray 2.52.0"),
    ("resources in rayStartParams and the group", SA, [("RayJob", WORKER0 + ["resources"], {"CPU": "1"})],
     "spec.rayClusterSpec.workerGroupSpecs[0].resources", "both here and in rayStartParams"),
    # the CRD schemas (KubeRay v1.7.0)
    ("unknown field", SA, [("RayJob", WORKER0 + ["replica"], 3)],
     "spec.rayClusterSpec.workerGroupSpecs[0].replica", "did you mean 'replicas'"),
    ("wrong type", SA, [("RayJob", WORKER0 + ["replicas"], "three")],
     "spec.rayClusterSpec.workerGroupSpecs[0].replicas", "must be integer"),
    ("enum", RJ, [("RayJob", ["spec", "submissionMode"], "ShellMode")],
     "spec.submissionMode", "not one of"),
    ("int-or-string port must not be a list", SA, [("RayJob", HEAD + ["template", "spec", "containers", 0, "ports", 0,
                                                                       "containerPort"], [6379])],
     "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].ports[0].containerPort", "must be integer"),
    ("old apiVersion", RJ, [("RayJob", ["apiVersion"], "ray.io/v1alpha1")], "apiVersion", "use apiVersion: ray.io/v1"),
    # core objects (kubernetes-validate)
    ("ConfigMap data not a string", RJ, [("ConfigMap", ["data", "extra"], 5)], "data.extra", "must be"),
    ("ConfigMap unknown field", RJ, [("ConfigMap", ["date"], {})], "date", "unknown field 'date'"),
    # raytrain cross-checks
    ("job cannot fit the cluster", RJ, [("job.yaml", "cpus_per_worker: auto", "cpus_per_worker: 4")],
     "data.job.yaml", "this job can never be scheduled"),
    ("elastic run that never reaches its max", SA, [("job.yaml", "num_workers: 3", "num_workers: [2, 4]")],
     "data.job.yaml", "the elastic run grows to at most 3 of its 4 workers"),
    ("elastic run whose min never fits", SA, [("job.yaml", "num_workers: 3", "num_workers: [4, 6]"),
                                              ("job.yaml", "batch_size: 24", "batch_size: 60"),
                                              ("job.yaml", "cpus_per_worker: auto", "cpus_per_worker: 1")],
     "data.job.yaml", "needs at least 4 workers"),
    ("storage off the shared mount", RJ, [("RayJob", ["spec", "entrypoint"], ENTRY.replace("/mnt/shared/runs", "/tmp/runs"))],
     "spec.entrypoint", "not on the shared mount"),
    ("storage left at the config default", RJ, [("RayJob", ["spec", "entrypoint"],
                                                 ENTRY.replace(" --storage /mnt/shared/runs", ""))],
     "spec.entrypoint", "./runs is not on the shared mount"),
    ("image Ray differs from rayVersion", SA, [("RayJob", ["spec", "rayClusterSpec", "rayVersion"], "2.54.0")],
     "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].image", "runs Ray 2.60.0 but rayVersion is 2.54.0"),
    ("submitter image Ray differs from the cluster", RJ, [("RayJob", ["spec", "submitterPodTemplate", "spec",
                                                                      "containers", 0, "image"], "rayproject/ray:2.53.0")],
     "spec.submitterPodTemplate.spec.containers[0].image", "runs Ray 2.53.0 but rayVersion is 2.60.0"),
    ("run config invalid", RJ, [("job.yaml", "optimizer: adam", "optimizer: adamax")],
     "data.job.yaml", "optimizer"),
    ("run config unknown key", RJ, [("job.yaml", "lr: 0.01", "learning_rate: 0.01")],
     "data.job.yaml", "learning_rate"),
    ("bad --set override", RJ, [("RayJob", ["spec", "entrypoint"], ENTRY + " --set train.epochs=many")],
     "spec.entrypoint", "--set train.epochs=many` would be refused: train.epochs: 'many' is not allowed"),
    ("run name that `raytrain run` refuses", RJ, [("RayJob", ["spec", "entrypoint"],
                                                    ENTRY.replace("--name linear", "--name a/b"))],
     "spec.entrypoint", "--name a/b` would be refused: run.name: 'a/b' cannot name a run directory"),
    ("empty --storage", RJ, [("RayJob", ["spec", "entrypoint"],
                              ENTRY.replace("--storage /mnt/shared/runs", "--storage ''"))],
     "spec.entrypoint", "`raytrain run` would be refused: --storage '': is empty"),
    ("bad model parameter in the ConfigMap", RJ, [("job.yaml", "hidden: 32", "hidden: many")],
     "data.job.yaml", "model.hidden: 'many' is not allowed"),
    ("unknown preset", RJ, [("RayJob", ["spec", "entrypoint"], ENTRY.replace("job.yaml", "linaer"))],
     "spec.entrypoint", "neither a YAML file nor a preset"),
    ("no --address auto", RJ, [("RayJob", ["spec", "entrypoint"], ENTRY.replace(" --address auto", ""))],
     "spec.entrypoint", "add --address auto"),
    ("no --name", RJ, [("RayJob", ["spec", "entrypoint"], ENTRY.replace(" --name linear", ""))],
     "spec.entrypoint", "without --name"),
    ("unknown raytrain option", RJ, [("RayJob", ["spec", "entrypoint"], ENTRY + " --workers 3")],
     "spec.entrypoint", "unrecognized arguments: --workers 3"),
    ("no working_dir for a relative config", RJ, [("RayJob", ["spec", "runtimeEnvYAML"], "env_vars: {A: b}\n")],
     "spec.runtimeEnvYAML", "has no working_dir"),
    ("no worker group, and the head holds no worker", SA,
     [("RayJob", ["spec", "rayClusterSpec", "workerGroupSpecs"], DELETE)], "data.job.yaml",
     "this job can never be scheduled: it needs 3 workers"),
    ("fsdp_wrap names a class the model lacks", SA,
     [("job.yaml", "num_workers: 3", "num_workers: 3\n  strategy: fsdp\n  fsdp_wrap: [Block]")],
     "data.job.yaml", "scaling.fsdp_wrap: Block is not a module class of the model Sequential"),
    ("ConfigMap not in the manifest set", RJ, [("drop", "ConfigMap", None)],
     "spec.submitterPodTemplate.spec.volumes", "not in this manifest set"),
]


def _write_broken(tmp_path, manifest, edits):
    docs = [d for d in yaml.safe_load_all((MANIFESTS / manifest).read_text()) if d]
    docs = copy.deepcopy(docs)
    for kind, path, value in edits:
        if kind == "job.yaml":
            _replace_in_job_config(docs, path, value)
        elif kind == "drop":
            docs = [d for d in docs if d["kind"] != path]
        else:
            _set(docs, kind, path, value)
    out = tmp_path / manifest
    out.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return out


@pytest.mark.parametrize("case,manifest,edits,field,words", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_manifests_give_their_error(crd_dir, tmp_path, case, manifest, edits, field, words):
    path = _write_broken(tmp_path, manifest, edits)
    problems = validate_paths([path], crd_dir, values=CHOSEN)
    matching = [p for p in problems if p.field == field and words in str(p)]
    assert matching, f"{case}: expected {field!r} with {words!r}, got:\n" + "\n".join(map(str, problems))
    problem = matching[0]
    assert str(path) in problem.file and problem.obj and problem.fix
    assert str(problem).startswith(str(path)) and f": {field}: " in str(problem) and " Fix: " in str(problem)


def test_a_job_too_big_for_the_kind_cluster(crd_dir, tmp_path):
    path = _write_broken(tmp_path, RJ, [("job.yaml", "num_workers: 3", "num_workers: 4"),
                                        ("job.yaml", "cpus_per_worker: auto", "cpus_per_worker: 1")])
    assert errors(validate_paths([path], crd_dir, values=CHOSEN)) == []  # the default cluster (2 x 4 CPUs) holds it
    [problem] = errors(validate_paths([path], crd_dir, values=CHART / "values-kind.yaml"))
    assert "this job can never be scheduled" in problem.message and "RayCluster raytrain" in problem.message


def test_a_bad_values_file_names_itself(crd_dir, tmp_path):
    chart = tmp_path / "raytrain-cluster"
    chart.mkdir()
    for item in CHART.rglob("*"):
        target = chart / item.relative_to(CHART)
        target.mkdir(exist_ok=True) if item.is_dir() else target.write_bytes(item.read_bytes())
    bad = chart / "values-bad.yaml"
    bad.write_text("worker:\n  replicas: 9\n")
    [problem] = validate_paths([bad], crd_dir)
    assert "values-bad.yaml" in problem.file and "minReplicas <= replicas <= maxReplicas" in problem.message
    assert len(errors(validate_paths([chart], crd_dir))) == 1  # the chart dir renders with each of its values files


def test_unreadable_inputs_are_problems_not_tracebacks(crd_dir, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a\n")
    [problem] = validate_paths([broken], crd_dir)
    assert "not valid YAML at line" in problem.message
    [problem] = validate_paths([tmp_path / "missing.yaml"], crd_dir)
    assert "does not exist" in problem.message
    [problem] = validate_paths([MANIFESTS], tmp_path)
    assert "cannot read KubeRay CRD" in problem.message and "RAYTRAIN_KUBERAY_CRDS" in problem.message


# ----------------------------------------------------------------------------------------------------------
# A managed cluster (issue 28): the chart's cluster needs the installer's values; the submitter gets through the
# NetworkPolicy by the label KubeRay gives it; the image the manifests still name is said.


def test_a_rayjob_on_the_chart_s_cluster_without_the_install_values_says_to_give_them(crd_dir):
    [problem] = errors(validate_paths([MANIFESTS / "rayjob.yaml"], crd_dir))
    assert problem.field == "spec.clusterSelector" and "values to choose" in problem.message
    assert "--values my-values.yaml" in problem.fix


def test_a_submitter_without_labels_of_its_own_is_admitted_by_kuberay_s_label(crd_dir, tmp_path):
    path = _write_broken(tmp_path, RJ, [("RayJob", ["spec", "submitterPodTemplate", "metadata"],
                                         {"labels": {"team": "ml"}})])
    assert errors(validate_paths([path], crd_dir, values=CHOSEN)) == []


def test_a_submitter_the_network_policy_does_not_admit(crd_dir, tmp_path):
    """A values file that admits only a label of raytrain's own: a submitter without it would time out."""
    values = tmp_path / "my-values.yaml"
    values.write_text(CHOSEN.read_text() + 'networkPolicy:\n  submitterPodLabels: {raytrain.io/submitter: "true"}\n')
    [problem] = errors(validate_paths([MANIFESTS / "rayjob.yaml"], crd_dir, values=values))
    assert problem.field == "spec.submitterPodTemplate.metadata.labels" and "does not admit the submitter" in problem.message
    path = _write_broken(tmp_path, RJ, [("RayJob", ["spec", "submitterPodTemplate", "metadata"],
                                         {"labels": {"raytrain.io/submitter": "true"}})])
    assert errors(validate_paths([path], crd_dir, values=values)) == []


@pytest.mark.parametrize("manifest,containers", [(RJ, 1), (SA, 3), ("rayjob-s3.yaml", 3)])
def test_a_rayjob_naming_the_local_build_gets_a_note_and_one_renamed_by_kustomize_none(crd_dir, tmp_path, manifest,
                                                                                       containers):
    [note] = notes_about(validate_paths([MANIFESTS / manifest], crd_dir, values=CHOSEN), LOCAL_IMAGE_NOTE)
    assert f"({containers} container(s))" in note.message and "kustomization.yaml" in note.fix
    renamed = _write_broken(tmp_path, manifest, [])
    renamed.write_text(renamed.read_text().replace("ghcr.io/raytrain/raytrain:", "registry.example.com/team/raytrain:"))
    assert notes_about(validate_paths([renamed], crd_dir, values=CHOSEN), LOCAL_IMAGE_NOTE) == []


# ----------------------------------------------------------------------------------------------------------
# Object storage (issue 26): a RayJob's --storage is a bucket URL in the shape `raytrain run` accepts, or a path on a
# volume every pod mounts; a run in a bucket needs each pod's TMPDIR writable; on the chart's cluster, the bucket of
# objectStorage.url.

S3 = "rayjob-s3.yaml"
S3_ENTRY = "raytrain run job.yaml --name linear-s3 --storage s3://raytrain-runs/runs --address auto --wait-for-lease"
S3_HEAD_CONTAINER = HEAD + ["template", "spec", "containers", 0]

STORAGE_OF_THE_S3_JOB = [
    # (case, --storage or None to keep it, other edits, expected field, words; None: no error)
    ("s3 bucket", "s3://raytrain-runs/runs", [], None, None),
    ("gs bucket", "gs://raytrain-runs/runs", [], None, None),
    ("bucket alone, trailing slash", "s3://raytrain-runs/", [], None, None),
    ("one slash", "s3:/raytrain-runs/runs", [], "spec.entrypoint", "'s3:/' is not how a URL begins"),
    ("upper-case scheme", "S3://raytrain-runs/runs", [], "spec.entrypoint", "write s3://BUCKET/PREFIX (lower case"),
    ("bucket name", "s3://Raytrain_Runs/runs", [], "spec.entrypoint", "'Raytrain_Runs' is not a bucket name"),
    # names S3 refuses at CreateBucket (issue 40): the same rule as `raytrain run`'s (storage.bucket_problem)
    ("bucket with adjacent periods", "s3://raytrain..runs/runs", [], "spec.entrypoint", "two periods in a row"),
    ("bucket an IP address", "s3://10.1.2.3/runs", [], "spec.entrypoint", "written as an IP address"),
    ("bucket with the xn-- prefix", "s3://xn--raytrain/runs", [], "spec.entrypoint", "beginning with 'xn--'"),
    ("bucket in upper case", "s3://RaytrainRuns/runs", [], "spec.entrypoint", "is not a bucket name S3 accepts"),
    ("bucket too short", "s3://rt/runs", [], "spec.entrypoint", "3-63 characters"),
    ("bucket too long", "s3://" + "r" * 64 + "/runs", [], "spec.entrypoint", "3-63 characters"),
    ("gs bucket with an underscore", "gs://raytrain_runs/runs", [], None, None),
    ("dot-dot prefix", "s3://raytrain-runs/../runs", [], "spec.entrypoint", "its prefix has an empty, '.' or '..' part"),
    ("https URL", "https://raytrain-runs/runs", [], "spec.entrypoint", "https:// is not a storage raytrain can use"),
    ("azure URL", "az://runs/linear", [], "spec.entrypoint", "az:// is not a storage raytrain can use"),
    ("path without a mount", "/mnt/x", [], "spec.entrypoint",
     "mounts no persistent volume on every group, so checkpoints cannot be shared"),
    ("read-only root without /tmp", None,
     [("RayJob", S3_HEAD_CONTAINER + ["securityContext", "readOnlyRootFilesystem"], True),
      ("RayJob", S3_HEAD_CONTAINER + ["volumeMounts"], DELETE)],
     "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].securityContext.readOnlyRootFilesystem",
     "group Head has a read-only root filesystem and no writable volume at /tmp"),
    ("read-only root with the /tmp emptyDir", None,
     [("RayJob", S3_HEAD_CONTAINER + ["securityContext", "readOnlyRootFilesystem"], True)], None, None),
]


@pytest.mark.parametrize("case,storage,edits,field,words", STORAGE_OF_THE_S3_JOB, ids=[c[0] for c in STORAGE_OF_THE_S3_JOB])
def test_the_storage_of_an_s3_rayjob(crd_dir, tmp_path, case, storage, edits, field, words):
    entry = S3_ENTRY if storage is None else S3_ENTRY.replace("s3://raytrain-runs/runs", storage)
    path = _write_broken(tmp_path, S3, [("RayJob", ["spec", "entrypoint"], entry), *edits])
    found = errors(validate_paths([path], crd_dir))
    if field is None:
        assert found == [], "\n".join(map(str, found))
        return
    assert [(p.field, words in str(p)) for p in found] == [(field, True)], "\n".join(map(str, found))
    assert found[0].fix and str(path) in found[0].file


def test_the_s3_rayjob_mounts_no_shared_volume_and_takes_its_credentials_from_a_secret():
    docs = [d for d in yaml.safe_load_all((MANIFESTS / S3).read_text()) if d]
    [job] = [d for d in docs if d["kind"] == "RayJob"]
    cluster = job["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        [container] = pod["containers"]
        assert container["envFrom"] == [{"secretRef": {"name": "raytrain-s3"}}]
        assert not [e for e in container.get("env") or [] if e["name"].startswith("AWS_")]  # nothing inline
        assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
        assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "20Gi"}}]
    assert not [d for d in docs if d["kind"] == "Secret"]  # the Secret is created apart, never shipped


OBJECT_STORAGE_VALUES = ("image: {repository: registry.example.com/team/raytrain}\nsharedStorage: {enabled: false}\n"
                         "objectStorage: {url: 's3://team-bucket/runs', credentialsSecret: team-s3}\n")


@pytest.mark.parametrize("storage,severity,words", [
    ("s3://team-bucket/runs", None, None),
    ("s3://team-bucket/other/prefix", None, None),
    ("/mnt/shared/runs", "error", "Fix: pass --storage s3://team-bucket/runs (the bucket of the chart's objectStorage.url)"),
    ("s3://other-bucket/runs", "warning", "is in bucket s3://other-bucket, but the pods of RayCluster raytrain were set "
                                          "up for s3://team-bucket/runs"),
])
def test_a_rayjob_on_the_chart_s_bucket_cluster(crd_dir, tmp_path, storage, severity, words):
    values = tmp_path / "my-values.yaml"
    values.write_text(OBJECT_STORAGE_VALUES)
    path = _write_broken(tmp_path, RJ, [("RayJob", ["spec", "entrypoint"], ENTRY.replace("/mnt/shared/runs", storage))])
    found = [p for p in validate_paths([path], crd_dir, values=values) if p.severity != "note"]
    assert [(p.severity, words in str(p)) for p in found] == ([] if severity is None else [(severity, True)]), \
        "\n".join(map(str, found))


# Issue 40's mutated manifests that stay valid, each because the API server, KubeRay and raytrain all take it:
# (case, manifest, edits). An empty groupName: the CRD has no minLength, KubeRay v1.7.0's validation.go checks
# duplicates only, its pods are named <cluster>--worker-xxxxx (a valid name) and labelled ray.io/group: "" (a valid
# label value), and raytrain reads no group name. No worker group, where the head holds the job: Ray schedules the
# 3 workers on the head's CPUs, as `raytrain run` sizes them (sizing.py counts the head).
STILL_VALID = [
    ("empty groupName", SA, [("RayJob", WORKER0 + ["groupName"], "")]),
    ("no worker group, the head holds the job", SA,
     [("RayJob", ["spec", "rayClusterSpec", "workerGroupSpecs"], DELETE),
      ("RayJob", HEAD + ["rayStartParams", "num-cpus"], "3")]),
]


@pytest.mark.parametrize("case,manifest,edits", STILL_VALID, ids=[c[0] for c in STILL_VALID])
def test_manifests_the_cluster_takes_stay_valid(crd_dir, tmp_path, case, manifest, edits):
    path = _write_broken(tmp_path, manifest, edits)
    assert errors(validate_paths([path], crd_dir)) == []


def test_the_charts_history_server_collector_validates_where_the_operator_has_its_gate(crd_dir, tmp_path):
    """The chart's KubeRay history server collector (historyServer.enabled) against KubeRay v1.7.0's own rules: valid
    with the operator's RayClusterHistoryServer gate on; without it, refused as the operator would (no pods)."""
    from raytrain.validator.kuberay import FeatureGates

    values = tmp_path / "history.yaml"
    values.write_text(yaml.safe_dump({"historyServer": {"enabled": True, "collector": {
        "image": "quay.io/kuberay/collector:v1.7.0",
        "env": [{"name": "STORAGE_BACKEND", "value": "GCS"}, {"name": "GCS_BUCKET", "value": "ray-history"}]}}}))
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(render_chart(CHART, [CHOSEN, values])))
    assert validate_paths([rendered], crd_dir, gates=FeatureGates.parse("RayClusterHistoryServer=true")) == []
    [refused] = errors(validate_paths([rendered], crd_dir))
    assert "historyServerOptions" in refused.field and "RayClusterHistoryServer" in refused.message, refused
