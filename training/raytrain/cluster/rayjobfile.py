"""A RayJob's file as KubeRay and kubelet read it, for `raytrain emulate`: the RayJob and the Secrets and ConfigMaps
beside it (or a kustomization's output), its schema check, the cluster spec it runs on (embedded, or the chart
rendered with --values for a clusterSelector job), each Ray container's environment resolved from `envFrom` and
`env` as kubelet resolves them, and the ConfigMaps the submitter pod mounts written out as the runtime env's files."""

from __future__ import annotations

import base64
import binascii
import copy
import re
import secrets
import string
from dataclasses import dataclass, field
from pathlib import Path


from raytrain.spec import yamlfile
from raytrain.validator.kustomize import KustomizeError, is_kustomization, kustomize_build
from raytrain.validator.problems import Doc
from raytrain.validator.validate import check_ray_schema, target_cluster


class RayJobError(Exception):
    """The RayJob cannot be emulated as written; the message names the file, the field and the fix."""



@dataclass
class JobInput:
    path: Path
    rayjob: dict
    configmaps: dict[str, dict]
    others: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.rayjob["metadata"]["name"])

    @property
    def spec(self) -> dict:
        return self.rayjob["spec"]


def load_rayjob(path: Path) -> JobInput:
    """The one RayJob of a multi-document file (or of a kustomization directory, as `kubectl apply -k` would
    apply it), plus its ConfigMaps."""
    try:  # the strict reader `raytrain validate` uses: UTF-8, no key twice, bounded depth
        if is_kustomization(path):
            docs = yamlfile.load_all(kustomize_build(path), f"{path} (kubectl kustomize)")
        else:
            docs = yamlfile.read_all(Path(path))
        docs = [d for d in docs if d is not None]
    except (KustomizeError, yamlfile.YAMLFileError) as err:
        raise RayJobError(str(err)) from None
    except OSError as err:
        raise RayJobError(f"{path}: cannot be read ({err.strerror}). Fix: check the path") from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "RayJob"]
    if len(jobs) != 1:
        raise RayJobError(f"{path}: holds {len(jobs)} RayJob objects; emulate runs exactly one. "
                          "Fix: keep one RayJob (and its ConfigMaps) per file")
    job = jobs[0]
    if not isinstance(job.get("metadata"), dict) or not job["metadata"].get("name"):
        raise RayJobError(f"{path}: RayJob: metadata.name is missing. Fix: name the RayJob")
    if not isinstance(job.get("spec"), dict) or not str(job["spec"].get("entrypoint") or "").strip():
        raise RayJobError(f"{path}: RayJob/{job['metadata']['name']}: spec.entrypoint is missing. "
                          "Fix: set the command the job runs on the head, e.g. `raytrain run job.yaml ...`")
    configmaps = {d["metadata"]["name"]: d for d in docs
                  if isinstance(d, dict) and d.get("kind") == "ConfigMap" and (d.get("metadata") or {}).get("name")}
    others = [d for d in docs if d is not job and d not in configmaps.values()]
    return JobInput(Path(path), job, configmaps, others)


def check_schema(job: JobInput, crd_dir: Path) -> list[str]:
    """What the API server would reject: the RayJob against the KubeRay v1.7.0 CRD schema."""
    return [str(p) for p in check_ray_schema(Doc(str(job.path), job.rayjob), Path(crd_dir))]


def cluster_spec(job: JobInput, values_path: Path | None) -> tuple[dict, str, bool]:
    """(RayCluster spec, its name, whether the RayJob owns it) for the job's cluster."""
    spec = job.spec
    if spec.get("rayClusterSpec"):
        return spec["rayClusterSpec"], f"{job.name}-raycluster", True
    selector = spec.get("clusterSelector") or {}
    name = selector.get("ray.io/cluster")
    if not name:
        raise RayJobError(f"{job.path}: RayJob/{job.name}: spec has neither rayClusterSpec nor "
                          "clusterSelector['ray.io/cluster']. Fix: embed a rayClusterSpec or select a RayCluster")
    for doc in job.others:
        if isinstance(doc, dict) and doc.get("kind") == "RayCluster" and doc["metadata"].get("name") == name:
            return doc["spec"], name, False
    docs, problems = target_cluster(name, [], values_path, None)
    if problems:
        raise RayJobError("; ".join(str(p) for p in problems))
    for doc in docs:
        if doc.kind == "RayCluster" and doc.name == name:
            return doc.obj["spec"], name, False
    raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.clusterSelector selects RayCluster {name!r}, which the "
                      f"chart does not render{f' with {values_path}' if values_path else ''}. Fix: pass the chart "
                      "values the cluster was installed with (--values), or select the release's RayCluster name")


