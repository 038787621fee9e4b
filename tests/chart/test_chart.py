"""The Helm chart, rendered and linted with the real Helm library (helm-python-sdk)."""

import json
import re
import subprocess
import tomllib
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from raytrain.validator.render import ChartError, lint_chart, load_values, render_chart
from raytrain.validator.shape import node_resources, shared_mounts

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "raytrain-cluster"

VALUES_FILES = sorted(p.name for p in CHART.glob("values*.yaml"))
# The image and the storage source, which the chart leaves to the installer; a shipped values file may set them too.
CHOSEN = REPO / "tests" / "support" / "chosen-values.yaml"
PUSHED = "registry.example.com/team/raytrain"


def render(values_name: str | None = None, **set_values):
    files = [CHOSEN] + ([CHART / values_name] if values_name and values_name != "values.yaml" else [])
    return render_chart(CHART, files, set_values or None)


def render_as_shipped(values_name: str | None = None, **set_values):
    """The chart with only its own values (and set_values): nothing chosen for the installer."""
    files = [CHART / values_name] if values_name and values_name != "values.yaml" else []
    return render_chart(CHART, files, set_values or None)


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def groups(cluster):
    spec = cluster["spec"]
    return [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec["workerGroupSpecs"]]


def test_values_files_are_the_three_places_it_runs():
    assert VALUES_FILES == ["values-gpu.yaml", "values-kind.yaml", "values.yaml"]


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_every_values_file_renders_a_secure_training_cluster(values_name):
    objects = render(values_name)
    [cluster] = by_kind(objects, "RayCluster")
    assert cluster["metadata"]["name"] == "raytrain"
    spec = cluster["spec"]
    assert spec["authOptions"] == {"mode": "token"}
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
    assert "worker" in [name for name, _ in groups(cluster)]
    for name, group in groups(cluster):
        pod = group["template"]["spec"]
        container = pod["containers"][0]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        resources = container["resources"]
        assert resources["requests"] == resources["limits"], name
        assert {"name": "shared", "mountPath": "/mnt/shared"} in container["volumeMounts"], name
        if name != "head":
            params = group["rayStartParams"]
            assert params["num-cpus"] == resources["limits"]["cpu"], name
            if "nvidia.com/gpu" in resources["limits"]:
                assert params["num-gpus"] == resources["limits"]["nvidia.com/gpu"]
    assert shared_mounts(spec) == ["/mnt/shared"]
    [policy] = by_kind(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"ray.io/cluster": "raytrain"}
    assert not [s for s in by_kind(objects, "Service") if s["spec"].get("type", "ClusterIP") != "ClusterIP"]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "raytrain" and labels["app.kubernetes.io/managed-by"] == "Helm"


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_strict_lint_is_clean(values_name):
    files = [CHOSEN] + ([CHART / values_name] if values_name != "values.yaml" else [])
    assert lint_chart(CHART, files, strict=True) == []


def test_image_tag_and_ray_version_follow_the_pins_in_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    [ray_pin] = [d for d in project["dependencies"] if re.match(r"ray\[", d)]
    ray_version = ray_pin.split("==")[1]
    [cluster] = by_kind(render(), "RayCluster")
    assert cluster["spec"]["rayVersion"] == ray_version
    tag = f"{project['version']}-ray{ray_version}"
    for _, group in groups(cluster):
        assert group["template"]["spec"]["containers"][0]["image"] == f"{PUSHED}:{tag}"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == project["version"] and chart["version"] == project["version"]
    # The manifests name the local build (kustomize's images: renames it), as values-kind.yaml does.
    for manifest in (REPO / "manifests").glob("rayjob*.yaml"):
        assert f"image: ghcr.io/raytrain/raytrain:{tag}" in manifest.read_text(), manifest
    [kind] = by_kind(render_as_shipped("values-kind.yaml"), "RayCluster")
    assert kind["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == f"ghcr.io/raytrain/raytrain:{tag}"


def test_kind_values_hold_a_three_worker_job_on_one_node():
    objects = render("values-kind.yaml")
    [cluster] = by_kind(objects, "RayCluster")
    nodes = node_resources(cluster["spec"])
    assert nodes == [{"CPU": 1.0, "GPU": 0.0}] * 3  # head + 2 workers, 1 CPU each
    [volume] = [v for v in cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"] if v["name"] == "shared"]
    assert volume["hostPath"]["path"] == "/mnt/raytrain-shared"
    assert not by_kind(objects, "PersistentVolumeClaim")  # hostPath: nothing to claim
    kind_config = yaml.safe_load((REPO / "manifests" / "kind-config.yaml").read_text())
    assert kind_config["nodes"][0]["extraMounts"][0]["containerPath"] == "/mnt/raytrain-shared"


def test_gpu_values_add_a_gpu_group_with_the_gpu_image():
    [cluster] = by_kind(render("values-gpu.yaml"), "RayCluster")
    [gpu] = [g for name, g in groups(cluster) if name == "gpu"]
    container = gpu["template"]["spec"]["containers"][0]
    assert container["image"].endswith("-ray2.60.0-gpu")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    # No GPU Feature Discovery label assumed: the GPU limit places the pods (managed clusters lack the label).
    assert "nodeSelector" not in gpu["template"]["spec"]


def test_nfs_storage_creates_a_bound_pv_and_claim():
    objects = render(**{"sharedStorage.nfs.server": "10.0.0.2", "sharedStorage.nfs.path": "/exports/raytrain"})
    [pv] = by_kind(objects, "PersistentVolume")
    [pvc] = by_kind(objects, "PersistentVolumeClaim")
    assert pv["spec"]["nfs"] == {"server": "10.0.0.2", "path": "/exports/raytrain"}
    assert pv["spec"]["accessModes"] == pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["claimRef"] == {"namespace": "default", "name": pvc["metadata"]["name"]}
    [cluster] = by_kind(objects, "RayCluster")
    for _, group in groups(cluster):
        claims = [v["persistentVolumeClaim"]["claimName"] for v in group["template"]["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == [pvc["metadata"]["name"]]


def test_existing_claim_is_mounted_and_nothing_is_created():
    objects = render(**{"sharedStorage.existingClaim": "team-rwx"})
    assert not by_kind(objects, "PersistentVolumeClaim") and not by_kind(objects, "PersistentVolume")
    [cluster] = by_kind(objects, "RayCluster")
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "team-rwx"}} in \
        cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]


def test_autoscaling_additional_groups_and_podmonitor():
    objects = render(**{
        "autoscaling.enabled": True,
        "additionalWorkerGroups": {"highmem": {"replicas": 1, "minReplicas": 0, "maxReplicas": 3,
                                               "resources": {"cpu": 8, "memory": "64Gi"}}},
        "metrics.podMonitor.enabled": True,
        "networkPolicy.allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}],
    })
    [cluster] = by_kind(objects, "RayCluster")
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["autoscalerOptions"]["resources"]["requests"] == spec["autoscalerOptions"]["resources"]["limits"]
    [highmem] = [g for name, g in groups(cluster) if name == "highmem"]
    assert highmem["rayStartParams"]["num-cpus"] == "8" and highmem["maxReplicas"] == 3
    [monitor] = by_kind(objects, "PodMonitor")
    # KubeRay v1.7.0 config/prometheus/podMonitor.yaml: the cluster's name as ray_io_cluster (Ray's dashboards select
    # by it), the nodes' metrics port and the head's autoscaler and dashboard metrics.
    relabel = [{"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_label_ray_io_cluster"],
                "targetLabel": "ray_io_cluster"}]
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": port, "interval": "30s", "relabelings": relabel}
                                                      for port in ("metrics", "as-metrics", "dash-metrics")]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # kube-prometheus-stack's selector
    head_ports = {p["name"]: p["containerPort"] for p in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    assert (head_ports["as-metrics"], head_ports["dash-metrics"], head_ports["metrics"]) == (44217, 44227, 8080)
    [policy] = by_kind(objects, "NetworkPolicy")
    assert {"from": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}],
            "ports": [{"protocol": "TCP", "port": 8265}, {"protocol": "TCP", "port": 10001}]} in policy["spec"]["ingress"]


def pod_specs(objects):
    [cluster] = by_kind(objects, "RayCluster")
    return {name: group["template"]["spec"] for name, group in groups(cluster)}


