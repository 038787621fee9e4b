"""KubeRay v1.7.0's rules (kuberay_rules.py): for each rule the smallest manifest that breaks it, which gets exactly
that rule's error and nothing else from the whole `raytrain validate` path (schema, CEL, webhook, operator rules,
raytrain's cross-checks), and its allowed neighbour, which passes.

Each case is a base manifest (a minimal RayCluster or RayJob below) and two patches, written as YAML mappings of
field path -> value (DELETE removes the field): `broken` breaks the rule, `allowed` is the nearest manifest KubeRay
admits.
"""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import yaml

from raytrain.validator.kuberay import (DEFAULT_FEATURE_GATES, FeatureGateError, FeatureGates, check_cel,
                                         check_kuberay, parse_generic_version)
from raytrain.validator.validate import Doc, validate_paths
from tests.support.patch import DELETE, patched

CLUSTER = yaml.safe_load("""
apiVersion: ray.io/v1
kind: RayCluster
metadata: {name: rc}
spec:
  rayVersion: "2.60.0"
  headGroupSpec:
    rayStartParams: {}
    template:
      spec:
        containers:
        - {name: ray-head, image: "registry.example/app:1"}
  workerGroupSpecs:
  - groupName: cpu
    replicas: 1
    minReplicas: 0
    maxReplicas: 2
    rayStartParams: {}
    template:
      spec:
        containers:
        - {name: ray-worker, image: "registry.example/app:1"}
""")

JOB = {
    "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "job"},
    "spec": {"entrypoint": "python -c 'print(1)'", "rayClusterSpec": copy.deepcopy(CLUSTER["spec"])},
}
SELECTOR_JOB = yaml.safe_load("""
apiVersion: ray.io/v1
kind: RayJob
metadata: {name: job}
spec:
  entrypoint: python -c 'print(1)'
  clusterSelector: {ray.io/cluster: rc}
""")

W0 = "spec.workerGroupSpecs[0]"
HEAD_C = "spec.headGroupSpec.template.spec.containers[0]"
JW0 = "spec.rayClusterSpec.workerGroupSpecs[0]"
JHEAD = "spec.rayClusterSpec.headGroupSpec"
FT = {"redisAddress": "redis:6379"}
COLLECTOR = {"image": "registry.example/collector:1", "env": [{"name": "STORAGE_BACKEND", "value": "S3"},
                                                              {"name": "S3_REGION", "value": "eu-west-1"}]}
RULE_SUCCEEDED = {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED"}}


# KubeRay v1.7.0's config/samples/ray-job.light-weight-submitter.yaml: the job's command after `--` in the args of
# a submitter image's own command (the whole sample: data/kuberay-v1.7.0-ray-job.light-weight-submitter.yaml).
LIGHT_WEIGHT_SUBMITTER = {"spec": {"restartPolicy": "Never", "containers": [{
    "name": "my-custom-rayjob-submitter", "image": "quay.io/kuberay/submitter:v1.5.1", "command": ["/submitter"],
    "args": ["--", "python", "/home/ray/samples/sample_code.py"]}]}}
SUBMITTER_ARGS_ONLY = {"spec": {"restartPolicy": "Never", "containers": [{
    "name": "submitter", "image": "quay.io/kuberay/submitter:v1.5.1", "args": ["--", "python", "sample_code.py"]}]}}


def env(**pairs: str) -> list[dict]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


@dataclasses.dataclass
class Case:
    id: str
    base: dict
    broken: dict
    allowed: dict
    field: str  # the one problem `broken` gets
    words: str  # ... and words of its message or fix
    gates: str = ""  # --feature-gates for both
    allowed_gates: str | None = None  # for the neighbour, when a gate is what allows it


def validate_obj(tmp_path, obj: dict, gates: str = "", crd_dir=None):
    """The whole `raytrain validate` path on the object written to a file."""
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(obj, sort_keys=False))
    return path, validate_paths([path], crd_dir, gates=FeatureGates.parse(gates))


C, J, S = CLUSTER, JOB, SELECTOR_JOB

