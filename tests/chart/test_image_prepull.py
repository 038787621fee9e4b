"""The chart's opt-in image prepull (templates/image-prepull.yaml): one DaemonSet per Ray group that pulls the group's
image onto every node its pods may land on and keeps it in use, rendered and linted with real Helm and validated
against the Kubernetes schemas (kubernetes-validate, through `raytrain validate`)."""

from pathlib import Path

import helm_python as helm
import pytest
import yaml

from raytrain.validator.render import ChartError, lint_chart, load_values, render_chart
from raytrain.validator.validate import validate_paths

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "raytrain-cluster"
CHOSEN = REPO / "tests" / "support" / "chosen-values.yaml"  # the image and storage the installer chooses
GPU = CHART / "values-gpu.yaml"
VALUES_FILES = sorted(p.name for p in CHART.glob("values*.yaml"))

ON = {"imagePrepull": {"enabled": True}}
GPU_NODES = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
HIGHMEM = {"replicas": 1, "minReplicas": 0, "maxReplicas": 2, "resources": {"cpu": 8, "memory": "64Gi"}}
NODE_AFFINITY = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["r6i.2xlarge"]}]}]}}
# A Ray-pod spread rule: about other pods, so it stays off the DaemonSet (whose pods it would keep off Ray's nodes).
POD_ANTI_AFFINITY = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
    "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"ray.io/group": "highmem"}}}}]}


def render(files=(), values=None):
    return render_chart(CHART, [CHOSEN, *files], values)


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def daemonsets(objects) -> dict:
    return {d["metadata"]["name"]: d for d in by_kind(objects, "DaemonSet")}


def ray_pods(objects) -> dict:
    """groupName (head: "head") -> the Ray pod template KubeRay creates that group's pods from."""
    [cluster] = by_kind(objects, "RayCluster")
    spec = cluster["spec"]
    return {"head": spec["headGroupSpec"]["template"],
            **{g["groupName"]: g["template"] for g in spec["workerGroupSpecs"]}}


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_off_by_default_no_daemonset(values_name):
    files = [CHART / values_name] if values_name != "values.yaml" else []
    assert by_kind(render(files), "DaemonSet") == []