def mounts(pod):
    return {m["mountPath"]: m["name"] for m in pod["containers"][0].get("volumeMounts", [])}


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_dev_shm_is_left_to_kuberay_which_sizes_it_to_the_memory_limit(values_name):
    """KubeRay v1.7.0 (common/pod.go, addEmptyDir) mounts a memory-backed /dev/shm sized to the container's memory
    limit only where none is mounted: the chart mounts none, so Ray's object store (30% of memory) fits."""
    for name, pod in pod_specs(render(values_name)).items():
        assert "/dev/shm" not in mounts(pod), name
        assert not [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"], name


def test_a_shm_size_of_our_own_is_mounted_on_every_pod_when_it_holds_the_object_store():
    # Largest object store: 30% of the worker's 16Gi = 4916Mi.
    for name, pod in pod_specs(render(shmSize="5Gi")).items():
        assert mounts(pod)["/dev/shm"] == "dshm", name
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "5Gi"}} in pod["volumes"], name


def test_fs_group_is_applied_only_on_root_mismatch():
    for name, pod in pod_specs(render()).items():
        assert pod["securityContext"]["fsGroup"] == 100, name
        assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch", name


def test_every_ray_pod_gives_the_graceful_stop_its_time():
    """SIGTERM makes a run checkpoint at its next step and end within 20 s; Kubernetes' default 30 s is too close."""
    for name, pod in pod_specs(render()).items():
        assert pod["terminationGracePeriodSeconds"] == 60, name
    assert {p["terminationGracePeriodSeconds"] for p in pod_specs(render(terminationGracePeriodSeconds=120)).values()} == {120}
    docs = yaml.safe_load_all((REPO / "manifests" / "rayjob-standalone.yaml").read_text())
    [job] = [d for d in docs if d and d["kind"] == "RayJob"]
    cluster = job["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert group["template"]["spec"]["terminationGracePeriodSeconds"] == 60


def prestop_commands(objects):
    return {name: pod["containers"][0].get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
            for name, pod in pod_specs(objects).items()}


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_every_ray_container_drains_before_kubelets_sigterm(values_name):
    """kubelet runs the preStop hook, then SIGTERMs `ray start --block`: the hook is where the run checkpoints."""
    commands = prestop_commands(render(values_name))
    assert len(commands) >= 2 and "head" in commands
    assert set(map(tuple, commands.values())) == {("raytrain", "drain", "--wait", "50")}, commands


def test_prestop_drain_follows_the_grace_period_and_can_be_turned_off():
    assert {tuple(c) for c in prestop_commands(render(terminationGracePeriodSeconds=120)).values()} == \
        {("raytrain", "drain", "--wait", "110")}
    margin = {"terminationGracePeriodSeconds": 30, "preStopDrain": {"marginSeconds": 5}}
    assert {tuple(c) for c in prestop_commands(render(**margin)).values()} == \
        {("raytrain", "drain", "--wait", "25")}
    assert set(prestop_commands(render(preStopDrain={"enabled": False})).values()) == {None}
    docs = yaml.safe_load_all((REPO / "manifests" / "rayjob-standalone.yaml").read_text())
    [job] = [d for d in docs if d and d["kind"] == "RayJob"]
    cluster = job["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert group["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == \
            ["raytrain", "drain", "--wait", "50"]


def test_volume_permissions_is_opt_in_and_prepares_the_shared_volume_once_with_least_privilege():
    nfs = {"sharedStorage.nfs.server": "10.0.0.2", "sharedStorage.nfs.path": "/exports/raytrain"}
    assert not any(pod.get("initContainers") for pod in pod_specs(render(**nfs)).values())
    pods = pod_specs(render(**nfs, **{"sharedStorage.volumePermissions.enabled": True}))
    assert not any(pod.get("initContainers") for name, pod in pods.items() if name != "head")  # once: the head
    [init] = pods["head"]["initContainers"]
    assert init["name"] == "volume-permissions" and init["image"] == pods["head"]["containers"][0]["image"]
    assert init["securityContext"] == {
        "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER", "DAC_OVERRIDE"]}}
    assert init["resources"]["requests"] == init["resources"]["limits"] == {"cpu": "100m", "memory": "64Mi"}
    assert init["volumeMounts"] == [{"name": "shared", "mountPath": "/mnt/shared"}]
    script = init["args"][0]
    assert "chown 1000:100 /mnt/shared" in script and "all_squash,anonuid=1000,anongid=100" in script
    assert "-R" not in script  # the root only: never a walk over every checkpoint


def test_volume_permissions_script_chowns_once_and_explains_a_root_squashing_export(tmp_path):
    """The init container's script, run here as it runs in the pod, with `chown`/`stat` stand-ins for the two
    outcomes an export gives root (allowed: no_root_squash; refused: root_squash)."""
    pods = pod_specs(render(**{"sharedStorage.volumePermissions.enabled": True, "sharedStorage.mountPath": str(tmp_path / "shared")}))
    script = pods["head"]["initContainers"][0]["args"][0]
    (tmp_path / "shared").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def run(owner: str, chown_ok: bool):
        (bin_dir / "stat").write_text(f"#!/bin/sh\necho {owner}\n")
        (bin_dir / "chown").write_text("#!/bin/sh\n" + ("exit 0" if chown_ok else "echo 'Operation not permitted' >&2; exit 1") + "\n")
        for tool in ("stat", "chown"):
            (bin_dir / tool).chmod(0o755)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
        return subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)

    done = run("1000:100", chown_ok=False)
    assert done.returncode == 0 and "nothing to do" in done.stdout
    chowned = run("0:0", chown_ok=True)
    assert chowned.returncode == 0 and "owner 0:0 -> 1000:100" in chowned.stdout
    squashed = run("0:0", chown_ok=False)
    assert squashed.returncode == 1 and "all_squash,anonuid=1000,anongid=100" in squashed.stderr


def ingress_8080(policy):
    """The peers admitted to Ray's metrics ports, which always go together (8080; the head's 44217 and 44227)."""
    metrics = [{"protocol": "TCP", "port": port} for port in (8080, 44217, 44227)]
    rules = [rule for rule in policy["spec"]["ingress"] if {"protocol": "TCP", "port": 8080} in rule.get("ports", [])]
    assert all(rule["ports"] == metrics for rule in rules)
    return [rule["from"] for rule in rules]


