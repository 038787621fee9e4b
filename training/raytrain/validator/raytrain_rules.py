"""raytrain's own checks of a manifest set: a RayJob whose entrypoint runs `raytrain run` is read as `raytrain run`
will read it (its options, its run config from a preset or a mounted ConfigMap) and checked against the cluster it
runs on: the storage path is on a volume every pod shares, the workers fit the cluster's nodes, and the submitter
pod reaches the dashboard through the cluster's NetworkPolicy. KubeRay's own admission rules are elsewhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raytrain.errors import LaunchError
from raytrain.rundir.storage import url_problem, url_scheme
from raytrain.spec import yamlfile
from raytrain.spec.config import ConfigError, load_config
from raytrain.spec.run_options import (
    add_address_option,
    add_config_options,
    add_lease_option,
    config_overrides,
    override_origin,
)
from raytrain.spec.sizing import size_workers, workers_that_fit  # the sizing `raytrain run` does
from raytrain.validator.problems import Doc, Problem, split_fix
from raytrain.validator.quantity import QuantityError
from raytrain.validator.shape import ShapeError, get, groups, node_resources, shared_mounts

DASHBOARD_PORT = 8265


# ----------------------------------------------------------------------------------------------------------
# the images against rayVersion


def check_ray_images(doc: Doc) -> list[Problem]:
    """raytrain: every group's image carries the Ray that rayVersion announces (KubeRay acts on rayVersion)."""
    out: list[Problem] = []
    if doc.kind == "RayCluster":
        spec, prefix = doc.obj.get("spec") or {}, "spec"
    else:
        spec, prefix = get(doc.obj, "spec", "rayClusterSpec", default={}), "spec.rayClusterSpec"
    for path, _, group in groups(spec, prefix):
        for i, container in enumerate(get(group, "template", "spec", "containers", default=[])):
            out += check_image_version(doc, f"{path}.template.spec.containers[{i}].image", container.get("image"),
                                       spec.get("rayVersion"))
    return out


# The name scripts/build-image gives a local build: no registry publishes it, so a pod naming it starts only where
# the image was loaded by hand (kind: scripts/build-image --kind-load); anywhere else it is ImagePullBackOff.
LOCAL_BUILD_IMAGE = "ghcr.io/raytrain/raytrain"


def check_local_build_image(doc: Doc) -> list[Problem]:
    """A RayJob (submitter, embedded cluster) that still names the local build's image: said once, as a note, since
    on kind it is what runs."""
    if doc.kind != "RayJob":
        return []
    fields = []
    spec = doc.obj.get("spec") or {}
    for i, container in enumerate(get(spec, "submitterPodTemplate", "spec", "containers", default=[])):
        fields.append((f"spec.submitterPodTemplate.spec.containers[{i}].image", container.get("image")))
    for path, _, group in groups(get(spec, "rayClusterSpec", default={}), "spec.rayClusterSpec"):
        for i, container in enumerate(get(group, "template", "spec", "containers", default=[])):
            fields.append((f"{path}.template.spec.containers[{i}].image", container.get("image")))
    local = [field for field, image in fields if str(image or "").rsplit(":", 1)[0] == LOCAL_BUILD_IMAGE]
    if not local:
        return []
    return [doc.problem(local[0], f"names {LOCAL_BUILD_IMAGE}, the local build's name that no registry publishes "
                        f"({len(local)} container(s)): only a cluster you loaded it into (kind: scripts/build-image "
                        "--kind-load) can start these pods, any other stays in ImagePullBackOff.",
                        "push your image (IMAGE=registry.example.com/you/raytrain scripts/build-image --push) and "
                        f"name it with kustomize: a kustomization.yaml beside the manifest with `images: [{{name: "
                        f"{LOCAL_BUILD_IMAGE}, newName: registry.example.com/you/raytrain}}]`, then kubectl apply -k "
                        "(docs/get-started/first-cluster.md)", severity="note")]


