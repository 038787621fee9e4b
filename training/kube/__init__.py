"""Kubernetes-side tooling: render the Helm chart (helm-python-sdk), validate charts and manifests
against the Kubernetes and KubeRay schemas plus raytrain's own rules (`raytrain validate`)."""