def test_enabling_the_podmonitor_admits_its_prometheus_to_the_metrics_port_only():
    [policy] = by_kind(render(), "NetworkPolicy")
    assert ingress_8080(policy) == []  # no scraping, no metrics peers
    objects = render(**{"metrics.podMonitor.enabled": True, "metrics.podMonitor.labels": {"release": "kps"},
                        "metrics.prometheus.namespace": "observability"})
    [policy] = by_kind(objects, "NetworkPolicy")
    assert ingress_8080(policy) == [[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
                                      "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]]
    [monitor] = by_kind(objects, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    # Other scrapers only through metrics.allowFrom; no namespace: allowFrom alone.
    peers = [{"ipBlock": {"cidr": "10.1.0.0/16"}}]
    [policy] = by_kind(render(**{"metrics.podMonitor.enabled": True, "metrics.prometheus.namespace": "",
                                 "metrics.allowFrom": peers}), "NetworkPolicy")
    assert ingress_8080(policy) == [peers]


def notes(**set_values) -> str:
    """NOTES.txt as `helm install` prints it (render_chart leaves it out: it is no Kubernetes object)."""
    values = load_values((CHOSEN,), set_values)
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values=values, name="raytrain", namespace="default", is_install=True)
    [text] = [text for name, text in rendered.items() if name.endswith("NOTES.txt")]
    return text


def test_notes_say_how_to_make_an_nfs_export_writable_and_who_scrapes_metrics():
    nfs = {"sharedStorage.nfs.server": "10.0.0.2", "sharedStorage.nfs.path": "/exports/raytrain"}
    text = notes(**nfs)
    assert "all_squash,anonuid=1000,anongid=100" in text and "chown 1000:100" in text
    assert "sharedStorage.volumePermissions.enabled=true" in text
    prepared = notes(**nfs, **{"sharedStorage.volumePermissions.enabled": True})
    assert "all_squash" not in prepared and "-c volume-permissions" in prepared
    assert "all_squash" not in notes() and "Metrics" not in notes()
    scraped = notes(**{"metrics.podMonitor.enabled": True})
    assert 'pods {"app.kubernetes.io/name":"prometheus"} in namespace monitoring' in scraped


BAD_VALUES = [
    # (values, what the message must say) -- values.schema.json
    ({"worker": {"replica": 3}}, "additional properties 'replica' not allowed"),
    ({"head": {"replicas": 3}}, "additional properties 'replicas' not allowed"),
    ({"additionalWorkerGroups": {"highmem": {"replicas": 1, "minReplicas": 0, "maxReplicas": 1, "cpus": 2,
                                             "resources": {"cpu": 1, "memory": "1Gi"}}}}, "additional properties 'cpus' not allowed"),
    ({"additionalWorkerGroups": {"highmem": {"replicas": 1}}}, "/additionalWorkerGroups/highmem"),
    ({"head": {"resources": {"cpu": "2 cores", "memory": "8Gi"}}}, "/head/resources/cpu"),
    ({"sharedStorage": {"volumePermissions": {"resources": {"cpu": "lots", "memory": "64Mi"}}}},
     "/sharedStorage/volumePermissions/resources/cpu"),
    ({"metrics": {"prometheus": {"podLabels": {"app": 1}}}}, "/metrics/prometheus/podLabels/app"),
    ({"rayVersion": "2.55"}, "/rayVersion"),
    ({"worker": {"resources": {"cpu": "500m"}}}, "/worker/resources/cpu"),
    ({"service": {"type": "ExternalName"}}, "/service/type"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"sharedStorage": {"mountPath": "mnt/shared"}}, "/sharedStorage/mountPath"),
    ({"gpuWorker": {"enabled": True, "gpus": 0}}, "/gpuWorker/gpus"),
    ({"additionalWorkerGroups": {"worker": {"replicas": 1, "minReplicas": 0, "maxReplicas": 1,
                                            "resources": {"cpu": 1, "memory": "1Gi"}}}}, "additionalWorkerGroups.worker: the name \"worker\" belongs to a built-in group"),
    ({"additionalWorkerGroups": {"Big_Group": {}}}, "/additionalWorkerGroups"),
    ({"shmSize": "lots"}, "/shmSize"),
    ({"bogus": 1}, "additional properties 'bogus' not allowed"),
    # validateValues
    ({"sharedStorage": {"nfs": {"server": "10.0.0.2"}}}, "sharedStorage.nfs.path is empty"),
    ({"sharedStorage": {"nfs": {"path": "/exports"}}}, "neither sharedStorage.nfs.server nor sharedStorage.existingClaim"),
    ({"sharedStorage": {"existingClaim": "a", "hostPath": "/data"}}, "set only one of existingClaim"),
    ({"image": {"tag": "0.1.0-ray2.54.0"}}, "carries Ray 2.54.0 but rayVersion is 2.60.0"),
    ({"rayVersion": "2.50.0", "image": {"tag": "custom"}}, "auth.enabled needs Ray >= 2.52.0"),
    ({"worker": {"replicas": 5, "maxReplicas": 4}}, "worker: need minReplicas <= replicas <= maxReplicas"),
    ({"worker": {"rayStartParams": {"num-cpus": "2"}}}, "worker.rayStartParams.num-cpus is set"),
    ({"worker": {"enabled": False}}, "no worker group is enabled"),
    ({"fullnameOverride": "1cluster"}, "is not a DNS-1035 label"),
    # 30% of the worker's 16Gi is 4916Mi: Ray would put that object store in /tmp.
    ({"shmSize": "2Gi"}, "shmSize 2Gi is below the object store Ray creates in /dev/shm on worker (4916Mi"),
    ({"shmSize": "8Gi", "head": {"resources": {"cpu": 2, "memory": "8Gi"},
                                 "rayStartParams": {"object-store-memory": "9000000000"}}}, "on head (8584Mi"),
    ({"metrics": {"podMonitor": {"enabled": True}, "prometheus": {"namespace": ""}}},
     "metrics.podMonitor.enabled with networkPolicy.enabled needs the scraper admitted to port 8080"),
    ({"terminationGracePeriodSeconds": 10}, "preStopDrain.marginSeconds (10) must be below terminationGracePeriodSeconds (10)"),
    ({"preStopDrain": {"marginSeconds": -1}}, "/preStopDrain/marginSeconds"),
    ({"preStopDrain": {"wait": 5}}, "additional properties 'wait' not allowed"),
]


@pytest.mark.parametrize("values,expected", BAD_VALUES, ids=[e for _, e in BAD_VALUES])
def test_bad_values_fail_with_a_clear_message(values, expected):
    with pytest.raises(ChartError) as caught:
        render_chart(CHART, (CHOSEN,), values)
    assert expected in str(caught.value)


def test_the_worker_group_shape_is_defined_once_in_the_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    shape = {"$ref": "#/$defs/workerGroup"}
    properties = schema["properties"]
    assert properties["worker"]["allOf"][0] == properties["gpuWorker"]["allOf"][0] == shape
    assert properties["additionalWorkerGroups"]["additionalProperties"] == shape
    # Draft-07, which Helm 3's validator reads too: it ignores whatever sits beside a $ref, so only annotations may.
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"

    def annotations_only(node: dict) -> bool:
        return set(node) <= {"description", "default", "properties"} and all(
            annotations_only(child) for child in node.get("properties", {}).values())

    def beside_refs(node):
        if isinstance(node, dict):
            if "$ref" in node and not annotations_only({k: v for k, v in node.items() if k != "$ref"}):
                yield node
            for value in node.values():
                yield from beside_refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from beside_refs(value)

    assert not list(beside_refs(schema))
    assert "worker" not in json.dumps(schema["$defs"]["workerGroup"]["properties"])


def test_a_disabled_group_is_off_whichever_switch_is_used():
    extra = {"replicas": 1, "minReplicas": 0, "maxReplicas": 1, "resources": {"cpu": 1, "memory": "1Gi"}}
    [cluster] = by_kind(render(additionalWorkerGroups={"a": {**extra, "disabled": True}, "b": {**extra, "enabled": False},
                                                       "c": {**extra, "gpus": 1}}), "RayCluster")
    names = [name for name, _ in groups(cluster)]
    assert names == ["head", "worker", "c"]
    [c] = [g for name, g in groups(cluster) if name == "c"]
    assert c["rayStartParams"]["num-gpus"] == "1" and c["template"]["spec"]["containers"][0]["image"].endswith("-gpu")


def group_env(group: dict) -> dict:
    """NAME -> value of a RayCluster group's (single) Ray container."""
    [container] = group["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def head_env(objects) -> dict:
    [cluster] = by_kind(objects, "RayCluster")
    return group_env(cluster["spec"]["headGroupSpec"])


def test_failure_detection_reaches_the_head_only_and_matches_the_bench_cluster():
    from raytrain.cluster.localcluster import FAILURE_DETECTION_ENV

    objects = render()
    env = head_env(objects)
    assert {k: env.get(k) for k in FAILURE_DETECTION_ENV} == FAILURE_DETECTION_ENV
    [cluster] = by_kind(objects, "RayCluster")
    for name, group in groups(cluster)[1:]:
        assert not any(k.startswith("RAY_health_check") for k in group_env(group)), name


def test_failure_detection_can_be_tuned_or_left_to_ray_and_keeps_user_env():
    tuned = head_env(render(**{"failureDetection.healthCheckPeriodMs": 500,
                               "head.env": [{"name": "EXTRA", "value": "1"}]}))
    assert tuned["RAY_health_check_period_ms"] == "500" and tuned["EXTRA"] == "1"
    assert not any(k.startswith("RAY_health_check") for k in head_env(render(**{"failureDetection.enabled": False})))


def test_the_standalone_rayjob_sets_the_same_failure_detection_on_its_head():
    from raytrain.cluster.localcluster import FAILURE_DETECTION_ENV

    docs = yaml.safe_load_all((REPO / "manifests" / "rayjob-standalone.yaml").read_text())
    [job] = [d for d in docs if d and d["kind"] == "RayJob"]
    env = group_env(job["spec"]["rayClusterSpec"]["headGroupSpec"])
    assert {k: env.get(k) for k in FAILURE_DETECTION_ENV} == FAILURE_DETECTION_ENV


# ----------------------------------------------------------------------------------------------------------
# A managed cluster (EKS, GKE, AKS, a shared one): what the chart cannot choose for the installer, and the operator
# wherever it was installed (issue 28).

STORAGE_MESSAGE = "sharedStorage has no source"
IMAGE_MESSAGE = "image.repository is empty"


def test_the_defaults_refuse_naming_both_choices_and_every_way_out():
    with pytest.raises(ChartError) as caught:
        render_as_shipped()
    text = str(caught.value)
    assert "values to choose" in text and "invalid values" not in text
    assert IMAGE_MESSAGE in text and "scripts/build-image --push" in text
    assert STORAGE_MESSAGE in text and "gp2/gp3" in text and "standard-rwo" in text and "managed-csi" in text
    for way in ("sharedStorage.nfs.server=", "sharedStorage.existingClaim=", "sharedStorage.storageClass="):
        assert way in text


STORAGE_CHOICES = [  # (values beside a pushed image, the claim the pods mount or None for hostPath, PVC created)
    ({"sharedStorage": {"nfs": {"server": "10.0.0.5", "path": "/exports/raytrain"}}}, "raytrain-shared", True),
    ({"sharedStorage": {"existingClaim": "team-rwx"}}, "team-rwx", False),
    ({"sharedStorage": {"storageClass": "azurefile-csi"}}, "raytrain-shared", True),
    ({"sharedStorage": {"hostPath": "/mnt/raytrain-shared"}}, None, False),
]


@pytest.mark.parametrize("values,claim,created", STORAGE_CHOICES, ids=["nfs", "existingClaim", "storageClass", "hostPath"])
def test_any_one_storage_choice_renders(values, claim, created):
    objects = render_chart(CHART, (), {"image": {"repository": PUSHED}, **values})
    volumes = {name: [v for v in pod["volumes"] if v["name"] == "shared"][0] for name, pod in pod_specs(objects).items()}
    for volume in volumes.values():
        assert (volume.get("persistentVolumeClaim") or {}).get("claimName") == claim
    assert bool(by_kind(objects, "PersistentVolumeClaim")) is created
    if "storageClass" in values["sharedStorage"]:
        [pvc] = by_kind(objects, "PersistentVolumeClaim")
        assert pvc["spec"]["storageClassName"] == "azurefile-csi" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_storage_chosen_but_no_image_still_refuses_and_so_does_storage_off_with_no_image():
    for values in ({"sharedStorage": {"storageClass": "efs-sc"}}, {"sharedStorage": {"enabled": False}}):
        with pytest.raises(ChartError) as caught:
            render_chart(CHART, (), values)
        assert IMAGE_MESSAGE in str(caught.value) and STORAGE_MESSAGE not in str(caught.value)
    render_chart(CHART, (), {"image": {"repository": PUSHED}, "sharedStorage": {"enabled": False}})  # no storage: no source needed


def test_notes_name_the_claim_the_pods_wait_on():
    text = notes(**{"sharedStorage.storageClass": "efs-sc"})
    assert "waits for the PersistentVolumeClaim raytrain-shared (StorageClass efs-sc, ReadWriteMany)" in text
    assert "describe pvc raytrain-shared" in text
    assert "PersistentVolumeClaim team-rwx (yours)" in notes(**{"sharedStorage.existingClaim": "team-rwx"})
    assert "PersistentVolumeClaim" not in notes(**{"sharedStorage.hostPath": "/mnt/x"})
    assert "newName: registry.example.com/team/raytrain" in text  # the RayJob is told the same image


def operator_rule(policy):
    [rule] = [r for r in policy["spec"]["ingress"] if any("namespaceSelector" in p and "podSelector" in p
                                                          and "kuberay" in json.dumps(p) for p in r["from"])]
    return rule


def test_the_operator_is_admitted_by_its_pod_labels_in_any_namespace():
    """The kuberay-operator chart labels its pods app.kubernetes.io/name: kuberay-operator (v1.7.0
    helm-chart/kuberay-operator/templates/deployment.yaml); production installs use a namespace of its own."""
    [policy] = by_kind(render(), "NetworkPolicy")
    rule = operator_rule(policy)
    assert rule["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}}]
    assert {p["port"] for p in rule["ports"]} == {8265, 10001}
    [policy] = by_kind(render(**{"networkPolicy.operatorNamespace": "kuberay-system"}), "NetworkPolicy")
    assert operator_rule(policy)["from"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}


def test_submitters_are_admitted_by_the_label_kuberay_gives_every_one():
    [policy] = by_kind(render(), "NetworkPolicy")
    rules = [r for r in policy["spec"]["ingress"] if r["from"] == [{"podSelector": {"matchLabels": {"ray.io/originated-from-crd": "RayJob"}}}]]
    assert [r["ports"] for r in rules] == [[{"protocol": "TCP", "port": 8265}]]


def test_the_api_server_is_admitted_for_an_operator_that_goes_through_its_proxy():
    peers = [{"ipBlock": {"cidr": "172.16.0.0/28"}}]
    [policy] = by_kind(render(**{"networkPolicy.apiServerFrom": peers}), "NetworkPolicy")
    assert {"from": peers, "ports": [{"protocol": "TCP", "port": 8265}]} in policy["spec"]["ingress"]
    [policy] = by_kind(render(), "NetworkPolicy")
    assert not [r for r in policy["spec"]["ingress"] if any("ipBlock" in p for p in r["from"])]


def test_an_operator_peer_that_would_admit_everyone_is_refused():
    with pytest.raises(ChartError, match="operatorPodLabels is empty and networkPolicy.operatorNamespace too"):
        render_chart(CHART, (CHOSEN,), {"networkPolicy": {"operatorPodLabels": None}})


def test_a_stopped_job_s_driver_gets_the_time_to_checkpoint_on_the_head_and_in_the_standalone_job():
    """Ray 2.55's job supervisor SIGKILLs a stopped job's driver RAY_JOB_STOP_WAIT_TIME_S after SIGTERM (default 3);
    raytrain's driver takes up to STOP_GRACE_S to checkpoint and end."""
    from raytrain.driver.attempt import STOP_GRACE_S

    objects = render()
    assert int(head_env(objects)["RAY_JOB_STOP_WAIT_TIME_S"]) > STOP_GRACE_S
    [cluster] = by_kind(objects, "RayCluster")
    for name, group in groups(cluster)[1:]:
        assert "RAY_JOB_STOP_WAIT_TIME_S" not in group_env(group), name
    assert head_env(render(jobStopWaitSeconds=45))["RAY_JOB_STOP_WAIT_TIME_S"] == "45"
    assert head_env(render(**{"failureDetection.enabled": False}))["RAY_JOB_STOP_WAIT_TIME_S"] == "30"
    with pytest.raises(ChartError, match=r"jobStopWaitSeconds \(3\) must be above 20"):
        render(jobStopWaitSeconds=3)
    docs = yaml.safe_load_all((REPO / "manifests" / "rayjob-standalone.yaml").read_text())
    [job] = [d for d in docs if d and d["kind"] == "RayJob"]
    assert group_env(job["spec"]["rayClusterSpec"]["headGroupSpec"])["RAY_JOB_STOP_WAIT_TIME_S"] == head_env(objects)["RAY_JOB_STOP_WAIT_TIME_S"]


def test_an_upgrade_reaches_running_pods_and_leaves_the_autoscaler_s_replicas_alone():
    """KubeRay v1.7.0 recreates pods on a spec change only with upgradeStrategy Recreate; its hash leaves out
    replicas (utils.GenerateHashWithoutReplicasAndWorkersToDelete), which the autoscaler owns when it is on."""
    [cluster] = by_kind(render(), "RayCluster")
    assert cluster["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    assert [g["replicas"] for _, g in groups(cluster)[1:]] == [2]
    [cluster] = by_kind(render(upgradeStrategy="None"), "RayCluster")
    assert cluster["spec"]["upgradeStrategy"] == {"type": "None"}
    [cluster] = by_kind(render(**{"autoscaling.enabled": True}), "RayCluster")
    [worker] = cluster["spec"]["workerGroupSpecs"]
    assert "replicas" not in worker and (worker["minReplicas"], worker["maxReplicas"]) == (0, 4)
    with pytest.raises(ChartError, match="/upgradeStrategy"):
        render(upgradeStrategy="Rolling")


def test_a_drain_evicts_one_ray_pod_at_a_time():
    [budget] = by_kind(render(), "PodDisruptionBudget")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"] == {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                              "selector": {"matchLabels": {"ray.io/cluster": "raytrain"}}}
    assert by_kind(render(**{"podDisruptionBudget.enabled": False}), "PodDisruptionBudget") == []
    with pytest.raises(ChartError, match="/podDisruptionBudget/maxUnavailable"):
        render(**{"podDisruptionBudget.maxUnavailable": 0})


SPOT_WINDOWS = [
    # (values, the group warned about and the label, or None) -- the VM's notice against the 60 s grace period
    ({"worker": {"nodeSelector": {"cloud.google.com/gke-spot": "true"}}}, ("worker", "cloud.google.com/gke-spot")),
    ({"worker": {"tolerations": [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal",
                                  "value": "spot", "effect": "NoSchedule"}]}},
     ("worker", "kubernetes.azure.com/scalesetpriority")),
    ({"head": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "cloud.google.com/gke-preemptible", "operator": "In", "values": ["true"]}]}]}}}}},
     ("head", "cloud.google.com/gke-preemptible")),
    ({"worker": {"nodeSelector": {"eks.amazonaws.com/capacityType": "SPOT"}}}, None),  # 120 s notice: 60 s fits
    ({"worker": {"nodeSelector": {"eks.amazonaws.com/capacityType": "SPOT"}}, "terminationGracePeriodSeconds": 150,
      "preStopDrain": {"marginSeconds": 10}}, ("worker", "eks.amazonaws.com/capacityType")),
    ({"worker": {"nodeSelector": {"kubernetes.azure.com/scalesetpriority": "regular"}}}, None),  # not spot
    ({"worker": {"nodeSelector": {"cloud.google.com/gke-spot": "true"}}, "terminationGracePeriodSeconds": 25,
      "preStopDrain": {"marginSeconds": 5}}, None),  # fits the 30 s notice
    ({}, None),
]


