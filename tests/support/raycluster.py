"""Small RayCluster pieces the Kubernetes-side tests build specs from."""

from __future__ import annotations


def group(cpu="1", memory="2Gi", params=None, replicas=None, name="worker", **extra):
    """A RayCluster group whose Ray container has these limits."""
    spec = {"groupName": name, "rayStartParams": params or {},
            "template": {"spec": {"containers": [{"name": "ray", "resources": {"limits": {"cpu": cpu, "memory": memory}}}]}},
            **extra}
    if replicas is not None:
        spec["replicas"] = replicas
    return spec
