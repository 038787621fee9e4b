"""A kustomization directory (`kubectl apply -k DIR`) as the manifests it stands for, rendered by the user's own
kubectl (`kubectl kustomize DIR`, kustomize built in) rather than by a second implementation of kustomize here:
a RayJob that ships a project as a configMapGenerator ConfigMap is only complete once rendered."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# The names kustomize looks for, in its order (kustomize api/konfig: RecognizedKustomizationFileNames).
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
TIMEOUT_S = 60


class KustomizeError(Exception):
    """The directory could not be rendered; the message names it, the cause and the fix."""


def is_kustomization(path: Path) -> bool:
    return Path(path).is_dir() and any((Path(path) / name).is_file() for name in KUSTOMIZATION_FILES)


def kustomize_build(directory: Path, kubectl: str | None = None) -> str:
    """The YAML `kubectl apply -k DIRECTORY` would apply."""
    kubectl = kubectl or shutil.which("kubectl")
    if not kubectl:
        raise KustomizeError(f"{directory}: is a kustomization, and rendering it needs kubectl (its `kustomize` "
                             "command), which is not on PATH. Fix: install kubectl, or pass the rendered manifests "
                             f"(`kubectl kustomize {directory} > manifests.yaml`)")
    try:
        done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KustomizeError(f"{directory}: `{kubectl} kustomize` could not run ({exc}). Fix: check kubectl") from None
    if done.returncode != 0:
        reason = " ".join((done.stderr or done.stdout).split()) or f"exit status {done.returncode}"
        raise KustomizeError(f"{directory}: `kubectl kustomize` failed: {reason}. Fix: correct the kustomization "
                             "(a file it lists must exist next to it)")
    return done.stdout
