"""A kustomization directory (`kubectl apply -k`) read by `raytrain validate` and `raytrain emulate`: rendered by the
real kubectl, the project's ConfigMap checked without the project's code (its components give a note, not an
error), and its files becoming the RayJob's working_dir."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from raytrain.cluster.rayjobfile import RayJobError, load_rayjob, local_runtime_env, materialise_configmaps
from raytrain.validator.kustomize import KustomizeError, is_kustomization, kustomize_build
from raytrain.validator.validate import validate_paths

REPO = Path(__file__).resolve().parents[2]
OWN_CODE = REPO / "examples" / "own-code"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize built in) is not installed")
# The installer's choices the chart leaves open (a pushed image, a storage source): the default cluster shape.
CHOSEN = REPO / "tests" / "support" / "chosen-values.yaml"
LOCAL_IMAGE_NOTE = "the local build's name that no registry publishes"


def job_yaml_notes(found):
    """The notes about the project's run config (the other note says the image is still the local build's)."""
    assert [p.field for p in found if LOCAL_IMAGE_NOTE in p.message] == ["spec.submitterPodTemplate.spec.containers[0].image"]
    return [p for p in found if LOCAL_IMAGE_NOTE not in p.message]


@pytest.fixture
def own_code(tmp_path) -> Path:
    dest = tmp_path / "own-code"
    shutil.copytree(OWN_CODE, dest)
    return dest


def test_only_a_directory_with_a_kustomization_is_one(tmp_path):
    assert is_kustomization(OWN_CODE)
    assert not is_kustomization(OWN_CODE / "kustomization.yaml")
    assert not is_kustomization(REPO / "manifests")
    (tmp_path / "Kustomization").write_text("resources: []\n")
    assert is_kustomization(tmp_path)


@needs_kubectl
def test_the_example_renders_to_its_rayjob_and_a_configmap_of_its_files():
    docs = list(yaml.safe_load_all(kustomize_build(OWN_CODE)))
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    [job] = [d for d in docs if d["kind"] == "RayJob"]
    assert sorted(cm["data"]) == ["job.yaml", "my_data.py", "my_models.py"]
    assert cm["data"]["my_models.py"] == (OWN_CODE / "my_models.py").read_text()
    # The name the RayJob mounts is the generated one (no hash suffix: kustomize would not rewrite it in a RayJob).
    volume_names = [v["configMap"]["name"] for v in job["spec"]["submitterPodTemplate"]["spec"]["volumes"]]
    assert cm["metadata"]["name"] in volume_names


def test_without_kubectl_the_error_says_how_to_go_on(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(KustomizeError, match=r"needs kubectl .* Fix: install kubectl, or pass the rendered manifests"):
        kustomize_build(OWN_CODE)


@needs_kubectl
def test_a_broken_kustomization_names_the_directory_and_kustomize_s_reason(own_code):
    (own_code / "my_data.py").unlink()
    with pytest.raises(KustomizeError, match=rf"{own_code}: `kubectl kustomize` failed: .*my_data.py"):
        kustomize_build(own_code)


# ---------------------------------------------------------------------------------------------- validate


@needs_kubectl
def test_validate_checks_the_project_without_its_code_and_says_so(crd_dir):
    found = validate_paths([OWN_CODE], crd_dir, values=CHOSEN)
    assert [p for p in found if p.is_error] == []
    [note] = job_yaml_notes(found)
    assert note.severity == "note" and note.field == "data.job.yaml"
    assert "my_models.TinyConvNet" in note.message and "my_data.make_datasets" in note.message
    assert "(kubectl kustomize)" in note.file


@needs_kubectl
def test_validate_of_the_rendered_output_is_the_same(crd_dir, tmp_path):
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(kustomize_build(OWN_CODE))
    found = validate_paths([rendered], crd_dir, values=CHOSEN)
    assert [p.severity for p in job_yaml_notes(found)] == ["note"]


@needs_kubectl
def test_a_folder_holding_a_kustomization_renders_it_instead_of_reading_its_files(crd_dir, tmp_path):
    shutil.copytree(OWN_CODE, tmp_path / "projects" / "own-code")
    found = validate_paths([tmp_path / "projects"], crd_dir, values=CHOSEN)
    assert [p.severity for p in job_yaml_notes(found)] == ["note"]  # job.yaml and kustomization.yaml are no objects of their own


@needs_kubectl
def test_a_loss_of_the_project_s_own_is_in_the_note_too(crd_dir, own_code):
    job = own_code / "job.yaml"
    job.write_text(job.read_text().replace("loss: cross_entropy", "loss: {_component_: my_losses.focal, gamma: 2}"))
    [note] = job_yaml_notes(validate_paths([own_code], crd_dir, values=CHOSEN))
    assert note.severity == "note" and "train.loss: my_losses.focal" in note.message


BROKEN = [  # (what, edit of job.yaml, the field blamed, text in the message)
    ("a wrong type in raytrain's own section", ("epochs: 6", "epochs: many"), "data.job.yaml", "train.epochs"),
    ("an unknown section", ("scaling:", "scalling:"), "data.job.yaml", "scalling"),
    ("GPU workers on the CPU-only cluster", ("num_workers: 2", "num_workers: 2\n  use_gpu: true"), "data.job.yaml",
     "never be scheduled"),
    ("fewer samples per batch than workers", ("num_workers: 2", "num_workers: 40"), "data.job.yaml",
     "global batch size 32 is smaller than scaling.num_workers 40"),
]


@needs_kubectl
@pytest.mark.parametrize("what, edit, field, text", BROKEN, ids=[b[0] for b in BROKEN])
def test_validate_finds_what_is_wrong_in_the_shipped_run_config(crd_dir, own_code, what, edit, field, text):
    job = own_code / "job.yaml"
    assert edit[0] in job.read_text()
    job.write_text(job.read_text().replace(edit[0], edit[1], 1))
    errors = [p for p in validate_paths([own_code], crd_dir, values=CHOSEN) if p.is_error]
    assert len(errors) == 1, f"{what}: {errors}"
    assert errors[0].field == field and text in errors[0].message, f"{what}: {errors[0]}"


@needs_kubectl
def test_the_kustomization_s_images_entry_is_the_one_place_the_image_is_named(crd_dir, own_code):
    """kustomize's images: renames every container image under `containers` in any object, the RayJob's submitter
    included: the project names the image it pushed once, in kustomization.yaml."""
    text = (own_code / "kustomization.yaml").read_text()
    (own_code / "kustomization.yaml").write_text(text.replace("    newName: ghcr.io/raytrain/raytrain",
                                                              "    newName: registry.example.com/team/raytrain"))
    [job] = [d for d in yaml.safe_load_all(kustomize_build(own_code)) if d["kind"] == "RayJob"]
    [container] = job["spec"]["submitterPodTemplate"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/team/raytrain:0.1.0-ray2.60.0"
    found = validate_paths([own_code], crd_dir, values=CHOSEN)
    assert [p for p in found if LOCAL_IMAGE_NOTE in p.message or p.is_error] == []


# ---------------------------------------------------------------------------------------------- emulate


@needs_kubectl
def test_emulate_ships_the_project_files_as_the_working_dir(tmp_path):
    job = load_rayjob(OWN_CODE)
    mounts = materialise_configmaps(job, tmp_path / "submitter")
    env = local_runtime_env(job, mounts)
    shipped = Path(env["working_dir"])
    assert sorted(p.name for p in shipped.iterdir()) == ["job.yaml", "my_data.py", "my_models.py"]
    assert (shipped / "my_data.py").read_text() == (OWN_CODE / "my_data.py").read_text()


def test_emulate_of_an_unrenderable_kustomization_is_a_rayjob_error(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(RayJobError, match="needs kubectl"):
        load_rayjob(OWN_CODE)


RAY_TRAIN_SCRIPT = REPO / "examples" / "ray-train-script"


@needs_kubectl
def test_a_rayjob_running_a_ray_train_function_is_checked_as_far_as_it_can_be_without_its_code(crd_dir, tmp_path):
    found = validate_paths([RAY_TRAIN_SCRIPT], crd_dir, values=CHOSEN)
    assert not [p for p in found if p.is_error], [p.message for p in found]
    [note] = [p for p in found if "a Ray Train function whose train_loop_config is its own" in p.message]
    assert "raytrain local" not in note.message
    broken = tmp_path / "ray-train-script"
    shutil.copytree(RAY_TRAIN_SCRIPT, broken)
    job = yaml.safe_load((broken / "job.yaml").read_text())
    job["loop"]["train_loop_config"] = [1, 2]
    (broken / "job.yaml").write_text(yaml.safe_dump(job))
    errors = [p.message for p in validate_paths([broken], crd_dir, values=CHOSEN) if p.is_error]
    assert len(errors) == 1 and "loop.train_loop_config: must be a mapping" in errors[0], errors