def image_ray_version(image: Any) -> str | None:
    """The Ray version an image tag names: raytrain's '<version>-ray2.60.0[-gpu]' or rayproject/ray:2.60.0[-...]."""
    image = str(image or "")
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    match = re.search(r"(?:^|-)ray(\d+\.\d+\.\d+)", tag)
    if match:
        return match.group(1)
    if re.search(r"(^|/)(rayproject|anyscale)/ray(-ml|-llm)?$", name):
        match = re.match(r"^(\d+\.\d+\.\d+)", tag)
        return match.group(1) if match else None
    return None


def check_image_version(doc: Doc, field: str, image: Any, ray_version: Any) -> list[Problem]:
    in_image = image_ray_version(image)
    if in_image and ray_version and in_image != str(ray_version):
        return [doc.problem(field, f"image {image} runs Ray {in_image} but rayVersion is {ray_version}.",
                            f"use the image built for Ray {ray_version}, or set rayVersion: \"{in_image}\"")]
    return []


# ----------------------------------------------------------------------------------------------------------
# the grace period against the preStop drain

# `raytrain drain`'s default --wait (cli.py add_drain_command), and what the API server stores for a negative
# terminationGracePeriodSeconds: 1 s (it has turned negative grace periods into 1 since Kubernetes 1.22, for a pod
# and for the pod templates it creates pods from).
DRAIN_WAIT_S = 50.0
NEGATIVE_GRACE_STORED_S = 1
KUBERNETES_GRACE_S = 30  # a pod's terminationGracePeriodSeconds when it gives none


def drain_wait(command: Any) -> float | None:
    """The --wait of a preStop `raytrain drain` hook; None when the hook runs something else."""
    words = [str(w) for w in command] if isinstance(command, list) else []
    for i, word in enumerate(words[:-1]):
        if Path(word).name == "raytrain" and words[i + 1] == "drain":
            rest, wait = words[i + 2:], DRAIN_WAIT_S
            for j, arg in enumerate(rest):
                value = arg.partition("=")[2] if arg.startswith("--wait=") else (
                    rest[j + 1] if arg == "--wait" and j + 1 < len(rest) else None)
                if value is not None:
                    try:
                        wait = float(value)
                    except ValueError:
                        return None  # `raytrain drain` refuses it at its start: not a grace-period question
            return wait
    return None


def check_grace_periods(doc: Doc) -> list[Problem]:
    """raytrain: every Ray group's pods stop within their grace period what raytrain does on a deletion: the preStop
    drain (`raytrain drain --wait W` needs more than W seconds, as the chart's preStopDrain.marginSeconds rule says
    for its values) and a run's checkpoint on SIGTERM. A negative terminationGracePeriodSeconds passes the API
    server, which stores 1 s: kubelet kills the pod a second after its deletion, and the 'no step lost' drain is cut
    off without a word."""
    if doc.kind == "RayCluster":
        spec, prefix = doc.obj.get("spec") or {}, "spec"
    else:
        spec, prefix = get(doc.obj, "spec", "rayClusterSpec", default={}), "spec.rayClusterSpec"
    out: list[Problem] = []
    for path, name, group in groups(spec if isinstance(spec, dict) else {}, prefix):
        grace = get(group, "template", "spec", "terminationGracePeriodSeconds", default=KUBERNETES_GRACE_S)
        if not isinstance(grace, int) or isinstance(grace, bool):
            continue
        wait = drain_wait(get(group, "template", "spec", "containers", 0, "lifecycle", "preStop", "exec", "command"))
        field = f"{path}.template.spec.terminationGracePeriodSeconds"
        if grace < 0:
            cut = (f"the preStop `raytrain drain --wait {wait:g}`" if wait is not None
                   else "a run's checkpoint on SIGTERM (raytrain stops within 20 s)")
            out.append(doc.problem(field, f"is {grace} in group {name}: the API server accepts a negative grace period "
                                   f"and stores {NEGATIVE_GRACE_STORED_S} s, so kubelet kills these pods a second "
                                   f"after their deletion, cutting off {cut}: a step is lost on every pod deletion.",
                                   f"use {int(wait) + 10 if wait is not None else 60} or more (the chart's 60 with its "
                                   "preStop drain of 50), or leave it out for Kubernetes' 30"))
        elif wait is not None and grace <= wait:
            out.append(doc.problem(field, f"is {grace} in group {name}, not above its preStop `raytrain drain --wait "
                                   f"{wait:g}`: the hook's time counts against the grace period, so kubelet kills the "
                                   "pod before the drain has ended and `ray start` has stopped.",
                                   f"raise it to {int(wait) + 10} or more, or lower --wait to {max(grace - 10, 1)} or "
                                   "less (the chart keeps preStopDrain.marginSeconds: 10 between them)"))
    return out