# (values files, values, the DaemonSets' groups, the GPU ones)
PREPULLED = [
    ([], ON, ["worker"], []),
    ([GPU], {**ON, "gpuWorker": {"nodeSelector": GPU_NODES}}, ["worker", "gpu"], ["gpu"]),
    ([GPU], {"imagePrepull": {"enabled": True, "skipGroups": ["worker"]}, "gpuWorker": {"nodeSelector": GPU_NODES}},
     ["gpu"], ["gpu"]),
    ([GPU], {**ON, "worker": {"enabled": False}, "gpuWorker": {"affinity": {"nodeAffinity": NODE_AFFINITY}}},
     ["gpu"], ["gpu"]),
    ([], {"imagePrepull": {"enabled": True, "head": True}, "head": {"nodeSelector": {"pool": "ray-head"}}},
     ["head", "worker"], []),
    ([], {**ON, "additionalWorkerGroups": {"highmem": {**HIGHMEM, "nodeSelector": {"pool": "highmem"},
                                                       "affinity": {"nodeAffinity": NODE_AFFINITY,
                                                                    "podAntiAffinity": POD_ANTI_AFFINITY}},
                                           "off": {**HIGHMEM, "disabled": True}}}, ["worker", "highmem"], []),
    # A worker group may be named "head" (without Kueue): it is prepulled as any other, the head only on request.
    ([], {**ON, "additionalWorkerGroups": {"head": HIGHMEM}}, ["worker", "head"], []),
    ([], {**ON, "image": {"tag": "0.1.0-ray2.60.0-rc1", "gpuTagSuffix": "-cuda", "pullPolicy": "Always",
                          "pullSecrets": ["regcred", "mirror"]},
          "additionalWorkerGroups": {"a100": {**HIGHMEM, "gpus": 2, "nodeSelector": {"gpu": "a100"},
                                              "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}},
     ["worker", "a100"], ["a100"]),
]


@pytest.mark.parametrize("files, values, prepulled, gpu", PREPULLED,
                         ids=["default", "gpu", "skip-worker", "gpu-node-affinity", "head", "additional", "group-named-head",
                              "image"])
def test_on_one_daemonset_per_group_with_the_ray_pods_image_and_placement(files, values, prepulled, gpu):
    objects = render(files, values)
    found = daemonsets(objects)
    assert sorted(found) == sorted(f"raytrain-prepull-{g}" for g in prepulled)
    pods = ray_pods(objects)
    for group in prepulled:
        ds = found[f"raytrain-prepull-{group}"]
        pod, ray = ds["spec"]["template"]["spec"], pods[group]["spec"]
        [holder], ray_container = pod["containers"], ray["containers"][0]
        # Byte for byte the reference the group's Ray pods pull, with their pull policy and pull Secrets.
        assert holder["image"] == ray_container["image"] and holder["imagePullPolicy"] == ray_container["imagePullPolicy"]
        assert holder["image"].endswith(values.get("image", {}).get("gpuTagSuffix", "-gpu")) is (group in gpu)
        assert pod.get("imagePullSecrets") == ray.get("imagePullSecrets")
        # Where the group may land: its nodeSelector, tolerations and node affinity, never its pod (anti-)affinity.
        assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", **(ray.get("nodeSelector") or {})}
        assert pod.get("tolerations") == ray.get("tolerations")
        node_affinity = (ray.get("affinity") or {}).get("nodeAffinity")
        assert pod.get("affinity") == ({"nodeAffinity": node_affinity} if node_affinity else None)
        if group == "gpu":
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        if group == "highmem":
            assert "podAntiAffinity" in ray["affinity"] and "podAntiAffinity" not in pod["affinity"]


def test_the_holder_is_tiny_unprivileged_and_keeps_the_image_in_use():
    values = {"imagePrepull": {"enabled": True, "priorityClassName": "prepull-low"}, "gpuWorker": {"nodeSelector": GPU_NODES}}
    for name, ds in daemonsets(render([GPU], values)).items():
        pod = ds["spec"]["template"]["spec"]
        [holder] = pod["containers"]
        assert holder["command"] == ["sleep", "infinity"], name  # a running container: image GC leaves the image alone
        assert holder["resources"] == {"requests": {"cpu": "10m", "memory": "16Mi"},
                                       "limits": {"cpu": "10m", "memory": "16Mi"}}, name  # no nvidia.com/gpu
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert holder["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                             "readOnlyRootFilesystem": True}
        assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
        assert holder["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}], name  # no GPU, even by runtime
        # A new tag pulled on every node at once, the old holder kept until the new one runs.
        assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                                "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": 0}}
        assert pod["priorityClassName"] == "prepull-low"
        assert "ports" not in holder and "volumes" not in pod
    # Under the Ray pods' ServiceAccount when the chart names one: registry credentials attached to it apply.
    [ds] = daemonsets(render((), {**ON, "serviceAccount": {"create": True}})).values()
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "raytrain-ray"
    # A group's own OS label wins over the default.
    [ds] = daemonsets(render((), {**ON, "worker": {"nodeSelector": {"kubernetes.io/os": "other"}}})).values()
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "other"}
    [ds] = daemonsets(render((), {"imagePrepull": {"enabled": True, "resources": {"cpu": "50m", "memory": "32Mi"}}})).values()
    resources = ds["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "50m", "memory": "32Mi"}
    assert "priorityClassName" not in ds["spec"]["template"]["spec"]


def selects(match_labels: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in match_labels.items())


def test_nothing_that_selects_ray_pods_selects_the_holders_and_kueue_does_not_queue_them():
    values = {"imagePrepull": {"enabled": True, "head": True}, "kueue": {"queueName": "team-a"},
              "metrics": {"podMonitor": {"enabled": True}}, "gpuWorker": {"nodeSelector": GPU_NODES}}
    objects = render([GPU], values)
    found = daemonsets(objects)
    assert len(found) == 3
    selectors = [o["spec"]["podSelector"]["matchLabels"] for o in by_kind(objects, "NetworkPolicy")]
    selectors += [o["spec"]["selector"]["matchLabels"] for o in by_kind(objects, "PodDisruptionBudget")]
    selectors += [o["spec"]["selector"]["matchLabels"] for o in by_kind(objects, "PodMonitor")]
    assert len(selectors) == 3
    ray_labels = [p["metadata"]["labels"] for p in ray_pods(objects).values()]
    for name, ds in found.items():
        labels = ds["spec"]["template"]["metadata"]["labels"]
        # KubeRay's operator owns pods by ray.io/* labels; Kueue queues by kueue.x-k8s.io/queue-name.
        assert not [k for k in {**labels, **ds["metadata"]["labels"]} if k.startswith(("ray.io/", "kueue.x-k8s.io/"))], name
        assert not [s for s in selectors if selects(s, labels)], name
        own = ds["spec"]["selector"]["matchLabels"]
        assert selects(own, labels) and not [r for r in ray_labels if selects(own, r)], name
        assert [n for n, other in found.items() if selects(other["spec"]["selector"]["matchLabels"], labels)] == [name]
        assert labels["app.kubernetes.io/instance"] == "raytrain" and labels["app.kubernetes.io/part-of"] == "raytrain"
        assert labels["app.kubernetes.io/component"] == "image-prepull"


def test_rendered_daemonsets_validate_against_the_kubernetes_schema(crd_dir, tmp_path):
    values = {"imagePrepull": {"enabled": True, "head": True, "priorityClassName": "prepull-low"},
              "image": {"pullSecrets": ["regcred"]}, "gpuWorker": {"affinity": {"nodeAffinity": NODE_AFFINITY}},
              "additionalWorkerGroups": {"highmem": {**HIGHMEM, "affinity": {"nodeAffinity": NODE_AFFINITY,
                                                                             "podAntiAffinity": POD_ANTI_AFFINITY}}}}
    objects = render([GPU], values)
    assert len(by_kind(objects, "DaemonSet")) == 4
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(objects))
    assert validate_paths([rendered], crd_dir) == []
    # kubernetes-validate's strict schema refuses what the API server would: a field it does not know, here.
    broken = [o for o in objects if o["kind"] == "DaemonSet"][0]
    broken["spec"]["template"]["spec"]["containers"][0]["sleepForever"] = True
    rendered.write_text(yaml.safe_dump(broken))
    assert [p.severity for p in validate_paths([rendered], crd_dir)] == ["error"]


def test_strict_lint_is_clean_with_prepull(tmp_path):
    values = tmp_path / "prepull.yaml"
    values.write_text(yaml.safe_dump({"imagePrepull": {"enabled": True, "head": True},
                                      "gpuWorker": {"nodeSelector": GPU_NODES}}))
    assert lint_chart(CHART, [CHOSEN, GPU, values], strict=True) == []


BAD_VALUES = [
    # (values files, values, what the message must say) -- values.schema.json
    ([], {"imagePrepull": {"enabled": True, "resources": {"cpu": "lots", "memory": "16Mi"}}}, "/imagePrepull/resources/cpu"),
    ([], {"imagePrepull": {"resources": {"nvidia.com/gpu": 1}}}, "/imagePrepull/resources"),  # a holder never takes a GPU
    ([], {"imagePrepull": {"priorityClassName": "Low_Priority"}}, "/imagePrepull/priorityClassName"),
    ([], {"imagePrepull": {"skipGroups": ["worker", "worker"]}}, "/imagePrepull/skipGroups"),
    ([], {"imagePrepull": {"command": ["true"]}}, "additional properties 'command' not allowed"),
    # validateValues
    ([], {"imagePrepull": {"enabled": True, "skipGroups": ["gpu"]}},
     'imagePrepull.skipGroups names "gpu", which is no enabled worker group (enabled: worker)'),
    ([], {"imagePrepull": {"enabled": True, "skipGroups": ["worker"]}},
     "imagePrepull.enabled is true but imagePrepull.skipGroups skips every enabled worker group"),
    ([], {"imagePrepull": {"enabled": True, "head": True}, "additionalWorkerGroups": {"head": HIGHMEM}},
     "imagePrepull.head and additionalWorkerGroups.head would both be prepulled by a DaemonSet named raytrain-prepull-head"),
    ([], {**ON, "image": {"pullPolicy": "Never"}}, "imagePrepull.enabled with image.pullPolicy=Never"),
    ([GPU], ON, "imagePrepull: gpuWorker has no nodeSelector or required node affinity"),
    ([], {**ON, "additionalWorkerGroups": {"a100": {**HIGHMEM, "gpus": 1}}},
     "--set imagePrepull.skipGroups={a100}"),
]


@pytest.mark.parametrize("files, values, expected", BAD_VALUES, ids=[e for _, _, e in BAD_VALUES])
def test_bad_values_fail_with_a_clear_message(files, values, expected):
    with pytest.raises(ChartError) as caught:
        render(files, values)
    assert expected in str(caught.value)


def test_the_refusals_name_the_fix_and_the_fix_renders():
    with pytest.raises(ChartError) as caught:
        render([GPU], ON)
    text = str(caught.value)
    assert "set gpuWorker.nodeSelector" in text and "nvidia.com/gpu.present" in text and "skipGroups={gpu}" in text
    assert daemonsets(render([GPU], {"imagePrepull": {"enabled": True, "skipGroups": ["gpu"]}})).keys() == \
        {"raytrain-prepull-worker"}
    # Off, the settings beside `enabled` are kept and refuse nothing: switching it off is one --set.
    assert by_kind(render([GPU], {"imagePrepull": {"enabled": False, "skipGroups": ["nothing"], "head": True}}),
                   "DaemonSet") == []


def test_no_image_repository_refuses_as_without_prepull():
    with pytest.raises(ChartError) as caught:
        render_chart(CHART, (), {**ON, "sharedStorage": {"storageClass": "efs-sc"}})
    assert "image.repository is empty" in str(caught.value)


def notes(values) -> str:
    """NOTES.txt as `helm install` prints it (render_chart leaves it out: it is no Kubernetes object)."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values=load_values((CHOSEN,), values), name="raytrain", namespace="default",
                                is_install=True)
    [text] = [text for name, text in rendered.items() if name.endswith("NOTES.txt")]
    return text


def test_notes_say_how_to_wait_for_the_images():
    assert "prepull" not in notes({})
    text = notes({"imagePrepull": {"enabled": True, "head": True}})
    assert "kubectl -n default rollout status daemonset/raytrain-prepull-head" in text
    assert "kubectl -n default rollout status daemonset/raytrain-prepull-worker" in text