@pytest.mark.parametrize("values, warned", SPOT_WINDOWS)
def test_notes_warn_when_a_spot_nodes_notice_is_shorter_than_the_grace_period(values, warned):
    """Issue #28 item 10: where the node kind can be known from the values (the clouds' spot labels), NOTES says
    when the VM's notice cannot hold the preStop drain, and how to fit it."""
    text = notes(**values)
    warnings = [line.strip() for line in text.splitlines() if "notice before it goes" in line]
    if warned is None:
        assert warnings == [], warnings
    else:
        group, label = warned
        [line] = warnings
        assert line.startswith(f"WARNING: {group} runs on ") and f"({label})" in line
        assert "--set terminationGracePeriodSeconds=" in line and "preStopDrain.marginSeconds=5" in line



# ----------------------------------------------------------------------------------------------------------
# shared clusters: Kueue and the batch schedulers (opt-in; the defaults render as before)

GROUP = {"replicas": 1, "minReplicas": 0, "maxReplicas": 1, "resources": {"cpu": "1", "memory": "1Gi"}}
SCHEDULING_LABEL_PREFIXES = ("kueue.x-k8s.io/", "volcano.sh/", "yunikorn.apache.org/", "ray.io/")


def cluster_labels(**set_values):
    [cluster] = by_kind(render(**set_values), "RayCluster")
    return {k: v for k, v in cluster["metadata"]["labels"].items() if k.startswith(SCHEDULING_LABEL_PREFIXES)}


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_by_default_no_queue_or_scheduler_label_and_no_suspend(values_name):
    objects = render(values_name)
    [cluster] = by_kind(objects, "RayCluster")
    assert "suspend" not in cluster["spec"]
    for obj in objects:
        assert not [k for k in obj["metadata"].get("labels", {}) if k.startswith(SCHEDULING_LABEL_PREFIXES)]