CASES = [
    # metadata: ValidateRayClusterMetadata / ValidateRayJobMetadata
    Case("cluster name over 53", C, {"metadata.name": "r" * 54}, {"metadata.name": "r" * 53},
         "metadata.name", "at most 53"),
    Case("cluster name not DNS-1035", C, {"metadata.name": "rc.one"}, {"metadata.name": "rc-one"},
         "metadata.name", "DNS-1035"),
    Case("job name over 47", J, {"metadata.name": "j" * 48}, {"metadata.name": "j" * 47}, "metadata.name", "at most 47"),
    Case("job name not DNS-1035", J, {"metadata.name": "1job"}, {"metadata.name": "job1"}, "metadata.name", "DNS-1035"),
    # ValidateRayClusterUpgradeOptions
    Case("upgradeStrategy on a cluster a RayJob made", C,
         {"metadata.labels": {"ray.io/originated-from-crd": "RayJob"}, "spec.upgradeStrategy": {"type": "Recreate"}},
         {"spec.upgradeStrategy": {"type": "Recreate"}}, "spec.upgradeStrategy.type", "created directly"),
    Case("upgradeStrategy in a RayJob's cluster", J, {"spec.rayClusterSpec.upgradeStrategy": {"type": "None"}},
         {"spec.rayClusterSpec.upgradeStrategy": {}}, "spec.rayClusterSpec.upgradeStrategy.type", "created directly"),
    # webhook: validateWorkerGroups
    Case("duplicate worker group name", C, {"spec.workerGroupSpecs[1]": CLUSTER["spec"]["workerGroupSpecs"][0]},
         {"spec.workerGroupSpecs[1]": {**CLUSTER["spec"]["workerGroupSpecs"][0], "groupName": "cpu2"}},
         "spec.workerGroupSpecs[1].groupName", "refuses duplicate worker group"),
    Case("duplicate worker group name in a RayJob", J,
         {"spec.rayClusterSpec.workerGroupSpecs[1]": CLUSTER["spec"]["workerGroupSpecs"][0]},
         {"spec.rayClusterSpec.workerGroupSpecs[1]": {**CLUSTER["spec"]["workerGroupSpecs"][0], "groupName": "gpu"}},
         "spec.rayClusterSpec.workerGroupSpecs[1].groupName", "refuses duplicate worker group"),
    # ValidateRayClusterSpec: groups
    Case("head without a container", C, {"spec.headGroupSpec.template.spec.containers": []}, {},
         "spec.headGroupSpec.template.spec.containers", "no container"),
    Case("worker without a container", C, {f"{W0}.template.spec.containers": []}, {},
         f"{W0}.template.spec.containers", "no container"),
    Case("resources in both places", C, {f"{W0}.resources": {"CPU": "1"}, f"{W0}.rayStartParams": {"num-cpus": "1"}},
         {f"{W0}.resources": {"CPU": "1"}}, f"{W0}.resources", "both here and in rayStartParams"),
    Case("labels in rayStartParams", C, {"spec.headGroupSpec.rayStartParams": {"labels": "zone=a"}},
         {"spec.headGroupSpec.labels": {"zone": "a"}}, "spec.headGroupSpec.rayStartParams.labels", "not supported"),
    Case("label key syntax", C, {f"{W0}.labels": {"-zone": "a"}}, {f"{W0}.labels": {"example.com/zone": "a"}},
         f"{W0}.labels", "not a valid label key"),
    Case("label value syntax", C, {f"{W0}.labels": {"zone": "a b"}}, {f"{W0}.labels": {"zone": ""}},
         f"{W0}.labels.zone", "not a valid label value"),
    Case("negative minReplicas", C, {f"{W0}.minReplicas": -1}, {f"{W0}.minReplicas": 0},
         f"{W0}.minReplicas", "negative"),
    Case("negative maxReplicas", C, {f"{W0}.maxReplicas": -1}, {f"{W0}.maxReplicas": 0},
         f"{W0}.maxReplicas", "negative"),
    Case("minReplicas above maxReplicas", C, {f"{W0}.minReplicas": 3}, {f"{W0}.minReplicas": 2},
         f"{W0}.minReplicas", "above maxReplicas 2"),
    Case("minReplicas above maxReplicas in a RayJob", J, {f"{JW0}.minReplicas": 3}, {f"{JW0}.maxReplicas": 3},
         f"{JW0}.minReplicas", "above maxReplicas 2"),
    Case("negative worker idleTimeoutSeconds", C,
         {f"{W0}.idleTimeoutSeconds": -1, "spec.autoscalerOptions": {"version": "v2"}},
         {f"{W0}.idleTimeoutSeconds": 0, "spec.autoscalerOptions": {"version": "v2"}},
         f"{W0}.idleTimeoutSeconds", "must not be negative"),
    Case("worker idleTimeoutSeconds without autoscaler v2", C, {f"{W0}.idleTimeoutSeconds": 60},
         {f"{W0}.idleTimeoutSeconds": 60, "spec.autoscalerOptions": {"version": "v2"}},
         f"{W0}.idleTimeoutSeconds", "only autoscaler v2"),
    Case("priority below Ray 2.56.0", C, {f"{W0}.priority": 5, "spec.autoscalerOptions": {"version": "v2"},
                                          "spec.rayVersion": "2.55.1"},
         {f"{W0}.priority": 5, "spec.autoscalerOptions": {"version": "v2"}, "spec.rayVersion": "2.56.0"},
         "spec.rayVersion", "needs Ray 2.56.0"),
    Case("priority without rayVersion", C,
         {f"{W0}.priority": 5, "spec.autoscalerOptions": {"version": "v2"}, "spec.rayVersion": DELETE},
         {f"{W0}.priority": 0, "spec.rayVersion": DELETE}, "spec.rayVersion", "is not set"),
    Case("priority without autoscaler v2", C, {f"{W0}.priority": 5, "spec.rayVersion": "2.56.0"},
         {f"{W0}.priority": 5, "spec.rayVersion": "2.56.0", "spec.autoscalerOptions": {"version": "v2"}},
         f"{W0}.priority", "only autoscaler v2"),
    # GCS fault tolerance
    Case("ft annotation and gcsFaultToleranceOptions", C,
         {"metadata.annotations": {"ray.io/ft-enabled": "true"}, "spec.gcsFaultToleranceOptions": FT},
         {"spec.gcsFaultToleranceOptions": FT}, "spec.gcsFaultToleranceOptions", "ray.io/ft-enabled"),
    Case("the RayJob's annotations apply to its cluster", J,
         {"metadata.annotations": {"ray.io/ft-enabled": "true"}, "spec.rayClusterSpec.gcsFaultToleranceOptions": FT},
         {"spec.rayClusterSpec.gcsFaultToleranceOptions": FT}, "spec.rayClusterSpec.gcsFaultToleranceOptions",
         "ray.io/ft-enabled"),
    Case("RAY_REDIS_ADDRESS without fault tolerance", C, {f"{HEAD_C}.env": env(RAY_REDIS_ADDRESS="redis:6379")},
         {f"{HEAD_C}.env": env(RAY_REDIS_ADDRESS="redis:6379"), "metadata.annotations": {"ray.io/ft-enabled": "true"}},
         f"{HEAD_C}.env", "enables GCS fault tolerance implicitly"),
    Case("redis-password with gcsFaultToleranceOptions", C,
         {"spec.gcsFaultToleranceOptions": FT, "spec.headGroupSpec.rayStartParams": {"redis-password": "x"}},
         {"spec.gcsFaultToleranceOptions": {**FT, "redisPassword": {"value": "x"}}},
         "spec.headGroupSpec.rayStartParams.redis-password", "gcsFaultToleranceOptions.redisPassword"),
    Case("REDIS_PASSWORD with gcsFaultToleranceOptions", C,
         {"spec.gcsFaultToleranceOptions": FT, f"{HEAD_C}.env": env(REDIS_PASSWORD="x")},
         {"spec.gcsFaultToleranceOptions": FT, f"{HEAD_C}.env": env(OTHER="x")}, f"{HEAD_C}.env", "REDIS_PASSWORD"),
    Case("RAY_REDIS_ADDRESS with gcsFaultToleranceOptions", C,
         {"spec.gcsFaultToleranceOptions": FT, f"{HEAD_C}.env": env(RAY_REDIS_ADDRESS="redis:6379")},
         {"spec.gcsFaultToleranceOptions": FT}, f"{HEAD_C}.env", "gcsFaultToleranceOptions.redisAddress"),
    Case("external-storage-namespace annotation with gcsFaultToleranceOptions", C,
         {"spec.gcsFaultToleranceOptions": FT, "metadata.annotations": {"ray.io/external-storage-namespace": "ns"}},
         {"spec.gcsFaultToleranceOptions": {**FT, "externalStorageNamespace": "ns"}},
         "metadata.annotations.ray.io/external-storage-namespace", "externalStorageNamespace"),
    Case("rocksdb without its gate", C, {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb"}},
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb"}}, "spec.gcsFaultToleranceOptions.backend",
         "--feature-gates=GCSFaultToleranceEmbeddedStorage=true", allowed_gates="GCSFaultToleranceEmbeddedStorage=true"),
    Case("rocksdb with a redis field", C, {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb", **FT}},
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb"}}, "spec.gcsFaultToleranceOptions.redisAddress",
         "backend is rocksdb", gates="GCSFaultToleranceEmbeddedStorage=true"),
    Case("rocksdb claimName with size", C,
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb", "storage": {"claimName": "gcs", "size": "1Gi"}}},
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb", "storage": {"claimName": "gcs"}}},
         "spec.gcsFaultToleranceOptions.storage.claimName", "cannot be combined",
         gates="GCSFaultToleranceEmbeddedStorage=true"),
    Case("rocksdb with RAY_gcs_storage", C,
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb"}, f"{HEAD_C}.env": env(RAY_gcs_storage="rocksdb")},
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb"}}, f"{HEAD_C}.env", "RAY_gcs_storage",
         gates="GCSFaultToleranceEmbeddedStorage=true"),
    Case("rocksdb with a mount at /data/gcs", C,
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb"},
          f"{HEAD_C}.volumeMounts": [{"name": "data", "mountPath": "/data/gcs"}],
          "spec.headGroupSpec.template.spec.volumes": [{"name": "data", "emptyDir": {}}]},
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb"},
          f"{HEAD_C}.volumeMounts": [{"name": "data", "mountPath": "/data/mine"}],
          "spec.headGroupSpec.template.spec.volumes": [{"name": "data", "emptyDir": {}}]},
         f"{HEAD_C}.volumeMounts[0]", "/data/gcs", gates="GCSFaultToleranceEmbeddedStorage=true"),
    Case("rocksdb with a volume gcs-storage", C,
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb"},
          "spec.headGroupSpec.template.spec.volumes": [{"name": "gcs-storage", "emptyDir": {}}]},
         {"spec.gcsFaultToleranceOptions": {"backend": "rocksdb"},
          "spec.headGroupSpec.template.spec.volumes": [{"name": "scratch", "emptyDir": {}}]},
         "spec.headGroupSpec.template.spec.volumes[0]", "gcs-storage", gates="GCSFaultToleranceEmbeddedStorage=true"),
    Case("redis backend with storage", C, {"spec.gcsFaultToleranceOptions": {**FT, "storage": {"size": "1Gi"}}},
         {"spec.gcsFaultToleranceOptions": FT}, "spec.gcsFaultToleranceOptions.storage", "only to the rocksdb"),
    Case("redis username", C, {"spec.headGroupSpec.rayStartParams": {"redis-username": "u"}},
         {"spec.gcsFaultToleranceOptions": {**FT, "redisUsername": {"value": "u"}}},
         "spec.headGroupSpec", "gcsFaultToleranceOptions.redisUsername"),
    # suspend and the autoscaler
    Case("worker suspend without RayJobDeletionPolicy", C, {f"{W0}.suspend": True}, {f"{W0}.suspend": True},
         f"{W0}.suspend", "--feature-gates=RayJobDeletionPolicy=true", gates="RayJobDeletionPolicy=false",
         allowed_gates=""),
    Case("autoscaler v2 env without autoscaling", C, {f"{HEAD_C}.env": env(RAY_enable_autoscaler_v2="1")},
         {f"{HEAD_C}.env": env(RAY_enable_autoscaler_v2="1"), "spec.enableInTreeAutoscaling": True},
         f"{HEAD_C}.env", "enableInTreeAutoscaling"),
    Case("worker suspend with autoscaling", C, {f"{W0}.suspend": True, "spec.enableInTreeAutoscaling": True},
         {f"{W0}.suspend": False, "spec.enableInTreeAutoscaling": True}, f"{W0}.suspend", "autoscaler on"),
    Case("autoscalerOptions.version and the v2 env", C,
         {"spec.enableInTreeAutoscaling": True, "spec.autoscalerOptions": {"version": "v2"},
          f"{HEAD_C}.env": env(RAY_enable_autoscaler_v2="true")},
         {"spec.enableInTreeAutoscaling": True, "spec.autoscalerOptions": {"version": "v2"}},
         f"{HEAD_C}.env", "keep autoscalerOptions.version"),
    Case("autoscaler v2 with restartPolicy Always", C,
         {"spec.enableInTreeAutoscaling": True, "spec.autoscalerOptions": {"version": "v2"},
          f"{W0}.template.spec.restartPolicy": "OnFailure"},
         {"spec.enableInTreeAutoscaling": True, "spec.autoscalerOptions": {"version": "v2"},
          f"{W0}.template.spec.restartPolicy": "Never"}, f"{W0}.template.spec.restartPolicy", "Never or unset"),
    Case("negative autoscaler idleTimeoutSeconds", C, {"spec.autoscalerOptions": {"idleTimeoutSeconds": -1}},
         {"spec.autoscalerOptions": {"idleTimeoutSeconds": 0}}, "spec.autoscalerOptions.idleTimeoutSeconds",
         "must not be negative"),
    Case("KUBERAY_GEN_AUTOSCALER_START_CMD in autoscalerOptions.env", C,
         {"spec.autoscalerOptions": {"env": env(KUBERAY_GEN_AUTOSCALER_START_CMD="x")}},
         {"spec.autoscalerOptions": {"env": env(MY_START_CMD="x")}}, "spec.autoscalerOptions.env", "managed by KubeRay"),
    # history server
    Case("historyServerOptions without its gate", C, {"spec.historyServerOptions": {"collectorOptions": COLLECTOR}},
         {"spec.historyServerOptions": {"collectorOptions": COLLECTOR}}, "spec.historyServerOptions",
         "--feature-gates=RayClusterHistoryServer=true", allowed_gates="RayClusterHistoryServer=true"),
    Case("historyServerOptions without collectorOptions", C, {"spec.historyServerOptions": {}},
         {"spec.historyServerOptions": {"collectorOptions": COLLECTOR}},
         "spec.historyServerOptions.collectorOptions", "is required", gates="RayClusterHistoryServer=true"),
    Case("a container named like the collector", C,
         {"spec.historyServerOptions": {"collectorOptions": COLLECTOR},
          "spec.headGroupSpec.template.spec.containers[1]": {"name": "ray-history-collector", "image": "x:1"}},
         {"spec.historyServerOptions": {"collectorOptions": COLLECTOR},
          "spec.headGroupSpec.template.spec.containers[1]": {"name": "log-shipper", "image": "x:1"}},
         "spec.headGroupSpec.template.spec.containers[1].name", "collector", gates="RayClusterHistoryServer=true"),
    Case("collector without image", C, {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "image": ""}}},
         {"spec.historyServerOptions": {"collectorOptions": COLLECTOR}},
         "spec.historyServerOptions.collectorOptions.image", "is required", gates="RayClusterHistoryServer=true"),
    Case("collector env KubeRay manages", C,
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": COLLECTOR["env"] + env(POD_IP="x")}}},
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": COLLECTOR["env"] + env(POD="x")}}},
         "spec.historyServerOptions.collectorOptions.env", "POD_IP", gates="RayClusterHistoryServer=true"),
    Case("collector without STORAGE_BACKEND", C,
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(S3_REGION="eu")}}},
         {"spec.historyServerOptions": {"collectorOptions": COLLECTOR}},
         "spec.historyServerOptions.collectorOptions.env", "STORAGE_BACKEND", gates="RayClusterHistoryServer=true"),
    Case("collector GCS without bucket", C,
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(STORAGE_BACKEND="gcs")}}},
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(STORAGE_BACKEND="gcs",
                                                                                     GCS_BUCKET="b")}}},
         "spec.historyServerOptions.collectorOptions.env", "GCS_BUCKET", gates="RayClusterHistoryServer=true"),
    Case("collector S3 without region", C,
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(STORAGE_BACKEND="S3",
                                                                                    S3_REGION="")}}},
         {"spec.historyServerOptions": {"collectorOptions": COLLECTOR}},
         "spec.historyServerOptions.collectorOptions.env", "S3_REGION", gates="RayClusterHistoryServer=true"),
    Case("collector Azure without credentials", C,
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(STORAGE_BACKEND="AZUREBLOB")}}},
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(
             STORAGE_BACKEND="AZUREBLOB", AZURE_STORAGE_ACCOUNT_URL="https://a")}}},
         "spec.historyServerOptions.collectorOptions.env", "AZURE_STORAGE_CONNECTION_STRING or",
         gates="RayClusterHistoryServer=true"),
    Case("collector Azure workload identity without account URL", C,
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(
             STORAGE_BACKEND="AZUREBLOB", AZURE_STORAGE_AUTH_MODE="workload_identity",
             AZURE_STORAGE_CONNECTION_STRING="s")}}},
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(
             STORAGE_BACKEND="AZUREBLOB", AZURE_STORAGE_AUTH_MODE="workload_identity",
             AZURE_STORAGE_ACCOUNT_URL="https://a")}}},
         "spec.historyServerOptions.collectorOptions.env", "needs AZURE_STORAGE_ACCOUNT_URL",
         gates="RayClusterHistoryServer=true"),
    Case("collector Azure connection string mode without it", C,
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(
             STORAGE_BACKEND="AZUREBLOB", AZURE_STORAGE_AUTH_MODE="connection_string",
             AZURE_STORAGE_ACCOUNT_URL="https://a")}}},
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(
             STORAGE_BACKEND="AZUREBLOB", AZURE_STORAGE_AUTH_MODE="connection_string",
             AZURE_STORAGE_CONNECTION_STRING="s")}}},
         "spec.historyServerOptions.collectorOptions.env", "needs AZURE_STORAGE_CONNECTION_STRING",
         gates="RayClusterHistoryServer=true"),
    Case("collector Aliyun without endpoint", C,
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(
             STORAGE_BACKEND="ALIYUNOSS", OSS_BUCKET="b", OSS_REGION="r")}}},
         {"spec.historyServerOptions": {"collectorOptions": {**COLLECTOR, "env": env(
             STORAGE_BACKEND="ALIYUNOSS", OSS_BUCKET="b", OSS_REGION="r", OSS_ENDPOINT="e")}}},
         "spec.historyServerOptions.collectorOptions.env", "OSS_ENDPOINT", gates="RayClusterHistoryServer=true"),
    # auth
    Case("token auth below Ray 2.52.0", C, {"spec.authOptions": {"mode": "token"}, "spec.rayVersion": "2.51.0"},
         {"spec.authOptions": {"mode": "token"}, "spec.rayVersion": "2.52"}, "spec.rayVersion", "needs Ray 2.52.0"),
    Case("token auth without rayVersion", C, {"spec.authOptions": {"mode": "token"}, "spec.rayVersion": DELETE},
         {"spec.authOptions": {"mode": "disabled"}, "spec.rayVersion": DELETE}, "spec.rayVersion", "is not set"),
    Case("token auth with an unreadable rayVersion", C,
         {"spec.authOptions": {"mode": "token"}, "spec.rayVersion": "latest"},
         {"spec.authOptions": {"mode": "token"}, "spec.rayVersion": "v2.53.0rc1"}, "spec.rayVersion",
         "not a version KubeRay can read"),
    Case("k8s token auth without token mode", C, {"spec.authOptions": {"enableK8sTokenAuth": True}},
         {"spec.authOptions": {"enableK8sTokenAuth": True, "mode": "token"}},
         "spec.authOptions.enableK8sTokenAuth", "mode is not token"),
    Case("k8s token auth below Ray 2.55.0", C,
         {"spec.authOptions": {"enableK8sTokenAuth": True, "mode": "token"}, "spec.rayVersion": "2.54.0"},
         {"spec.authOptions": {"enableK8sTokenAuth": False, "mode": "token"}, "spec.rayVersion": "2.54.0"},
         "spec.rayVersion", "needs Ray 2.55.0"),
    Case("k8s token auth with secretName", C,
         {"spec.authOptions": {"enableK8sTokenAuth": True, "mode": "token", "secretName": "s"}},
         {"spec.authOptions": {"mode": "token", "secretName": "s"}}, "spec.authOptions.secretName", "cannot be set"),
    Case("k8s token auth in a RayJob", J, {"spec.rayClusterSpec.authOptions": {"enableK8sTokenAuth": True,
                                                                              "mode": "token"}},
         {"spec.rayClusterSpec.authOptions": {"mode": "token"}}, "spec.rayClusterSpec.authOptions.enableK8sTokenAuth",
         "not supported for a RayJob"),
    # network policy
    Case("networkPolicy without its gate", C, {"spec.networkPolicy": {}}, {"spec.networkPolicy": {}},
         "spec.networkPolicy", "--feature-gates=RayClusterNetworkPolicy=true",
         allowed_gates="RayClusterNetworkPolicy=true"),
    Case("networkPolicy ingress rules with DenyAllEgress", C,
         {"spec.networkPolicy": {"mode": "DenyAllEgress", "head": {"ingressRules": [{}]}}},
         {"spec.networkPolicy": {"mode": "DenyAll", "head": {"ingressRules": [{}]}}},
         "spec.networkPolicy.head.ingressRules", "not restricted", gates="RayClusterNetworkPolicy=true"),
    Case("networkPolicy egress rules with DenyAllIngress", C,
         {"spec.networkPolicy": {"mode": "DenyAllIngress", "workerGroups": [{"groupName": "cpu", "egressRules": [{}]}]}},
         {"spec.networkPolicy": {"mode": "DenyAllIngress", "workerGroups": [{"groupName": "cpu", "ingressRules": [{}]}]}},
         "spec.networkPolicy.workerGroups[0].egressRules", "not restricted", gates="RayClusterNetworkPolicy=true"),
    Case("networkPolicy for an unknown worker group", C,
         {"spec.networkPolicy": {"workerGroups": [{"groupName": "gpu"}]}},
         {"spec.networkPolicy": {"workerGroups": [{"groupName": "cpu"}]}},
         "spec.networkPolicy.workerGroups[0].groupName", "not the groupName", gates="RayClusterNetworkPolicy=true"),
    Case("networkPolicy with a group name not DNS-1123", C,
         {"spec.networkPolicy": {}, f"{W0}.groupName": "CPU"}, {"spec.networkPolicy": {}},
         f"{W0}.groupName", "DNS-1123", gates="RayClusterNetworkPolicy=true"),
    # TLS
    Case("tlsOptions without its gate", C, {"spec.tlsOptions": {"enabled": True}}, {"spec.tlsOptions": {"enabled": True}},
         "spec.tlsOptions", "--feature-gates=RayClusterMTLS=true", allowed_gates="RayClusterMTLS=true"),
    Case("TLS env in the head", C, {"spec.tlsOptions": {"enabled": True}, f"{HEAD_C}.env": env(RAY_USE_TLS="1")},
         {"spec.tlsOptions": {"enabled": False}, f"{HEAD_C}.env": env(RAY_USE_TLS="1")}, f"{HEAD_C}.env",
         "RAY_USE_TLS", gates="RayClusterMTLS=true"),
    Case("TLS mount path in a worker", C,
         {"spec.tlsOptions": {"enabled": True}, f"{W0}.template.spec.containers[0].volumeMounts": [
             {"name": "certs", "mountPath": "/etc/ray/tls"}], f"{W0}.template.spec.volumes": [{"name": "certs",
                                                                                             "emptyDir": {}}]},
         {"spec.tlsOptions": {"enabled": True}, f"{W0}.template.spec.containers[0].volumeMounts": [
             {"name": "certs", "mountPath": "/etc/my-certs"}], f"{W0}.template.spec.volumes": [{"name": "certs",
                                                                                              "emptyDir": {}}]},
         f"{W0}.template.spec.containers[0].volumeMounts[0]", "/etc/ray/tls", gates="RayClusterMTLS=true"),
    Case("TLS env in the autoscaler", C,
         {"spec.tlsOptions": {"enabled": True}, "spec.autoscalerOptions": {"env": env(RAY_TLS_CA_CERT="x")}},
         {"spec.tlsOptions": {"enabled": True}, "spec.autoscalerOptions": {"env": env(MY_CA_CERT="x")}},
         "spec.autoscalerOptions.env", "RAY_TLS_CA_CERT", gates="RayClusterMTLS=true"),
    Case("TLS volume name in the autoscaler", C,
         {"spec.tlsOptions": {"enabled": True}, "spec.autoscalerOptions": {"volumeMounts": [
             {"name": "ray-tls", "mountPath": "/certs"}]}},
         {"spec.tlsOptions": {"enabled": True}, "spec.autoscalerOptions": {"volumeMounts": [
             {"name": "my-tls", "mountPath": "/certs"}]}},
         "spec.autoscalerOptions.volumeMounts[0]", "ray-tls", gates="RayClusterMTLS=true"),
    # ValidateRayJobSpec
    Case("suspend without shutdown", J, {"spec.suspend": True},
         {"spec.suspend": True, "spec.shutdownAfterJobFinishes": True}, "spec.suspend", "cannot be suspended"),
    Case("negative TTL", J, {"spec.ttlSecondsAfterFinished": -1, "spec.shutdownAfterJobFinishes": True},
         {"spec.ttlSecondsAfterFinished": 0, "spec.shutdownAfterJobFinishes": True}, "spec.ttlSecondsAfterFinished",
         "must not be negative"),
    Case("TTL without shutdown", J, {"spec.ttlSecondsAfterFinished": 60},
         {"spec.ttlSecondsAfterFinished": 60, "spec.shutdownAfterJobFinishes": True}, "spec.ttlSecondsAfterFinished",
         "without shutdownAfterJobFinishes"),
    Case("deletionStrategy without its gate", J, {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED]}},
         {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED]}}, "spec.deletionStrategy",
         "--feature-gates=RayJobDeletionPolicy=true", gates="RayJobDeletionPolicy=false", allowed_gates=""),
    Case("deletionRules with shutdown", J,
         {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED]}, "spec.shutdownAfterJobFinishes": True},
         {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED]}}, "spec.deletionStrategy.deletionRules",
         "shutdownAfterJobFinishes"),
    Case("legacy policy without its policy", J,
         {"spec.deletionStrategy": {"onSuccess": {}, "onFailure": {"policy": "DeleteCluster"}}},
         {"spec.deletionStrategy": {"onSuccess": {"policy": "DeleteCluster"}, "onFailure": {"policy": "DeleteCluster"}}},
         "spec.deletionStrategy.onSuccess.policy", "is required"),
    Case("legacy DeleteCluster with clusterSelector", S,
         {"spec.deletionStrategy": {"onSuccess": {"policy": "DeleteCluster"}, "onFailure": {"policy": "DeleteSelf"}}},
         {"spec.deletionStrategy": {"onSuccess": {"policy": "DeleteSelf"}, "onFailure": {"policy": "DeleteSelf"}}},
         "spec.deletionStrategy.onSuccess.policy", "not allowed with clusterSelector"),
    Case("legacy DeleteWorkers with autoscaling", J,
         {"spec.rayClusterSpec.enableInTreeAutoscaling": True,
          "spec.deletionStrategy": {"onSuccess": {"policy": "DeleteCluster"}, "onFailure": {"policy": "DeleteWorkers"}}},
         {"spec.rayClusterSpec.enableInTreeAutoscaling": True,
          "spec.deletionStrategy": {"onSuccess": {"policy": "DeleteCluster"}, "onFailure": {"policy": "DeleteCluster"}}},
         "spec.deletionStrategy.onFailure.policy", "autoscaling"),
    Case("legacy DeleteNone with shutdown", J,
         {"spec.shutdownAfterJobFinishes": True,
          "spec.deletionStrategy": {"onSuccess": {"policy": "DeleteNone"}, "onFailure": {"policy": "DeleteCluster"}}},
         {"spec.shutdownAfterJobFinishes": True,
          "spec.deletionStrategy": {"onSuccess": {"policy": "DeleteSelf"}, "onFailure": {"policy": "DeleteCluster"}}},
         "spec.deletionStrategy.onSuccess.policy", "DeleteNone contradicts"),
    Case("deletion rule DeleteCluster with clusterSelector", S,
         {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED]}},
         {"spec.deletionStrategy": {"deletionRules": [{**RULE_SUCCEEDED, "policy": "DeleteSelf"}]}},
         "spec.deletionStrategy.deletionRules[0].policy", "not allowed with clusterSelector"),
    Case("deletion rule DeleteWorkers with autoscaling", J,
         {"spec.rayClusterSpec.enableInTreeAutoscaling": True,
          "spec.deletionStrategy": {"deletionRules": [{**RULE_SUCCEEDED, "policy": "DeleteWorkers"}]}},
         {"spec.rayClusterSpec.enableInTreeAutoscaling": True,
          "spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED]}},
         "spec.deletionStrategy.deletionRules[0].policy", "autoscaling"),
    Case("duplicate deletion rule", J, {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED, RULE_SUCCEEDED]}},
         {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED, {**RULE_SUCCEEDED,
                                                                       "condition": {"jobStatus": "FAILED"}}]}},
         "spec.deletionStrategy.deletionRules[1]", "duplicates deletionRules[0]"),
    Case("duplicate deletion rule on jobDeploymentStatus", J,
         {"spec.deletionStrategy": {"deletionRules": [
             {"policy": "DeleteSelf", "condition": {"jobDeploymentStatus": "Failed"}},
             {"policy": "DeleteSelf", "condition": {"jobDeploymentStatus": "Failed", "ttlSeconds": 10}}]}},
         {"spec.deletionStrategy": {"deletionRules": [
             {"policy": "DeleteSelf", "condition": {"jobDeploymentStatus": "Failed"}},
             {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED", "ttlSeconds": 10}}]}},
         "spec.deletionStrategy.deletionRules[1]", "duplicates deletionRules[0]"),
    Case("deletion TTLs out of order", J,
         {"spec.deletionStrategy": {"deletionRules": [
             {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 60}},
             {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED", "ttlSeconds": 30}}]}},
         {"spec.deletionStrategy": {"deletionRules": [
             {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 60}},
             {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED", "ttlSeconds": 60}}]}},
         "spec.deletionStrategy.deletionRules[1].condition.ttlSeconds", "below the 60 of DeleteCluster"),
    Case("neither rayClusterSpec nor clusterSelector", J, {"spec.rayClusterSpec": DELETE},
         {"spec.rayClusterSpec": DELETE, "spec.clusterSelector": {"ray.io/cluster": "rc"}}, "spec", "neither"),
    Case("clusterSelector without the cluster name", S, {"spec.clusterSelector": {"app": "rc"}},
         {"spec.clusterSelector": {"app": "rc", "ray.io/cluster": "rc"}}, "spec.clusterSelector", "'ray.io/cluster'"),
    Case("clusterSelector with suspend", S, {"spec.suspend": True, "spec.shutdownAfterJobFinishes": True},
         {"spec.shutdownAfterJobFinishes": True}, "spec.suspend", "clusterSelector mode does not support suspend"),
    Case("clusterSelector in SidecarMode", S, {"spec.submissionMode": "SidecarMode"},
         {"spec.submissionMode": "HTTPMode"}, "spec.submissionMode", "SidecarMode does not support clusterSelector"),
    Case("clusterSelector with backoffLimit", S, {"spec.backoffLimit": 1}, {"spec.backoffLimit": 0},
         "spec.backoffLimit", "clusterSelector"),
    Case("InteractiveMode with backoffLimit", J, {"spec.submissionMode": "InteractiveMode", "spec.backoffLimit": 1},
         {"spec.submissionMode": "InteractiveMode", "spec.backoffLimit": 0}, "spec.backoffLimit", "InteractiveMode"),
    Case("SidecarMode with submitterPodTemplate", J,
         {"spec.submissionMode": "SidecarMode", "spec.submitterPodTemplate": {
             "spec": {"restartPolicy": "Never", "containers": [{"name": "s", "image": "x:1"}]}}},
         {"spec.submissionMode": "K8sJobMode", "spec.submitterPodTemplate": {
             "spec": {"restartPolicy": "Never", "containers": [{"name": "s", "image": "x:1"}]}}},
         "spec.submitterPodTemplate", "SidecarMode"),
    Case("SidecarMode with submitterConfig", J, {"spec.submissionMode": "SidecarMode",
                                                 "spec.submitterConfig": {"backoffLimit": 1}},
         {"spec.submissionMode": "SidecarMode"}, "spec.submitterConfig", "SidecarMode"),
    Case("SidecarMode with a restarting head", J,
         {"spec.submissionMode": "SidecarMode", f"{JHEAD}.template.spec.restartPolicy": "Always"},
         {"spec.submissionMode": "SidecarMode", f"{JHEAD}.template.spec.restartPolicy": "Never"},
         f"{JHEAD}.template.spec.restartPolicy", "SidecarMode"),
    Case("runtimeEnvYAML not a mapping", J, {"spec.runtimeEnvYAML": "- pip"},
         {"spec.runtimeEnvYAML": "pip: [numpy]"}, "spec.runtimeEnvYAML", "not a YAML mapping"),
    Case("activeDeadlineSeconds not positive", J, {"spec.activeDeadlineSeconds": 0}, {"spec.activeDeadlineSeconds": 1},
         "spec.activeDeadlineSeconds", "positive"),
    Case("negative backoffLimit", J, {"spec.backoffLimit": -1}, {"spec.backoffLimit": 0}, "spec.backoffLimit",
         "must not be negative"),
    # raytrain is stricter: KubeRay admits these, they cannot work
    Case("unknown submissionMode", J, {"spec.submissionMode": "ShellMode"}, {"spec.submissionMode": "HTTPMode"},
         "spec.submissionMode", "KubeRay would admit it"),
    Case("submitter restartPolicy Always", J,
         {"spec.submitterPodTemplate": {"spec": {"restartPolicy": "Always", "containers": [{"name": "s", "image": "x:1"}]}}},
         {"spec.submitterPodTemplate": {"spec": {"restartPolicy": "OnFailure",
                                                 "containers": [{"name": "s", "image": "x:1"}]}}},
         "spec.submitterPodTemplate.spec.restartPolicy", "KubeRay would admit the RayJob"),
    Case("submitter without image", J,
         {"spec.submitterPodTemplate": {"spec": {"restartPolicy": "Never", "containers": [{"name": "s"}]}}},
         {"spec.submitterPodTemplate": {"spec": {"restartPolicy": "Never", "containers": [{"name": "s", "image": "x:1"}]}}},
         "spec.submitterPodTemplate.spec.containers[0].image", "KubeRay would admit the RayJob"),
    # the CRDs' CEL rules (evaluated by the API server, before the webhook and the operator)
    Case("CEL: legacy policies and deletionRules together", J,
         {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED], "onSuccess": {"policy": "DeleteSelf"}}},
         {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED]}}, "spec.deletionStrategy",
         "cannot be used together"),
    Case("CEL: only one legacy policy", J, {"spec.deletionStrategy": {"onSuccess": {"policy": "DeleteSelf"}}},
         {"spec.deletionStrategy": {"onSuccess": {"policy": "DeleteSelf"}, "onFailure": {"policy": "DeleteSelf"}}},
         "spec.deletionStrategy", "requires either BOTH onSuccess and onFailure"),
    Case("CEL: empty deletionStrategy", J, {"spec.deletionStrategy": {}},
         {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED]}}, "spec.deletionStrategy",
         "requires either BOTH onSuccess and onFailure"),
    Case("CEL: deletion condition with both statuses", J,
         {"spec.deletionStrategy": {"deletionRules": [{"policy": "DeleteSelf", "condition": {
             "jobStatus": "FAILED", "jobDeploymentStatus": "Failed"}}]}},
         {"spec.deletionStrategy": {"deletionRules": [{"policy": "DeleteSelf", "condition": {
             "jobDeploymentStatus": "Failed"}}]}},
         "spec.deletionStrategy.deletionRules[0].condition", "cannot be used together"),
    Case("CEL: deletion condition with no status", J,
         {"spec.deletionStrategy": {"deletionRules": [{"policy": "DeleteSelf", "condition": {"ttlSeconds": 5}}]}},
         {"spec.deletionStrategy": {"deletionRules": [{"policy": "DeleteSelf", "condition": {
             "jobStatus": "FAILED", "ttlSeconds": 5}}]}},
         "spec.deletionStrategy.deletionRules[0].condition", "requires either the JobStatus"),
    # raytrain: a RayJob that truly has no command (rayjob.py check_job_entrypoint; KubeRay v1.7.0
    # rayjob_controller.go configureSubmitterContainer runs a K8sJobMode submitter container's own command as given)
    Case("no entrypoint, default submitter", J, {"spec.entrypoint": DELETE},
         {"spec.entrypoint": DELETE, "spec.submissionMode": "InteractiveMode"}, "spec.entrypoint", "empty or missing"),
    Case("no entrypoint, submitter args without a command", J,
         {"spec.entrypoint": DELETE, "spec.submitterPodTemplate": SUBMITTER_ARGS_ONLY},
         {"spec.entrypoint": DELETE, "spec.submitterPodTemplate": LIGHT_WEIGHT_SUBMITTER}, "spec.entrypoint",
         "has args but no command"),
    Case("no entrypoint, custom submitter command in HTTPMode", J,
         {"spec.entrypoint": DELETE, "spec.submitterPodTemplate": LIGHT_WEIGHT_SUBMITTER, "spec.submissionMode":
          "HTTPMode"},
         {"spec.entrypoint": DELETE, "spec.submitterPodTemplate": LIGHT_WEIGHT_SUBMITTER, "spec.submissionMode":
          "K8sJobMode"}, "spec.entrypoint", "empty or missing"),
    Case("no entrypoint in SidecarMode", J, {"spec.entrypoint": "  ", "spec.submissionMode": "SidecarMode"},
         {"spec.submissionMode": "SidecarMode"}, "spec.entrypoint", "empty or missing"),
    Case("no entrypoint, custom submitter on an existing cluster", S,
         {"spec.entrypoint": DELETE, "spec.submitterPodTemplate": SUBMITTER_ARGS_ONLY},
         {"spec.entrypoint": DELETE, "spec.submitterPodTemplate": LIGHT_WEIGHT_SUBMITTER}, "spec.entrypoint",
         "has args but no command"),
    Case("CEL: RayCluster managedBy", C, {"spec.managedBy": "my-controller"},
         {"spec.managedBy": "kueue.x-k8s.io/multikueue"}, "spec.managedBy", "must be either"),
    Case("CEL: RayJob managedBy", J, {"spec.managedBy": "my-controller"}, {"spec.managedBy": "ray.io/kuberay-operator"},
         "spec.managedBy", "must be either"),
    Case("CEL: RayJob's cluster managedBy", J, {"spec.rayClusterSpec.managedBy": ""},
         {"spec.rayClusterSpec.managedBy": "ray.io/kuberay-operator"}, "spec.rayClusterSpec.managedBy",
         "must be either"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_broken_rule_gets_its_error_alone_and_its_neighbour_passes(crd_dir, tmp_path, case):
    path, problems = validate_obj(tmp_path, patched(case.base, case.broken), case.gates, crd_dir)
    assert [(p.obj.split("/")[0], p.field) for p in problems] == [(case.base["kind"], case.field)], \
        "\n".join(map(str, problems))
    [problem] = problems
    assert case.words in str(problem), str(problem)
    assert problem.file == str(path) and problem.message and problem.fix
    allowed_gates = case.gates if case.allowed_gates is None else case.allowed_gates
    _, problems = validate_obj(tmp_path, patched(case.base, case.allowed), allowed_gates, crd_dir)
    assert problems == [], "\n".join(map(str, problems))


def test_the_base_manifests_pass_with_every_gate_on(crd_dir, tmp_path):
    every_gate = ",".join(f"{gate}=true" for gate in DEFAULT_FEATURE_GATES)
    for base in (CLUSTER, JOB, SELECTOR_JOB):
        assert validate_obj(tmp_path, base, every_gate, crd_dir)[1] == []


# Rules the CRD says first: the API server refuses the manifest before the operator's rule can run. Each is checked on
# the operator's rules alone (check_kuberay), and the whole path is shown to name the same field.
SHADOWED = [
    ("upgradeStrategy type (CRD enum)", C, {"spec.upgradeStrategy": {"type": "Rolling"}},
     "spec.upgradeStrategy.type", "not Recreate or None", "spec.upgradeStrategy.type"),
    ("legacy policies with deletionRules (CEL)", J,
     {"spec.deletionStrategy": {"deletionRules": [RULE_SUCCEEDED], "onSuccess": {"policy": "DeleteSelf"},
                                "onFailure": {"policy": "DeleteSelf"}}},
     "spec.deletionStrategy", "mixes onSuccess/onFailure with deletionRules", "spec.deletionStrategy"),
    ("empty deletionStrategy (CEL)", J, {"spec.deletionStrategy": {}}, "spec.deletionStrategy",
     "needs both onSuccess and onFailure, or deletionRules", "spec.deletionStrategy"),
    ("one legacy policy (CEL)", J, {"spec.deletionStrategy": {"onSuccess": {"policy": "DeleteSelf"}}},
     "spec.deletionStrategy.onFailure", "is required with the legacy policies", "spec.deletionStrategy"),
    ("deletion condition with both statuses (CEL)", J, {"spec.deletionStrategy": {"deletionRules": [
        {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed"}}]}},
     "spec.deletionStrategy.deletionRules[0].condition", "exactly one of jobStatus and jobDeploymentStatus",
     "spec.deletionStrategy.deletionRules[0].condition"),
    ("negative deletion TTL (CRD minimum)", J, {"spec.deletionStrategy": {"deletionRules": [
        {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED", "ttlSeconds": -1}}]}},
     "spec.deletionStrategy.deletionRules[0].condition.ttlSeconds", "must not be negative",
     "spec.deletionStrategy.deletionRules[0].condition.ttlSeconds"),
    ("preRunningDeadlineSeconds not positive (CRD minimum)", J, {"spec.preRunningDeadlineSeconds": 0},
     "spec.preRunningDeadlineSeconds", "must be a positive integer", "spec.preRunningDeadlineSeconds"),
]


@pytest.mark.parametrize("case,base,broken,field,words,schema_field", SHADOWED, ids=[c[0] for c in SHADOWED])
def test_rules_the_crd_says_first(crd_dir, tmp_path, case, base, broken, field, words, schema_field):
    obj = patched(base, broken)
    problems = check_kuberay(Doc("m.yaml", obj), FeatureGates())
    assert [p.field for p in problems] == [field] and words in str(problems[0]), "\n".join(map(str, problems))
    _, problems = validate_obj(tmp_path, obj, "", crd_dir)
    assert [p.field for p in problems] == [schema_field], "\n".join(map(str, problems))
    assert check_kuberay(Doc("m.yaml", base), FeatureGates()) == []


# ----------------------------------------------------------------------------------------------------------
# feature gates and versions as KubeRay reads them


@pytest.mark.parametrize("flag,gate,expected", [
    ("", "RayClusterNetworkPolicy", False),
    ("", "RayJobDeletionPolicy", True),
    ("RayClusterNetworkPolicy=true", "RayClusterNetworkPolicy", True),
    (" RayClusterMTLS = T ,RayJobDeletionPolicy=0", "RayJobDeletionPolicy", False),
    ("RayClusterMTLS=1,", "RayClusterMTLS", True),
    ("AllAlpha=true", "RayClusterHistoryServer", True),
    ("AllAlpha=true", "RayJobDeletionPolicy", True),
    ("AllBeta=false", "RayJobDeletionPolicy", False),
    ("AllAlpha=true,RayClusterMTLS=false", "RayClusterMTLS", False),
])
def test_feature_gates_parse_as_the_operator_does(flag, gate, expected):
    assert FeatureGates.parse(flag).enabled(gate) is expected


@pytest.mark.parametrize("flag,words", [
    ("RayClusterNetworkPolicy", "missing bool value for RayClusterNetworkPolicy"),
    ("RayClusterNetworkPolicy=yes", "invalid value of RayClusterNetworkPolicy=yes"),
    ("RayClusterNetworkPolicies=true", "unrecognized feature gate: RayClusterNetworkPolicies"),
])
def test_bad_feature_gates_are_refused(flag, words):
    with pytest.raises(FeatureGateError, match=re.escape(words)):
        FeatureGates.parse(flag)


def test_cli_names_the_flag_of_a_bad_gate(raytrain, tmp_path):
    result = raytrain("validate", "--feature-gates", "Nope=true", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "argument --feature-gates: unrecognized feature gate: Nope" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_passes_the_gates_to_the_rules(raytrain, crd_dir, tmp_path):
    path = tmp_path / "rc.yaml"
    path.write_text(yaml.safe_dump(patched(CLUSTER, {"spec.networkPolicy": {}})))
    base = ["validate", "--crds", str(crd_dir), str(path)]
    off = raytrain(*base)
    assert off.returncode == 1 and "RayClusterNetworkPolicy" in off.stderr, off.stderr
    on = raytrain(*base, "--feature-gates", "RayClusterNetworkPolicy=true")
    assert on.returncode == 0, on.stderr


@pytest.mark.parametrize("text,expected", [
    ("2.52.0", (2, 52, 0)), ("v2.52", (2, 52)), (" 2.53.0rc1", (2, 53, 0)), ("2.60.0-gpu", (2, 60, 0)),
    ("2", None), ("latest", None), ("02.1", None), ("", None),
])
def test_ray_versions_parse_as_kuberay_parses_them(text, expected):
    assert parse_generic_version(text) == expected


def test_cel_reads_a_null_field_as_absent_as_the_api_server_does(crd_dir):
    assert check_cel(Doc("m.yaml", patched(CLUSTER, {"spec.managedBy": None})), crd_dir) == []
    job = patched(JOB, {"spec.deletionStrategy": {"onSuccess": {"policy": "DeleteSelf"}, "onFailure": None,
                                                  "deletionRules": None}})
    assert [(p.field, p.message.split(",")[0]) for p in check_cel(Doc("m.yaml", job), crd_dir)] == [
        ("spec.deletionStrategy", "deletionStrategy requires either BOTH onSuccess and onFailure")]


def test_unset_replica_bounds_take_the_crd_defaults_so_the_operator_rule_never_fires(crd_dir, tmp_path):
    """The API server applies the CRD's defaults (minReplicas 0, maxReplicas 2147483647) before the operator reads
    the object, so the operator's 'must set both' rule sees both set: the manifest is valid."""
    obj = patched(C, {f"{W0}.minReplicas": DELETE})
    assert [p.field for p in check_kuberay(Doc("m.yaml", obj), FeatureGates())] == [W0]
    _, problems = validate_obj(tmp_path, obj, "", crd_dir)
    assert [p for p in problems if p.is_error] == []