# ----------------------------------------------------------------------------------------------------------
# reading a RayJob as raytrain runs it


@dataclasses.dataclass
class RaytrainRun:
    """`raytrain run CONFIG [--set k=v]... [--name N] [--storage P] [--address A] [--smoke-test]`."""

    config: str
    overrides: list[str]
    name: str | None
    storage: str | None
    address: str | None
    smoke_test: bool


class EntrypointError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage and exit
        raise EntrypointError(message)


def parse_entrypoint(entrypoint: Any) -> RaytrainRun | None:
    """The `raytrain run` command of a RayJob entrypoint; None when the entrypoint runs something else."""
    try:
        # punctuation_chars: "auto; echo" and "a&&b" split at the shell operators, as the shell would.
        lexer = shlex.shlex(str(entrypoint or ""), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError as exc:
        raise EntrypointError(f"cannot be split into words ({exc})") from exc
    for i, token in enumerate(tokens[:-1]):
        if Path(token).name == "raytrain" and tokens[i + 1] == "run":
            args = []
            for word in tokens[i + 2:]:
                if word and set(word) <= set("&|;()<>"):
                    break
                args.append(word)
            parser = _Parser(prog="raytrain run", add_help=False)
            add_config_options(parser)  # the same declarations as the CLI's `raytrain run`
            add_address_option(parser)
            add_lease_option(parser)
            ns = parser.parse_args(args)
            return RaytrainRun(ns.config, ns.set or [], ns.name, ns.storage, ns.address, ns.smoke_test)
    return None


@dataclasses.dataclass
class RunConfigSource:
    doc: Doc  # the ConfigMap holding the file, or the RayJob for a preset
    field: str
    text: str | None  # None: a preset shipped in the image
    ref: str


def resolve_run_config(job: Doc, run: RaytrainRun, docs: list[Doc]) -> tuple[RunConfigSource | None, list[Problem]]:
    """Where CONFIG comes from: a preset, or a file that `ray job submit` uploads from the runtime env's working_dir,
    which the submitter pod has from a ConfigMap. (None, []) when it cannot be known offline (absolute or remote)."""
    ref = run.config
    if "/" not in ref and not ref.endswith((".yaml", ".yml")):
        return RunConfigSource(job, "spec.entrypoint", None, ref), []
    if ref.startswith("/"):
        return None, []  # a file already on the head pod's disk
    spec = job.obj.get("spec") or {}
    try:
        working_dir = (yamlfile.load(str(spec.get("runtimeEnvYAML") or ""), "spec.runtimeEnvYAML") or {}).get("working_dir")
    except (yamlfile.YAMLFileError, AttributeError):
        return None, []  # reported by check_job_spec
    if not working_dir:
        return None, [job.problem("spec.runtimeEnvYAML", f"has no working_dir, so the entrypoint's '{ref}' does not "
                                  "reach the head pod.", "add 'working_dir: /etc/raytrain-job' and mount the run "
                                  "config's ConfigMap there in the submitterPodTemplate")]
    if "://" in str(working_dir):
        return None, []  # a remote package: not in this manifest set
    pod = get(spec, "submitterPodTemplate", "spec", default={})
    container = get(pod, "containers", 0, default={})
    mount = next((m for m in container.get("volumeMounts") or [] if m.get("mountPath") == working_dir), None)
    volume = next((v for v in pod.get("volumes") or [] if mount and v.get("name") == mount.get("name")), None)
    cm_name = get(volume, "configMap", "name")
    if not cm_name:
        return None, [job.problem("spec.submitterPodTemplate", f"mounts no ConfigMap at the runtime env's working_dir "
                                  f"{working_dir}, so `ray job submit` uploads no '{ref}'.", f"mount the ConfigMap "
                                  f"holding {ref} at {working_dir} in the first container")]
    items = {i.get("path"): i.get("key") for i in get(volume, "configMap", "items", default=[])}
    key = items.get(ref, ref) if items else ref
    cm = next((d for d in docs if d.kind == "ConfigMap" and d.name == cm_name), None)
    if cm is None:
        return None, [job.problem("spec.submitterPodTemplate.spec.volumes", f"ConfigMap {cm_name} with the run "
                                  "config is not in this manifest set, so it cannot be checked.",
                                  "put the ConfigMap in the same file or directory as the RayJob")]
    text = get(cm.obj, "data", key)
    if text is None:
        return None, [cm.problem(f"data.{key}", f"is missing; the RayJob {job.name} runs `raytrain run {ref}`.",
                                 f"add the run config under the key '{key}'")]
    return RunConfigSource(cm, f"data.{key}", str(text), ref), []


def load_run_config(source: RunConfigSource, run: RaytrainRun, job: Doc | None = None) -> tuple[Any, list[Problem]]:
    """raytrain.spec.config.load_config on the ConfigMap's text (or the preset) with the entrypoint's overrides, built as
    `raytrain run` builds them (--set, --name, --storage), without the user's code: components named by the user's
    import paths give a note, not an error. A key the entrypoint overrides is blamed on the entrypoint, any other on
    the run config."""

    try:
        overrides = config_overrides(run.overrides, run.name, run.storage)
    except ConfigError as exc:  # --storage '' or --name '': refused by `raytrain run` before any config is read
        message, fix = split_fix(str(exc))
        doc, field = (job, "spec.entrypoint") if job is not None else (source.doc, source.field)
        return None, [doc.problem(field, f"`raytrain run` would be refused: {message}", fix)]
    with tempfile.TemporaryDirectory(prefix="raytrain-validate-") as tmp:
        ref = source.ref
        if source.text is not None:
            path = Path(tmp) / Path(source.ref).name
            path.write_text(source.text)
            ref = str(path)
        try:
            # The user's modules are not here (they reach the cluster with the job): their components' keys are
            # theirs, checked when `raytrain run` starts; everything else is checked now.
            cfg = load_config(ref, overrides, smoke=run.smoke_test, import_user_code=False)
        except ConfigError as exc:
            text = str(exc)
            overridden = [o for o in overrides if text.startswith(f"{override_origin(o)}: ")]
            if overridden and job is not None:
                origin = override_origin(overridden[0])
                message, fix = split_fix(text[len(origin) + 2:])
                return None, [job.problem("spec.entrypoint", f"`raytrain run ... {origin}` would be refused: "
                                          f"{message}", fix)]
            message, fix = split_fix(text.replace(ref, f"{source.ref} ({source.doc.ref} {source.field})"))
            return None, [source.doc.problem(source.field, message, fix)]
    unchecked = list(cfg.unchecked)
    if not cfg.loss.path.startswith(("raytrain.", "torch.")):  # a loss of the user's own (torch's are known)
        unchecked.append(f"train.loss: {cfg.loss.path}")
    return cfg, [_unchecked_note(source, unchecked)] if unchecked else []


def _unchecked_note(source: RunConfigSource, unchecked: list[str]) -> Problem:
    # `raytrain local` refuses a Ray Train function (raytrain.worker.raytrain_function): not offered for one
    local = "" if any("a Ray Train function" in entry for entry in unchecked) else " (or `raytrain local`)"
    return source.doc.problem(source.field, f"names your own code ({'; '.join(unchecked)}): its keyword arguments "
                              "are yours, so they are checked when `raytrain run` starts on the cluster, where the "
                              "job's working_dir (or the image) provides the modules.", "nothing to do; to check them "
                              f"now, run `raytrain run {source.ref} --smoke-test`{local} in your "
                              "project's directory", severity="note")


# ----------------------------------------------------------------------------------------------------------
# raytrain's cross-checks


def cross_check(docs: list[Doc], target: Callable[[str], tuple[list[Doc], list[Problem]]]) -> list[Problem]:
    """Every RayJob of a manifest set that runs `raytrain run`, against its run config and its cluster."""
    out: list[Problem] = []
    for job in (d for d in docs if d.kind == "RayJob"):
        spec = job.obj.get("spec") or {}
        try:
            run = parse_entrypoint(spec.get("entrypoint"))
        except EntrypointError as exc:
            out.append(job.problem("spec.entrypoint", f"is not a valid `raytrain run` command: {exc}.",
                                   "raytrain run CONFIG [--set k=v]... --name NAME --storage /mnt/shared/runs --address auto"))
            continue
        if run is None:
            continue  # not raytrain: the KubeRay rules above are all that applies
        if run.address != "auto":
            out.append(job.problem("spec.entrypoint", f"runs `raytrain run` with --address {run.address or 'unset'}: "
                                   "it would train on an embedded Ray inside the head pod, not on the cluster.",
                                   "add --address auto"))
        if not run.name:
            out.append(job.problem("spec.entrypoint", "runs `raytrain run` without --name, so a retried or resubmitted "
                                   "job cannot find its checkpoints.", "add a fixed --name, e.g. --name linear-1"))
        cluster_docs, cluster_problems = _job_cluster(job, docs, target)
        out += cluster_problems
        cluster = next((d for d in cluster_docs if d.kind == "RayCluster"), None)
        if cluster is not None and not spec.get("rayClusterSpec"):
            out += _check_submitter(job, spec, cluster, cluster_docs)
        source, problems = resolve_run_config(job, run, docs)
        out += problems
        if source is None:
            continue
        cfg, problems = load_run_config(source, run, job)
        out += problems
        if cfg is None or cluster is None:
            continue
        cluster_spec = spec.get("rayClusterSpec") or cluster.obj.get("spec") or {}
        out += _check_storage(job, run.storage or cfg.run.storage_path, cluster, cluster_spec)
        out += _check_fit(job, source, cfg, cluster, cluster_spec)
    return out


def _job_cluster(job: Doc, docs: list[Doc], target: Callable) -> tuple[list[Doc], list[Problem]]:
    spec = job.obj.get("spec") or {}
    if isinstance(spec.get("rayClusterSpec"), dict):
        # The embedded cluster, under the RayJob's own name for messages.
        return [type(job)(job.source, {"kind": "RayCluster", "metadata": {"name": f"{job.name} (rayClusterSpec)"},
                                       "spec": spec["rayClusterSpec"]})], []
    name = get(spec, "clusterSelector", "ray.io/cluster")
    if not name:
        return [], []
    cluster_docs, problems = target(str(name))
    if problems:
        return [], [job.problem("spec.clusterSelector", f"its RayCluster {name} cannot be rendered from the chart: "
                                f"{p.message}", p.fix) for p in problems]
    matching = [d for d in cluster_docs if d.kind == "RayCluster" and d.name == name]
    others = [d for d in cluster_docs if d.kind != "RayCluster"]
    return matching + others, []


def _check_submitter(job: Doc, spec: dict, cluster: Doc, cluster_docs: list[Doc]) -> list[Problem]:
    out: list[Problem] = []
    ray_version = get(cluster.obj, "spec", "rayVersion")
    template = spec.get("submitterPodTemplate") or {}
    for i, container in enumerate(get(template, "spec", "containers", default=[])):
        out += check_image_version(job, f"spec.submitterPodTemplate.spec.containers[{i}].image",
                                   container.get("image"), ray_version)
    labels = submitter_pod_labels(job.name, get(template, "metadata", "labels", default={}))
    for policy in cluster_docs:
        if policy.kind != "NetworkPolicy" or not _selects(policy, {"ray.io/cluster": cluster.name}):
            continue
        if not _admits(policy, labels, DASHBOARD_PORT):
            out.append(job.problem("spec.submitterPodTemplate.metadata.labels", f"{policy.ref} of RayCluster "
                                   f"{cluster.name} does not admit the submitter pod to the dashboard port "
                                   f"{DASHBOARD_PORT}: `ray job submit` would time out.", "give the submitter pod the "
                                   "labels of the chart's networkPolicy.submitterPodLabels, or leave that value at "
                                   "its default (ray.io/originated-from-crd: RayJob, which KubeRay sets on every submitter)"))
    return out


def submitter_pod_labels(job_name: str, template_labels: Any) -> dict:
    """The labels a RayJob's submitter pod really has: its template's plus the three KubeRay v1.7.0 sets on every one,
    over the template's (rayjob_controller.go getSubmitterTemplate)."""
    return {**(template_labels or {}), "ray.io/originated-from-cr-name": job_name,
            "ray.io/originated-from-crd": "RayJob", "app.kubernetes.io/created-by": "kuberay-operator"}


def _selects(policy: Doc, pod_labels: dict) -> bool:
    wanted = get(policy.obj, "spec", "podSelector", "matchLabels", default={})
    return all(pod_labels.get(k) == v for k, v in wanted.items())


def _admits(policy: Doc, labels: dict, port: int) -> bool:
    if "Ingress" not in (get(policy.obj, "spec", "policyTypes", default=["Ingress"])):
        return True
    for rule in get(policy.obj, "spec", "ingress", default=[]):
        ports = [p.get("port") for p in rule.get("ports") or []]
        if ports and port not in ports:
            continue
        peers = rule.get("from")
        if not peers:
            return True
        for peer in peers:
            if "podSelector" in peer and "namespaceSelector" not in peer and "ipBlock" not in peer:
                wanted = get(peer, "podSelector", "matchLabels", default={})
                if all((labels or {}).get(k) == v for k, v in wanted.items()):
                    return True
    return False


# The RayCluster annotation the chart sets to objectStorage.url (helm/raytrain-cluster/templates/raycluster.yaml): the
# bucket whose endpoint and credentials its pods were given.
OBJECT_STORAGE_ANNOTATION = "raytrain.io/object-storage"


def _check_storage(job: Doc, storage: str, cluster: Doc, cluster_spec: dict) -> list[Problem]:

    where = f"RayCluster {cluster.name}"
    bucket_url = str(get(cluster.obj, "metadata", "annotations", OBJECT_STORAGE_ANNOTATION, default="") or "")
    if url_scheme(storage):  # an object store: every pod reaches it with the environment's credentials
        problem = url_problem(storage)
        if problem:
            return [job.problem("spec.entrypoint", f"--storage {storage}: {problem[0]}.", problem[1])]
        return _check_bucket(job, storage, bucket_url, where) + _check_local_disk(job, cluster, cluster_spec)
    mounts = shared_mounts(cluster_spec)
    bucket_fix = (f"pass --storage {bucket_url.rstrip('/')} (the bucket of the chart's objectStorage.url)" if bucket_url
                  else "pass --storage s3://BUCKET/PREFIX or gs://BUCKET/PREFIX, a bucket every pod reaches (docs/guides/"
                  "object-storage.md)")
    if not mounts:
        return [job.problem("spec.entrypoint", f"{where} mounts no persistent volume on every group, so checkpoints "
                            "cannot be shared and a retried run cannot resume.", f"{bucket_fix}; or enable the chart's "
                            "sharedStorage (or mount one ReadWriteMany volume at the same path in the head and every "
                            "worker group)")]
    if not storage.startswith("/") or not any(storage == m or storage.startswith(m.rstrip("/") + "/") for m in mounts):
        return [job.problem("spec.entrypoint", f"the storage path {storage} is not on the shared mount of {where} "
                            f"({', '.join(mounts)}): each pod would keep its own checkpoints and a retry could not "
                            "resume.", f"pass --storage {mounts[0].rstrip('/')}/runs")]
    return []


def _bucket(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def _check_bucket(job: Doc, storage: str, bucket_url: str, where: str) -> list[Problem]:
    """A job writing to another bucket than the one the chart gave the pods (endpoint, credentials) for."""
    if not bucket_url or _bucket(storage) == _bucket(bucket_url):
        return []
    return [job.problem("spec.entrypoint", f"--storage {storage} is in bucket {_bucket(storage)}, but the pods of "
                        f"{where} were set up for {bucket_url} (the chart's objectStorage.url: its endpoint and "
                        "credentials), which may not reach this one.", f"pass --storage {bucket_url.rstrip('/')} (or a "
                        "prefix under it), or install the chart with objectStorage.url in this bucket",
                        severity="warning")]


def _check_local_disk(job: Doc, cluster: Doc, cluster_spec: dict) -> list[Problem]:
    """A run in a bucket stages checkpoints and prepares datasets under each pod's TMPDIR (storage.local_root): a Ray
    container with a read-only root filesystem needs a volume there."""
    embedded = isinstance(get(job.obj, "spec", "rayClusterSpec"), dict)
    out: list[Problem] = []
    for path, name, group in groups(cluster_spec, "spec.rayClusterSpec" if embedded else "spec"):
        container = get(group, "template", "spec", "containers", 0, default={}) or {}
        if not get(container, "securityContext", "readOnlyRootFilesystem", default=False):
            continue
        env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
        tmpdir = str(env.get("TMPDIR") or "/tmp")
        mounts = [str(m.get("mountPath") or "") for m in container.get("volumeMounts") or [] if isinstance(m, dict)
                  and not m.get("readOnly")]
        if any(tmpdir == m or tmpdir.startswith(m.rstrip("/") + "/") for m in mounts):
            continue
        doc = job if embedded else cluster
        out.append(doc.problem(f"{path}.template.spec.containers[0].securityContext.readOnlyRootFilesystem",
                               f"group {name} has a read-only root filesystem and no writable volume at {tmpdir} "
                               "(TMPDIR): a run in a bucket stages each checkpoint and prepares datasets there, so "
                               "its first checkpoint would fail.", "mount an emptyDir at /tmp with room for a "
                               "checkpoint (manifests/rayjob-s3.yaml; the chart does with objectStorage.url)"))
    return out


def _check_fit(job: Doc, source: RunConfigSource, cfg: Any, cluster: Doc, cluster_spec: dict) -> list[Problem]:
    embedded = isinstance(get(job.obj, "spec", "rayClusterSpec"), dict)
    try:
        nodes = node_resources(cluster_spec, "spec.rayClusterSpec" if embedded else "spec")
    except (QuantityError, ShapeError) as exc:
        message, fix = split_fix(str(exc))
        return [(job if embedded else cluster).problem("", message, fix)]
    field = source.field if source.text is not None else "spec.entrypoint"
    try:
        per_worker = size_workers(cfg, nodes)
    except LaunchError as exc:
        message, fix = split_fix(str(exc))
        return [source.doc.problem(field, f"on RayCluster {cluster.name}: {message}", fix)]
    s = cfg.scaling
    most = workers_that_fit(nodes, per_worker)
    if s.elastic and most < s.max_workers:  # it runs, but never at its full size
        shape = ", ".join(f"{k} {v:g}" for k, v in per_worker.items())
        return [source.doc.problem(field, f"on RayCluster {cluster.name}: the elastic run grows to at most {most} of "
                                   f"its {s.max_workers} workers of {{{shape}}} (its nodes at maxReplicas hold no "
                                   f"more)", f"raise the worker groups' maxReplicas (with autoscaling on) or "
                                   f"replicas, or set scaling.num_workers to [{s.min_workers}, {max(most, s.min_workers)}]",
                                   severity="warning")]
    return []