@pytest.mark.parametrize("set_values,expected", [
    # kubernetes-sigs/kueue pkg/controller/constants/constants.go QueueLabel, WorkloadPriorityClassLabel
    ({"kueue.queueName": "team-a"}, {"kueue.x-k8s.io/queue-name": "team-a"}),
    ({"kueue.queueName": "team-a", "kueue.priorityClass": "high"},
     {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"}),
    # KubeRay v1.7.0 batchscheduler/volcano/volcano_scheduler.go QueueNameLabelKey, utils.RayPriorityClassName
    ({"batchScheduler.name": "volcano"}, {}),
    ({"batchScheduler.name": "volcano", "batchScheduler.queue": "training", "batchScheduler.priorityClassName": "hi"},
     {"volcano.sh/queue-name": "training", "ray.io/priority-class-name": "hi"}),
    # batchscheduler/yunikorn/yunikorn_scheduler.go RayApplicationIDLabelName, RayApplicationQueueLabelName,
    # utils.RayGangSchedulingEnabled
    ({"batchScheduler.name": "yunikorn", "batchScheduler.queue": "root.training"},
     {"yunikorn.apache.org/app-id": "default-raytrain", "yunikorn.apache.org/queue": "root.training",
      "ray.io/gang-scheduling-enabled": "true"}),
    ({"batchScheduler.name": "yunikorn", "batchScheduler.gangScheduling": False},
     {"yunikorn.apache.org/app-id": "default-raytrain"}),
])
def test_each_scheduling_value_renders_its_labels_on_the_raycluster(set_values, expected):
    assert cluster_labels(**set_values) == expected


@pytest.mark.parametrize("values,expected", [
    ({"kueue": {"queueName": "team-a"}, "batchScheduler": {"name": "volcano"}},
     "kueue.queueName and batchScheduler.name are both set"),
    ({"kueue": {"queueName": "team-a"}, "autoscaling": {"enabled": True}},
     "Kueue refuses autoscaling on a RayCluster it manages"),
    ({"kueue": {"priorityClass": "high"}}, "kueue.priorityClass is set without kueue.queueName"),
    ({"kueue": {"queueName": "team-a"}, "additionalWorkerGroups": {f"g{i}": GROUP for i in range(17)}},
     "a Kueue workload holds at most 18 pod sets"),
    ({"kueue": {"queueName": "team-a"}, "additionalWorkerGroups": {"head": GROUP}},
     "Kueue reserves the name \"head\""),
    ({"batchScheduler": {"queue": "q"}}, "batchScheduler.queue is set without batchScheduler.name"),
    ({"batchScheduler": {"name": "yunikorn", "priorityClassName": "hi"}}, "read by Volcano only"),
    ({"batchScheduler": {"name": "slurm"}}, "/batchScheduler/name': value must be one of"),
    ({"kueue": {"queueName": "Team_A"}}, "/kueue/queueName': 'Team_A' does not match"),
])
def test_contradictory_scheduling_values_are_refused_with_the_way_out(values, expected):
    with pytest.raises(ChartError) as caught:
        render_chart(CHART, (CHOSEN,), values)
    assert expected in str(caught.value)


def test_seventeen_worker_groups_fit_a_kueue_workload():
    groups17 = {f"g{i}": GROUP for i in range(15)}  # + worker and gpu
    render_chart(CHART, (CHOSEN,), {"kueue": {"queueName": "team-a"}, "gpuWorker": {"enabled": True},
                                    "additionalWorkerGroups": groups17})


def test_notes_say_how_the_cluster_is_queued_or_scheduled():
    assert "LocalQueue" not in notes() and "batch-scheduler" not in notes()
    queued = notes(**{"kueue.queueName": "team-a", "kueue.priorityClass": "high"})
    assert "queued in Kueue's LocalQueue team-a (WorkloadPriorityClass high)" in queued and "get workloads" in queued
    assert "KubeRay fails a suspended clusterSelector RayJob" in queued
    volcano = notes(**{"batchScheduler.name": "volcano"})
    assert "--batch-scheduler=volcano" in volcano and "cannot start a RayJob that uses clusterSelector" in volcano
    assert "clusterSelector" not in notes(**{"batchScheduler.name": "yunikorn"}).split("3. Launch")[0]


def test_a_batch_scheduler_gangs_every_group_at_replicas_unless_autoscaling():
    """KubeRay v1.7.0's Volcano PodGroup (utils.CalculateMinReplicas) and YuniKorn's task groups count minReplicas."""
    def bounds(**set_values):
        [cluster] = by_kind(render("values-gpu.yaml", **set_values), "RayCluster")
        return {g["groupName"]: (g.get("replicas"), g["minReplicas"]) for g in cluster["spec"]["workerGroupSpecs"]}

    assert bounds() == {"worker": (1, 0), "gpu": (2, 0)}
    for name in ("volcano", "yunikorn"):
        assert bounds(**{"batchScheduler.name": name}) == {"worker": (1, 1), "gpu": (2, 2)}
    assert bounds(**{"batchScheduler.name": "volcano", "autoscaling.enabled": True}) == {"worker": (None, 0),
                                                                                        "gpu": (None, 0)}


# ----------------------------------------------------------------------------------------------------------
# Object storage (issue 26): runs in an S3 or GCS bucket; every Ray container gets the bucket's settings as the SDKs'
# standard environment (credentials only by reference to a Secret, or the pods' identity) and an emptyDir at /tmp.

S3_VALUES = {"image": {"repository": PUSHED}, "sharedStorage": {"enabled": False},
             "objectStorage": {"url": "s3://team-bucket/runs", "endpoint": "http://minio.minio.svc:9000",
                               "region": "eu-west-1", "credentialsSecret": "team-s3"}}


def env_entries(pod: dict) -> dict:
    return {e["name"]: e for e in pod["containers"][0].get("env") or []}


def test_object_storage_reaches_every_ray_container_with_its_env_and_a_tmp_emptydir():
    objects = render_chart(CHART, (CHART / "values-gpu.yaml",), S3_VALUES)
    assert not by_kind(objects, "PersistentVolumeClaim") and not by_kind(objects, "PersistentVolume")
    pods = pod_specs(objects)
    assert sorted(pods) == ["gpu", "head", "worker"]
    for name, pod in pods.items():
        env = env_entries(pod)
        assert env["AWS_ENDPOINT_URL"] == {"name": "AWS_ENDPOINT_URL", "value": "http://minio.minio.svc:9000"}, name
        assert env["AWS_DEFAULT_REGION"]["value"] == "eu-west-1", name
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):  # by reference, never values
            assert "value" not in env[key] and env[key]["valueFrom"]["secretKeyRef"]["name"] == "team-s3", name
            assert env[key]["valueFrom"]["secretKeyRef"]["key"] == key
        assert env["AWS_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True  # only STS keys have one
        assert mounts(pod) == {"/tmp": "tmp"}, name  # and no shared volume
        assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "20Gi"}}], name
        assert pod["securityContext"]["runAsNonRoot"] is True and "serviceAccountName" not in pod
    assert env_entries(pods["head"])["RAY_JOB_STOP_WAIT_TIME_S"]["value"] == "30"  # the head's own env stays
    [cluster] = by_kind(objects, "RayCluster")
    assert cluster["metadata"]["annotations"] == {"raytrain.io/object-storage": "s3://team-bucket/runs"}
    assert shared_mounts(cluster["spec"]) == []


