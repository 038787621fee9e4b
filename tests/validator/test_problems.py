"""The message shape: file, object, field path, what is wrong, the fix."""

from raytrain.validator.problems import Doc, Problem, field_path, split_fix


def test_problem_str_names_file_object_field_and_fix():
    problem = Problem("m.yaml", "RayJob/x", "spec.backoffLimit", "is 2.", "remove it")
    assert str(problem) == "m.yaml: RayJob/x: spec.backoffLimit: is 2. Fix: remove it"


def test_field_path():
    assert field_path(["spec", "workerGroupSpecs", 0, "replicas"]) == "spec.workerGroupSpecs[0].replicas"
    assert field_path([]) == ""


def test_doc_refers_to_a_generated_name():
    assert Doc("f", {"kind": "RayJob", "metadata": {"name": "a"}}).ref == "RayJob/a"
    doc = Doc("f", {"kind": "RayJob", "metadata": {"generateName": "a-"}})
    assert (doc.name, doc.ref) == ("", "RayJob/a-*")
    note = doc.problem("metadata", "x.", "y", severity="note")
    assert not note.is_error and doc.problem("metadata", "x.", "y").is_error


def test_split_fix():
    assert split_fix("is bad. Fix: do this.") == ("is bad.", "do this")
    assert split_fix("is bad.") == ("is bad.", "correct the value named above")