# What kubelet takes from an envFrom source: keys that are C identifiers (it skips others with an event; Kubernetes
# >= 1.30 also allows any printable name, which a shell cannot read: the same keys are kept here as there by the
# older rule, the one every Ray image's shell handles).
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _source_data(job: JobInput, kind: str, name: str) -> dict[str, str] | None:
    """The data of the Secret or ConfigMap `name` in the RayJob's file, as strings (a Secret's `data` decoded from
    base64, its `stringData` over it, as the API server merges them); None when the file has no such object."""
    if kind == "ConfigMap":
        doc = job.configmaps.get(name)
    else:
        doc = next((d for d in job.others if isinstance(d, dict) and d.get("kind") == kind
                    and (d.get("metadata") or {}).get("name") == name), None)
    if doc is None:
        return None
    data: dict[str, str] = {}
    for key, value in (doc.get("data") or {}).items():
        if kind == "Secret":
            try:
                data[str(key)] = base64.b64decode(str(value), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise RayJobError(f"{job.path}: Secret/{name}: data.{key} is not base64 of UTF-8 text. Fix: encode it "
                                  "with base64, or give it as plain text under stringData") from None
        else:
            data[str(key)] = str(value)
    if kind == "Secret":
        data.update({str(k): str(v) for k, v in (doc.get("stringData") or {}).items()})
    return data


def container_env(job: JobInput, container: dict, where: str) -> list[dict]:
    """The container's environment as kubelet builds it (kubelet_pods.go makeEnvironmentVariables): every envFrom
    source in order, then env, a later name replacing an earlier one; as literal {name, value} entries. fieldRef and
    resourceFieldRef entries are left out (nothing here has a pod's fields)."""
    def missing(kind: str, name: str, field_name: str) -> RayJobError:
        return RayJobError(f"{job.path}: RayJob/{job.name}: {field_name} takes the environment from {kind} {name!r}, "
                           f"which the file does not hold: kubelet would keep the pod in CreateContainerConfigError. "
                           f"Fix: add the {kind} to the same file (emulate has no API server to read it from), e.g. "
                           f"`kubectl create {'secret generic' if kind == 'Secret' else 'configmap'} {name} --from-literal=KEY=VALUE --dry-run=client "
                           "-o yaml`, or mark the reference optional: true")

    out: list[dict] = []
    for i, source in enumerate(container.get("envFrom") or []):
        for kind, ref_key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
            ref = (source or {}).get(ref_key)
            if not isinstance(ref, dict):
                continue
            data = _source_data(job, kind, str(ref.get("name")))
            if data is None:
                if ref.get("optional"):
                    continue
                raise missing(kind, str(ref.get("name")), f"{where}.envFrom[{i}].{ref_key}")
            prefix = str(source.get("prefix") or "")
            out += [{"name": prefix + key, "value": value} for key, value in data.items()
                    if _ENV_NAME.match(prefix + key)]
    for i, entry in enumerate(container.get("env") or []):
        if not isinstance(entry, dict) or "name" not in entry:
            continue
        if "value" in entry or "valueFrom" not in entry:
            out.append({"name": entry["name"], "value": str(entry.get("value", ""))})
            continue
        value_from = entry.get("valueFrom") or {}
        for kind, ref_key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            ref = value_from.get(ref_key)
            if not isinstance(ref, dict):
                continue
            field_name = f"{where}.env[{i}].valueFrom.{ref_key}"
            data = _source_data(job, kind, str(ref.get("name")))
            if data is None:
                if ref.get("optional"):
                    break
                raise missing(kind, str(ref.get("name")), field_name)
            if ref.get("key") not in data:
                if ref.get("optional"):
                    break
                raise RayJobError(f"{job.path}: RayJob/{job.name}: {field_name}: {kind} {ref.get('name')!r} has no "
                                  f"key {ref.get('key')!r} (it has: {', '.join(sorted(data)) or 'none'}): kubelet "
                                  f"would keep the pod in CreateContainerConfigError. Fix: add the key, or correct "
                                  "the reference")
            out.append({"name": entry["name"], "value": data[ref["key"]]})
    return out


def resolve_env(job: JobInput, spec: dict, where: str) -> dict:
    """A copy of a RayCluster spec whose Ray containers (the first of each group) carry their environment as literal
    values (container_env), so that every node starts with what its pod's container would have."""
    spec = copy.deepcopy(spec)
    groups = [("headGroupSpec", spec.get("headGroupSpec"))]
    groups += [(f"workerGroupSpecs[{i}]", g) for i, g in enumerate(spec.get("workerGroupSpecs") or [])]
    for path, group in groups:
        containers = ((group or {}).get("template") or {}).get("spec", {}).get("containers") or []
        if containers and isinstance(containers[0], dict):
            containers[0]["env"] = container_env(job, containers[0], f"{where}.{path}.template.spec.containers[0]")
            containers[0].pop("envFrom", None)
    return spec


def submitter_mounts(job: JobInput) -> dict[str, tuple[str, dict]]:
    """mountPath -> (ConfigMap name, volume) for the ConfigMap volumes of the submitter pod's first container."""
    template = job.spec.get("submitterPodTemplate") or {}
    pod = template.get("spec") or {}
    volumes = {v.get("name"): v for v in pod.get("volumes") or [] if isinstance(v, dict)}
    containers = pod.get("containers") or [{}]
    mounts = {}
    for mount in containers[0].get("volumeMounts") or []:
        volume = volumes.get(mount.get("name"))
        if volume and "configMap" in volume:
            mounts[mount["mountPath"].rstrip("/") or "/"] = (volume["configMap"].get("name"), volume["configMap"])
    return mounts


def materialise_configmaps(job: JobInput, dest: Path) -> dict[str, Path]:
    """Write every ConfigMap the submitter mounts into dest; returns mountPath -> local directory."""
    result = {}
    for i, (mount_path, (cm_name, source)) in enumerate(sorted(submitter_mounts(job).items())):
        configmap = job.configmaps.get(cm_name)
        if configmap is None:
            if source.get("optional"):
                continue
            raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.submitterPodTemplate mounts ConfigMap "
                              f"{cm_name!r} at {mount_path}, but the file has no such ConfigMap. Fix: add the "
                              "ConfigMap to the same file (emulate has no API server to fetch it from)")
        data = {**(configmap.get("data") or {})}
        items = source.get("items")
        files = {item["path"]: data[item["key"]] for item in items if item["key"] in data} if items else data
        local = dest / f"cm{i}"
        for rel, text in files.items():
            target = local / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(str(text))
        local.mkdir(parents=True, exist_ok=True)
        result[mount_path] = local
    return result