def test_without_object_storage_nothing_of_it_is_rendered():
    objects = render()
    [cluster] = by_kind(objects, "RayCluster")
    assert "annotations" not in cluster["metadata"] and not by_kind(objects, "ServiceAccount")
    for name, pod in pod_specs(objects).items():
        assert "/tmp" not in mounts(pod) and not [k for k in env_entries(pod) if k.startswith(("AWS_", "GOOGLE_"))]
        assert "serviceAccountName" not in pod, name


def test_object_storage_with_the_autoscaler_leaves_its_sidecar_as_kuberay_builds_it():
    """KubeRay v1.7.0 builds the autoscaler container from autoscalerOptions only (common/pod.go
    BuildAutoscalerContainer, mergeAutoscalerOverrides): none of the Ray container's env or mounts reach it, and on
    the head it adds its ray-logs emptyDir at /tmp/ray, an exact mountPath the chart's /tmp does not take
    (addEmptyDir): the runtime mounts it over /tmp."""
    [cluster] = by_kind(render_chart(CHART, (), {**S3_VALUES, "autoscaling": {"enabled": True},
                                                 "serviceAccount": {"create": True}}), "RayCluster")
    assert set(cluster["spec"]["autoscalerOptions"]) == {"upscalingMode", "idleTimeoutSeconds", "resources",
                                                         "securityContext"}
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert "/tmp/ray" not in mounts(head) and mounts(head)["/tmp"] == "tmp"
    assert head["serviceAccountName"] == "raytrain-ray"  # the autoscaler's Role is bound to it (rbac.go)


def test_gcs_credentials_are_a_key_file_mounted_read_only_for_the_ray_user():
    values = {**S3_VALUES, "objectStorage": {"url": "gs://team-bucket/runs", "credentialsSecret": "team-gcs",
                                             "tmpSizeLimit": "50Gi"}}
    for name, pod in pod_specs(render_chart(CHART, (), values)).items():
        env = env_entries(pod)
        assert env["GOOGLE_APPLICATION_CREDENTIALS"]["value"] == "/var/run/secrets/raytrain/gcs/credentials.json"
        assert not [k for k in env if k.startswith("AWS_")], name
        [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "gcs-credentials"]
        assert mount == {"name": "gcs-credentials", "mountPath": "/var/run/secrets/raytrain/gcs", "readOnly": True}
        assert {"name": "gcs-credentials", "secret": {"secretName": "team-gcs", "defaultMode": 0o440, "items": [
            {"key": "credentials.json", "path": "credentials.json"}]}} in pod["volumes"], name
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "50Gi"}} in pod["volumes"]


@pytest.mark.parametrize("service_account,expected_name", [
    ({"create": True, "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/runs"}},
     "raytrain-ray"),
    ({"create": True, "name": "trainer", "annotations": {"iam.gke.io/gcp-service-account": "t@p.iam.gserviceaccount.com"}},
     "trainer"),
    ({"name": "existing-irsa"}, None),  # the installer's own: every pod runs under it, nothing created
])
def test_every_ray_pod_runs_under_the_service_account_a_bucket_trusts(service_account, expected_name):
    objects = render_chart(CHART, (), {**S3_VALUES, "objectStorage": {"url": "s3://team-bucket/runs"},
                                       "serviceAccount": service_account})
    created = by_kind(objects, "ServiceAccount")
    pods = pod_specs(objects)
    names = {pod.get("serviceAccountName") for pod in pods.values()}
    for name, pod in pods.items():
        # identity from the account alone: no env to set, so none rendered (an `env: null` fails the CRD's schema)
        assert pod["containers"][0].get("env", []) is not None, name
        # the workers get the cloud identity, never the account's Kubernetes API token (the autoscaler's Role)
        assert pod.get("automountServiceAccountToken") is (None if name == "head" else False), name
    if expected_name is None:
        assert created == [] and names == {service_account["name"]}
        return
    [account] = created
    assert account["metadata"]["name"] == expected_name and names == {expected_name}
    assert account["metadata"]["annotations"] == service_account["annotations"]


def test_a_long_release_name_gives_a_service_account_name_kuberay_keeps():
    long_name = "r" * 53
    objects = render_chart(CHART, (), {**S3_VALUES, "fullnameOverride": long_name, "serviceAccount": {"create": True}})
    [account] = by_kind(objects, "ServiceAccount")
    assert len(account["metadata"]["name"]) <= 50 and account["metadata"]["name"].endswith("-ray")


# The shape objectStorage.url must have, held to the one storage.url_problem gives `raytrain run --storage`.
URLS = ["s3://team-bucket/runs", "gs://team-bucket", "s3://team-bucket/runs/", "s3://a.b-c/x/y", "s3:/team-bucket/runs",
        "S3://team-bucket/runs", "s3:///team-bucket", "s3://Team_Bucket/runs", "s3://ab/runs", "s3://team-bucket//runs",
        "s3://team-bucket/../runs", "s3://team-bucket/./runs", "https://team-bucket/runs", "az://container/runs",
        "/mnt/shared/runs", "team-bucket/runs", "gs://-bad-/runs", "s3://team-bucket/a/..",
        # bucket names the store refuses at CreateBucket (issue 40), and GCS's that S3's pattern would refuse
        "s3://team..bucket/runs", "s3://10.1.2.3/runs", "gs://10.1.2.3/runs", "s3://xn--team/runs",
        "s3://team-s3alias/runs", "s3://sthree-team/runs", "gs://team_bucket/runs", "gs://google-team/runs",
        "gs://goog-team", "gs://" + "a" * 64 + "/runs", "gs://runs.team.example.com/x", "s3://" + "a" * 63 + "/x"]


@pytest.mark.parametrize("url", URLS)
def test_the_chart_accepts_the_urls_raytrain_run_accepts(url):
    from raytrain.rundir.storage import URL_SCHEMES, url_problem, url_scheme

    accepted_by_run = url_scheme(url) in URL_SCHEMES and url_problem(url) is None
    try:
        render_chart(CHART, (), {**S3_VALUES, "objectStorage": {"url": url}})
        accepted_by_chart = True
    except ChartError as caught:
        assert "objectStorage.url" in str(caught) and "--set objectStorage.url=" in str(caught), str(caught)
        accepted_by_chart = False
    assert accepted_by_chart == accepted_by_run