def local_runtime_env(job: JobInput, mounts: dict[str, Path]) -> dict:
    """runtimeEnvYAML with submitter-side paths (working_dir, py_modules) mapped onto the materialised mounts."""
    text = job.spec.get("runtimeEnvYAML")
    if not text:
        return {}
    try:
        env = yamlfile.load(str(text), "spec.runtimeEnvYAML") or {}
    except yamlfile.YAMLFileError as err:
        raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.runtimeEnvYAML is not valid YAML ({err.message}). "
                          "Fix: write it as a YAML block, e.g. `runtimeEnvYAML: |` then `working_dir: ...`") from None
    if not isinstance(env, dict):
        raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.runtimeEnvYAML must be a mapping (working_dir, "
                          "pip, env_vars, ...). Fix: write `key: value` lines")

    def local(path: str, key: str) -> str:
        if "://" in path:  # a remote URI (gs://, https://...) is fetched by Ray itself
            return path
        for mount_path, directory in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if path == mount_path or path.startswith(mount_path + "/"):
                return str(directory / path[len(mount_path):].lstrip("/"))
        if Path(path).exists():
            return path
        raise RayJobError(f"{job.path}: RayJob/{job.name}: spec.runtimeEnvYAML {key} {path} is not mounted into "
                          f"the submitter pod (mounted: {sorted(mounts) or 'nothing'}). Fix: mount the ConfigMap "
                          "there with spec.submitterPodTemplate volumes and volumeMounts")

    if isinstance(env.get("working_dir"), str):
        env["working_dir"] = local(env["working_dir"], "working_dir")
    if isinstance(env.get("py_modules"), list):
        env["py_modules"] = [local(p, "py_modules") if isinstance(p, str) else p for p in env["py_modules"]]
    return env


def new_job_id(job: JobInput) -> str:
    """KubeRay's JobId: spec.jobId, else the RayJob's name and 5 random lowercase letters or digits."""
    if job.spec.get("jobId"):
        return str(job.spec["jobId"])
    alphabet = string.ascii_lowercase + string.digits
    return f"{job.name}-{''.join(secrets.choice(alphabet) for _ in range(5))}"