BAD_OBJECT_STORAGE = [
    ({"objectStorage": {"url": "s3:/team-bucket/runs"}},
     "objectStorage.url \"s3:/team-bucket/runs\" is not an s3:// or gs:// URL: --set objectStorage.url=s3://BUCKET/PREFIX"),
    ({"objectStorage": {"url": "s3://Team_Bucket"}}, "the bucket name must be 3-63 characters"),
    ({"objectStorage": {"url": "s3://team..bucket/runs"}},
     "the bucket name has two periods in a row, so no bucket has that name: --set objectStorage.url=s3://BUCKET/PREFIX"),
    ({"objectStorage": {"url": "az://container/runs"}}, "Azure Blob Storage has no S3 API"),
    ({"objectStorage": {"url": "s3://team-bucket/a//b"}}, "its prefix has an empty, '.', '..'"),
    ({"objectStorage": {"url": "gs://team-bucket", "endpoint": "http://x:9000"}},
     "objectStorage.endpoint is read only for s3:// (as AWS_ENDPOINT_URL)"),
    ({"objectStorage": {"url": "gs://team-bucket", "region": "eu-west-1"}}, "objectStorage.region is read only for s3://"),
    ({"objectStorage": {"url": "s3://team-bucket", "endpoint": "minio:9000"}},
     "objectStorage.endpoint \"minio:9000\" is not an http:// or https:// URL"),
    ({"objectStorage": {"url": "", "credentialsSecret": "team-s3"}},
     "objectStorage.credentialsSecret is set but objectStorage.url is empty"),
    ({"objectStorage": {"url": "s3://team-bucket", "credentialsSecret": "team-s3"},
      "serviceAccount": {"create": True, "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}}},
     "objectStorage.credentialsSecret and serviceAccount.annotations eks.amazonaws.com/role-arn are both set"),
    ({"serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}}},
     "serviceAccount.annotations are set but serviceAccount.create is false"),
    ({"serviceAccount": {"name": "s" * 51}}, "has 51 characters: with autoscaling on, KubeRay v1.7.0 cuts"),
    ({"serviceAccount": {"name": "1st"}}, "is not a ServiceAccount name KubeRay keeps"),
    ({"objectStorage": {"tmpSizeLimit": "lots"}}, "/objectStorage/tmpSizeLimit"),
    ({"objectStorage": {"credentialsSecret": "Team_S3"}}, "/objectStorage/credentialsSecret"),
    ({"objectStorage": {"bucket": "x"}}, "additional properties 'bucket' not allowed"),
]


@pytest.mark.parametrize("values,expected", BAD_OBJECT_STORAGE, ids=[e for _, e in BAD_OBJECT_STORAGE])
def test_bad_object_storage_values_fail_naming_the_value_and_the_fix(values, expected):
    base = {**S3_VALUES, "objectStorage": {"url": "s3://team-bucket/runs"}}
    merged = {**base, **values, "objectStorage": {**base["objectStorage"], **values.get("objectStorage", {})}}
    with pytest.raises(ChartError) as caught:
        render_chart(CHART, (), merged)
    assert expected in str(caught.value)


def test_object_storage_with_a_shared_volume_left_on_without_source_says_to_turn_it_off():
    with pytest.raises(ChartError) as caught:
        render_chart(CHART, (), {"image": {"repository": PUSHED}, "objectStorage": {"url": "s3://team-bucket/runs"}})
    assert "objectStorage.url keeps the runs in a bucket, which needs no shared volume: --set sharedStorage.enabled=false" \
        in str(caught.value)
    with pytest.raises(ChartError) as caught:  # the defaults name the bucket as one of the ways out
        render_as_shipped()
    assert "--set objectStorage.url=s3://BUCKET/PREFIX,sharedStorage.enabled=false" in str(caught.value)
    # beside a shared volume with a source, a bucket is fine (datasets may stay there)
    render_chart(CHART, (CHOSEN,), {"objectStorage": {"url": "s3://team-bucket/runs"}})


def test_notes_give_the_storage_url_and_where_the_credentials_come_from():
    base = {"sharedStorage.enabled": False, "objectStorage.url": "s3://team-bucket/runs"}
    secret = notes(**base, **{"objectStorage.credentialsSecret": "team-s3"})
    assert "--storage s3://team-bucket/runs --address auto" in secret and "sharedStorage is disabled" not in secret
    assert "create secret generic team-s3 --from-literal=AWS_ACCESS_KEY_ID=" in secret
    irsa = notes(**base, **{"serviceAccount.create": True,
                            "serviceAccount.annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}})
    assert "trust policy must allow system:serviceaccount:default:raytrain-ray" in irsa
    gke = notes(**{**base, "objectStorage.url": "gs://team-bucket/runs"}, **{"serviceAccount.create": True})
    assert "PROJECT.svc.id.goog[default/raytrain-ray]" in gke
    assert "falls back to the node's identity" in notes(**base)
    assert "objectStorage.url empty: a RayJob must pass --storage" in notes(**{"sharedStorage.enabled": False})


def test_strict_lint_is_clean_with_object_storage(tmp_path):
    values = tmp_path / "s3.yaml"
    values.write_text(yaml.safe_dump({**S3_VALUES, "serviceAccount": {"create": True}, "autoscaling": {"enabled": True}}))
    assert lint_chart(CHART, [values], strict=True) == []


def test_a_group_may_request_the_disk_its_tmp_needs():
    """GKE Autopilot caps a pod's disk at its ephemeral-storage request: a group's resources may name it."""
    values = {**S3_VALUES, "worker": {"resources": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "30Gi"}}}
    worker = pod_specs(render_chart(CHART, (), values))["worker"]["containers"][0]["resources"]
    assert worker["requests"]["ephemeral-storage"] == worker["limits"]["ephemeral-storage"] == "30Gi"
    head = pod_specs(render_chart(CHART, (), S3_VALUES))["head"]["containers"][0]["resources"]
    assert "ephemeral-storage" not in head["requests"]


# The Ray version an image carries against rayVersion: the chart's validateValues.imageRayVersion and the validator's
# check_image_version (raytrain validate, on any RayCluster) are one rule written twice, held together here.
IMAGES = [("registry.example/team/raytrain", tag) for tag in
          ("0.1.0-ray2.60.0", "0.1.0-ray2.60.0-gpu", "0.1.0-ray2.54.0", "ray2.54.0", "latest", "xray2.54.0",
           "0.1.0-ray2.54.0rc1", "v1-ray2.60.0", "2.54.0")] + [("rayproject/ray", "2.54.0"), ("rayproject/ray", "2.60.0"),
                                                               ("rayproject/ray-ml", "2.54.0-py311"),
                                                               ("registry.example/team/ray", "1.2.0")]


@pytest.mark.parametrize("repository, tag", IMAGES)
def test_the_chart_and_the_validator_agree_on_the_images_ray_version(repository, tag):
    from raytrain.validator.problems import Doc
    from raytrain.validator.raytrain_rules import check_image_version

    doc = Doc("values.yaml", {"kind": "RayCluster", "metadata": {"name": "x"}})
    refused_by_validator = bool(check_image_version(doc, "image", f"{repository}:{tag}", "2.60.0"))
    try:
        render_chart(CHART, (), {**S3_VALUES, "rayVersion": "2.60.0",
                                 "image": {"repository": repository, "tag": tag}})
        refused_by_chart = False
    except ChartError as caught:
        assert "rayVersion" in str(caught), str(caught)
        refused_by_chart = True
    assert refused_by_chart == refused_by_validator


def test_a_teams_own_image_named_ray_carries_no_ray_version():
    from raytrain.validator.problems import Doc
    from raytrain.validator.raytrain_rules import check_image_version

    doc = Doc("values.yaml", {"kind": "RayCluster", "metadata": {"name": "x"}})
    assert check_image_version(doc, "image", "registry.example/team/ray:1.2.0", "2.60.0") == []
    assert check_image_version(doc, "image", "docker.io/rayproject/ray:2.54.0-py311", "2.60.0")


# ---------------------------------------------------------------------------------------------------- history server

def collector(*env: tuple[str, str | dict], image: str = "quay.io/kuberay/collector:v1.7.0") -> dict:
    """historyServer values: on, with the collector's image and env ((name, value or valueFrom) pairs)."""
    return {"historyServer": {"enabled": True, "collector": {"image": image, "env": [
        {"name": name, **({"valueFrom": value} if isinstance(value, dict) else {"value": value})}
        for name, value in env]}}}


S3_COLLECTOR = collector(("STORAGE_BACKEND", "S3"), ("S3_REGION", "us-east-1"), ("S3_BUCKET", "ray-history"),
                         ("AWS_ACCESS_KEY_ID", {"secretKeyRef": {"name": "history-s3", "key": "id"}}))


def test_the_history_server_collector_is_off_by_default_and_on_renders_kuberays_options():
    """Issue 38: where KubeRay's history server is the user's choice, the chart can ask the operator for its
    collector (spec.historyServerOptions; KubeRay v1.7.0 pod.go adds it to every pod); raytrain's own post-mortem
    needs none of it. The collector's resources are the chart's shape (requests = limits); NOTES says which gate the
    operator needs and that `raytrain why` does not."""
    for values_name in VALUES_FILES:
        [cluster] = by_kind(render(values_name), "RayCluster")
        assert "historyServerOptions" not in cluster["spec"]
    [cluster] = by_kind(render(**S3_COLLECTOR), "RayCluster")
    options = cluster["spec"]["historyServerOptions"]["collectorOptions"]
    assert options["image"] == "quay.io/kuberay/collector:v1.7.0" and options["imagePullPolicy"] == "IfNotPresent"
    assert options["resources"] == {"requests": {"cpu": "200m", "memory": "256Mi"},
                                    "limits": {"cpu": "200m", "memory": "256Mi"}}
    assert options["env"] == S3_COLLECTOR["historyServer"]["collector"]["env"]
    text = notes(**S3_COLLECTOR)
    assert "RayClusterHistoryServer" in text and "STORAGE_BACKEND S3" in text and "raytrain why" in text, text
    assert "-c ray-history-collector" in text and "RayClusterHistoryServer" not in notes()
    # On object storage the pod's disk is bounded: the ray-logs volume KubeRay mounts at /tmp/ray is the chart's, sized
    [cluster] = by_kind(render(**S3_VALUES, **S3_COLLECTOR), "RayCluster")
    for _, group in groups(cluster):
        volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        assert volumes["ray-logs"] == {"name": "ray-logs", "emptyDir": {"sizeLimit": volumes["tmp"]["emptyDir"]["sizeLimit"]}}
        assert not [m for c in group["template"]["spec"]["containers"] for m in c.get("volumeMounts", [])
                    if m["name"] == "ray-logs"]  # KubeRay mounts it (pod.go addEmptyDir reuses it by name)
    [cluster] = by_kind(render(**S3_COLLECTOR), "RayCluster")
    assert not [v for _, g in groups(cluster) for v in g["template"]["spec"].get("volumes", []) if v["name"] == "ray-logs"]


HISTORY_SERVER_BAD = [
    ({"historyServer": {"enabled": True}}, ["historyServer.enabled needs historyServer.collector.image",
                                            "no STORAGE_BACKEND with a literal value"]),
    (collector(("STORAGE_BACKEND", {"configMapKeyRef": {"name": "c", "key": "k"}}), ("S3_REGION", "x")),
     ["no STORAGE_BACKEND with a literal value (KubeRay reads no valueFrom for it)"]),
    (collector(("STORAGE_BACKEND", "S3"), ("S3_REGION", "x"), ("POD_IP", "1.2.3.4"), ("EVENTS_PORT", "1")),
     ["sets POD_IP, which KubeRay sets", "sets EVENTS_PORT, which KubeRay sets"]),
    (collector(("STORAGE_BACKEND", "ftp")), ['STORAGE_BACKEND "FTP" is none the collector knows']),
    (collector(("STORAGE_BACKEND", "s3")), ["STORAGE_BACKEND S3 needs S3_REGION", "STORAGE_BACKEND S3 needs S3_BUCKET"]),
    (collector(("STORAGE_BACKEND", "S3"), ("S3_REGION", "x")), ["needs S3_BUCKET (without it the collector writes to a "
                                                                "bucket named ray-historyserver"]),
    ({**S3_COLLECTOR, "head": {"rayStartParams": {"num-cpus": "0", "temp-dir": "/data/ray"}}},
     ["head.rayStartParams.temp-dir moves Ray's session out of /tmp/ray"]),
    ({**S3_COLLECTOR, "worker": {"env": [{"name": "RAY_TMPDIR", "value": "/scratch"}]}},
     ["worker.env sets RAY_TMPDIR, which moves Ray's session out of /tmp/ray"]),
    ({**S3_COLLECTOR, "head": {"rayStartParams": {"num-cpus": "0", "dashboard-port": "8266"}}},
     ["head.rayStartParams.dashboard-port moves the dashboard off 8265"]),
    (collector(("STORAGE_BACKEND", "GCS"), ("GCS_BUCKET", "")), ["STORAGE_BACKEND GCS needs GCS_BUCKET"]),
    (collector(("STORAGE_BACKEND", "AliyunOSS"), ("OSS_BUCKET", "b")),
     ["ALIYUNOSS needs OSS_ENDPOINT", "ALIYUNOSS needs OSS_REGION"]),
    (collector(("STORAGE_BACKEND", "AZUREBLOB")), ["AZUREBLOB needs AZURE_STORAGE_CONNECTION_STRING or"]),
    (collector(("STORAGE_BACKEND", "AZUREBLOB"), ("AZURE_STORAGE_AUTH_MODE", "connection_string"),
               ("AZURE_STORAGE_ACCOUNT_URL", "https://a")), ["AZUREBLOB needs AZURE_STORAGE_CONNECTION_STRING: add"]),
    (collector(("STORAGE_BACKEND", "S3"), ("S3_REGION", "x"), image=""), ["needs historyServer.collector.image"]),
    ({"historyServer": {"enabled": True, "collector": {"env": [{"value": "S3"}]}}}, ["/historyServer/collector/env/0"]),
    ({"historyServer": {"collector": {"imagePullPolicy": "Sometimes"}}}, ["/historyServer/collector/imagePullPolicy"]),
    ({"historyServer": {"enable": True}}, ["additional properties 'enable' not allowed"]),
]


@pytest.mark.parametrize("values, expected", HISTORY_SERVER_BAD, ids=[e[0] for _, e in HISTORY_SERVER_BAD])
def test_history_server_values_kuberay_or_the_collector_would_refuse_fail_early(values, expected):
    with pytest.raises(ChartError) as caught:
        render_chart(CHART, (CHOSEN,), values)
    for words in expected:
        assert words in str(caught.value), str(caught.value)


# KubeRay's collector rules: the chart's validateValues.historyServer and the validator's check_collector_options
# (raytrain validate, on any RayCluster or RayJob) are one rule written twice, held together here. The chart also
# refuses what KubeRay lets through and the collector then fails on: a backend it does not know (it exits at its
# start), S3 without S3_BUCKET (a bucket named ray-historyserver, anyone's): above, not here.
COLLECTOR_ENVS = [
    [("STORAGE_BACKEND", "S3"), ("S3_REGION", "eu-west-1"), ("S3_BUCKET", "b")], [("STORAGE_BACKEND", "s3")],
    [("STORAGE_BACKEND", "gcs"), ("GCS_BUCKET", {"secretKeyRef": {"name": "s", "key": "k"}})],
    [("STORAGE_BACKEND", "GCS")], [("S3_REGION", "x")],
    [("STORAGE_BACKEND", "ALIYUNOSS"), ("OSS_BUCKET", "b"), ("OSS_ENDPOINT", "e"), ("OSS_REGION", "r")],
    [("STORAGE_BACKEND", "ALIYUNOSS"), ("OSS_BUCKET", "b"), ("OSS_ENDPOINT", "e")],
    [("STORAGE_BACKEND", "AZUREBLOB"), ("AZURE_STORAGE_ACCOUNT_URL", "https://a")],
    [("STORAGE_BACKEND", "AZUREBLOB"), ("AZURE_STORAGE_AUTH_MODE", " Workload_Identity "),
     ("AZURE_STORAGE_CONNECTION_STRING", "c")],
    [("STORAGE_BACKEND", "AZUREBLOB"), ("AZURE_STORAGE_AUTH_MODE", "default"), ("AZURE_STORAGE_ACCOUNT_URL", "u")],
    [("STORAGE_BACKEND", "AZUREBLOB")],
    [("STORAGE_BACKEND", "S3"), ("S3_REGION", "x"), ("S3_BUCKET", "b"), ("RAY_ROLE", "Head")],
    [("STORAGE_BACKEND", {"configMapKeyRef": {"name": "c", "key": "k"}})],
]


@pytest.mark.parametrize("env", COLLECTOR_ENVS, ids=[str(i) for i in range(len(COLLECTOR_ENVS))])
def test_the_chart_and_the_validator_agree_on_the_collectors_env(env):
    from raytrain.validator.kuberay.gates import FeatureGates
    from raytrain.validator.kuberay.raycluster import check_collector_options
    from raytrain.validator.problems import Doc

    values = collector(*env)
    spec = {"historyServerOptions": {"collectorOptions": values["historyServer"]["collector"]}}
    doc = Doc("values.yaml", {"kind": "RayCluster", "metadata": {"name": "x"}, "spec": spec})
    refused_by_validator = bool(check_collector_options(doc, spec, "spec", {}, FeatureGates.parse("")))
    try:
        render_chart(CHART, (CHOSEN,), values)
        refused_by_chart = False
    except ChartError as caught:
        assert "historyServer" in str(caught), str(caught)
        refused_by_chart = True
    assert refused_by_chart == refused_by_validator, (env, refused_by_chart)
