"""KubeRay v1.7.0's rules for a RayJob spec (utils/validation.go ValidateRayJobSpec)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from raytrain.spec import yamlfile
from raytrain.validator.kuberay.gates import FeatureGates, gate_off
from raytrain.validator.shape import autoscaling_enabled
from raytrain.validator.shape import get as dig

if TYPE_CHECKING:
    from raytrain.validator.problems import Doc, Problem


DELETE_POLICIES_NEEDING_CLUSTER = ("DeleteCluster", "DeleteWorkers")
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")



def check_job_spec(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    out: list[Problem] = []
    for check in JOB_CHECKS:
        out += check(doc, spec, gates)
    return out


def _shutdown(spec: dict) -> bool:
    return bool(spec.get("shutdownAfterJobFinishes"))


def _selector_mode(spec: dict) -> bool:
    return bool(spec.get("clusterSelector"))


def check_job_suspend_needs_shutdown(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: suspend needs shutdownAfterJobFinishes
    if spec.get("suspend") and not _shutdown(spec):
        return [doc.problem("spec.suspend", "a RayJob with shutdownAfterJobFinishes false cannot be suspended.",
                            "set shutdownAfterJobFinishes: true or remove suspend")]
    return []


def check_job_ttl_not_negative(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: TTLSecondsAfterFinished must be a non-negative integer
    if (spec.get("ttlSecondsAfterFinished") or 0) < 0:
        return [doc.problem("spec.ttlSecondsAfterFinished", "must not be negative.", "use 0 or more")]
    return []


def check_job_ttl_needs_shutdown(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionConfiguration: TTLSecondsAfterFinished only with shutdownAfterJobFinishes
    if (spec.get("ttlSecondsAfterFinished") or 0) > 0 and not _shutdown(spec):
        return [doc.problem("spec.ttlSecondsAfterFinished", "has no effect without shutdownAfterJobFinishes "
                            "(KubeRay rejects it).", "set shutdownAfterJobFinishes: true or remove the TTL")]
    return []


def check_deletion_strategy_gate(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionConfiguration: deletionStrategy needs the RayJobDeletionPolicy gate
    if spec.get("deletionStrategy") is not None and not gates.enabled("RayJobDeletionPolicy"):
        return [gate_off(doc, "spec.deletionStrategy", "RayJobDeletionPolicy", "deletionStrategy")]
    return []


def check_deletion_rules_without_shutdown(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionConfiguration: deletionRules and shutdownAfterJobFinishes exclude each other
    if dig(spec, "deletionStrategy", "deletionRules") and _shutdown(spec):
        return [doc.problem("spec.deletionStrategy.deletionRules", "cannot be combined with shutdownAfterJobFinishes: "
                            "true.", "set shutdownAfterJobFinishes: false (the rules decide what is deleted, and when)")]
    return []


def check_deletion_strategy_one_kind(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionConfiguration: legacy policies or deletionRules, not both, not neither (the CRD's CEL rules say
    # so first)
    strategy = spec.get("deletionStrategy")
    if strategy is None:
        return []
    legacy = strategy.get("onSuccess") is not None or strategy.get("onFailure") is not None
    rules = bool(strategy.get("deletionRules"))
    if rules and legacy:
        return [doc.problem("spec.deletionStrategy", "mixes onSuccess/onFailure with deletionRules.",
                            "keep only deletionRules")]
    if not rules and not legacy:
        return [doc.problem("spec.deletionStrategy", "needs both onSuccess and onFailure, or deletionRules.",
                            "add deletionRules")]
    return []


def _legacy(spec: dict) -> dict | None:
    strategy = spec.get("deletionStrategy") or {}
    if strategy.get("deletionRules") or (strategy.get("onSuccess") is None and strategy.get("onFailure") is None):
        return None
    return strategy


def check_legacy_policies_set(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateLegacyDeletionPolicies: both onSuccess and onFailure, each with a policy
    strategy = _legacy(spec)
    if strategy is None:
        return []
    out = []
    for key in ("onSuccess", "onFailure"):
        if strategy.get(key) is None:  # the CRD's CEL rule says so first
            out.append(doc.problem(f"spec.deletionStrategy.{key}", "is required with the legacy policies.",
                                   "set both onSuccess and onFailure, or use deletionRules"))
        elif strategy[key].get("policy") is None:
            out.append(doc.problem(f"spec.deletionStrategy.{key}.policy", "is required when the legacy policies are "
                                   "used.", "set both onSuccess.policy and onFailure.policy, or use deletionRules"))
    return out


def _legacy_policies(spec: dict) -> list[tuple[str, str]]:
    strategy = _legacy(spec) or {}
    return [(f"spec.deletionStrategy.{key}.policy", policy) for key in ("onSuccess", "onFailure")
            if (policy := dig(strategy, key, "policy")) is not None]


def check_legacy_policy_cluster_selector(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateLegacyDeletionPolicies: DeleteCluster/DeleteWorkers not with clusterSelector
    if not _selector_mode(spec):
        return []
    return [doc.problem(path, f"{policy} is not allowed with clusterSelector (the cluster is not the RayJob's).",
                        "use DeleteSelf or DeleteNone")
            for path, policy in _legacy_policies(spec) if policy in DELETE_POLICIES_NEEDING_CLUSTER]


def check_legacy_delete_workers_autoscaling(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateLegacyDeletionPolicies: DeleteWorkers not with autoscaling
    if not autoscaling_enabled(spec.get("rayClusterSpec")):
        return []
    return [doc.problem(path, "DeleteWorkers does not work with autoscaling.", "use DeleteCluster, or turn "
                        "autoscaling off") for path, policy in _legacy_policies(spec) if policy == "DeleteWorkers"]


def check_legacy_delete_none_with_shutdown(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateLegacyDeletionPolicies: DeleteNone contradicts shutdownAfterJobFinishes
    if not _shutdown(spec):
        return []
    return [doc.problem(path, "DeleteNone contradicts shutdownAfterJobFinishes: true.", "choose another policy or "
                        "set shutdownAfterJobFinishes: false") for path, policy in _legacy_policies(spec)
            if policy == "DeleteNone"]


def _deletion_rules(spec: dict) -> Iterator[tuple[str, dict, dict]]:
    if _legacy(spec) is None:
        for i, rule in enumerate(dig(spec, "deletionStrategy", "deletionRules", default=[])):
            yield f"spec.deletionStrategy.deletionRules[{i}]", rule, rule.get("condition") or {}


def check_deletion_condition(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionCondition: exactly one of jobStatus/jobDeploymentStatus, TTL non-negative (the CRD says so first)
    out = []
    for path, rule, condition in _deletion_rules(spec):
        if ("jobStatus" in condition) == ("jobDeploymentStatus" in condition):
            out.append(doc.problem(f"{path}.condition", "needs exactly one of jobStatus and jobDeploymentStatus.",
                                   "keep one of the two"))
        if (condition.get("ttlSeconds") or 0) < 0:
            out.append(doc.problem(f"{path}.condition.ttlSeconds", "must not be negative.", "use 0 or more"))
    return out


def check_deletion_rule_policy(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionRules: DeleteCluster/DeleteWorkers not with clusterSelector; DeleteWorkers not with autoscaling
    out = []
    for path, rule, condition in _deletion_rules(spec):
        policy = rule.get("policy")
        if _selector_mode(spec) and policy in DELETE_POLICIES_NEEDING_CLUSTER:
            out.append(doc.problem(f"{path}.policy", f"{policy} is not allowed with clusterSelector.",
                                   "use DeleteSelf or DeleteNone"))
        elif policy == "DeleteWorkers" and autoscaling_enabled(spec.get("rayClusterSpec")):
            out.append(doc.problem(f"{path}.policy", "DeleteWorkers does not work with autoscaling.",
                                   "use DeleteCluster, or turn autoscaling off"))
    return out


def _policy_refused(spec: dict, policy: Any) -> bool:
    """check_deletion_rule_policy refuses it; validateDeletionRules leaves such a rule out of the checks below."""
    return ((_selector_mode(spec) and policy in DELETE_POLICIES_NEEDING_CLUSTER)
            or (policy == "DeleteWorkers" and autoscaling_enabled(spec.get("rayClusterSpec"))))


def _grouped_rules(spec: dict) -> Iterator[tuple[int, tuple[str, Any], Any, int]]:
    """(index, (condition field, value), policy, ttlSeconds) for each rule validateDeletionRules groups."""
    for i, (_, rule, condition) in enumerate(_deletion_rules(spec)):
        one_status = ("jobStatus" in condition) != ("jobDeploymentStatus" in condition)
        if not one_status or _policy_refused(spec, rule.get("policy")):
            continue
        key = "jobStatus" if "jobStatus" in condition else "jobDeploymentStatus"
        yield i, (key, condition[key]), rule.get("policy"), condition.get("ttlSeconds") or 0


def check_deletion_rules_unique(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateDeletionRules: one rule per (policy, jobStatus) and per (policy, jobDeploymentStatus)
    out = []
    seen: dict[tuple, int] = {}
    for i, (key, value), policy, _ in _grouped_rules(spec):
        first = seen.setdefault((key, value, policy), i)
        if first != i:
            out.append(doc.problem(f"spec.deletionStrategy.deletionRules[{i}]", f"duplicates deletionRules[{first}] "
                                   f"({policy} on {key} {value}).", "remove one of them"))
    return out


def check_deletion_rules_ttl_order(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # validateTTLConsistency: for one condition, TTL of DeleteWorkers <= DeleteCluster <= DeleteSelf
    by_condition: dict[tuple[str, Any], dict[Any, tuple[int, int]]] = {}
    for i, condition, policy, ttl in _grouped_rules(spec):
        by_condition.setdefault(condition, {}).setdefault(policy, (i, ttl))
    out = []
    for (key, value), policies in by_condition.items():
        previous = None
        for policy in ("DeleteWorkers", "DeleteCluster", "DeleteSelf"):
            if policy not in policies:
                continue
            index, ttl = policies[policy]
            if previous and ttl < previous[1]:
                out.append(doc.problem(f"spec.deletionStrategy.deletionRules[{index}].condition.ttlSeconds",
                                       f"is {ttl} for {policy} on {key} {value}, below the {previous[1]} of "
                                       f"{previous[0]}: KubeRay deletes workers, then the cluster, then the RayJob.",
                                       f"give {policy} a ttlSeconds of {previous[1]} or more"))
            previous = (policy, ttl)
    return out


def check_job_has_cluster(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: one of rayClusterSpec or clusterSelector must be set
    if not _selector_mode(spec) and spec.get("rayClusterSpec") is None:
        return [doc.problem("spec", "has neither rayClusterSpec nor clusterSelector.",
                            "embed a rayClusterSpec or select an existing cluster with clusterSelector")]
    return []


def check_job_selector_names_cluster(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: cluster name in ClusterSelector should not be empty
    if _selector_mode(spec) and not spec["clusterSelector"].get("ray.io/cluster"):
        return [doc.problem("spec.clusterSelector", "has no 'ray.io/cluster' key naming the RayCluster.",
                            "set clusterSelector: {ray.io/cluster: <RayCluster name>}")]
    return []


def check_job_selector_no_suspend(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: the ClusterSelector mode doesn't support the suspend operation
    if _selector_mode(spec) and spec.get("suspend"):
        return [doc.problem("spec.suspend", "clusterSelector mode does not support suspend.",
                            "remove suspend, or embed a rayClusterSpec")]
    return []


def check_job_selector_not_sidecar(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: ClusterSelector is not supported in SidecarMode
    if _selector_mode(spec) and spec.get("submissionMode") == "SidecarMode":
        return [doc.problem("spec.submissionMode", "SidecarMode does not support clusterSelector.",
                            "use K8sJobMode or HTTPMode")]
    return []


def check_job_selector_no_backoff(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: BackoffLimit is incompatible with ClusterSelector mode
    if _selector_mode(spec) and (spec.get("backoffLimit") or 0) > 0:
        return [doc.problem("spec.backoffLimit", f"is {spec['backoffLimit']}: a retry deletes and recreates the "
                            "cluster, which clusterSelector mode must not do (KubeRay rejects it).",
                            "remove backoffLimit, or use a RayJob with an embedded rayClusterSpec "
                            "(manifests/rayjob-standalone.yaml) for retries")]
    return []


def check_job_interactive_backoff(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: InteractiveMode does not support backoffLimit > 0
    if spec.get("submissionMode") == "InteractiveMode" and (spec.get("backoffLimit") or 0) > 0:
        return [doc.problem("spec.backoffLimit", "is incompatible with InteractiveMode.", "remove backoffLimit")]
    return []


def check_job_sidecar_no_submitter(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: SidecarMode doesn't support SubmitterPodTemplate or SubmitterConfig
    if spec.get("submissionMode") != "SidecarMode":
        return []
    return [doc.problem(f"spec.{key}", "is not supported in SidecarMode.", f"remove {key} or use K8sJobMode")
            for key in ("submitterPodTemplate", "submitterConfig") if spec.get(key) is not None]


def check_job_sidecar_head_restart_policy(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: restartPolicy for the head Pod Never or unset in SidecarMode
    policy = dig(spec, "rayClusterSpec", "headGroupSpec", "template", "spec", "restartPolicy")
    if spec.get("submissionMode") == "SidecarMode" and policy not in (None, "", "Never"):
        return [doc.problem("spec.rayClusterSpec.headGroupSpec.template.spec.restartPolicy",
                            "must be Never or unset in SidecarMode.", "set restartPolicy: Never")]
    return []


def check_job_k8s_token_auth(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: K8s token auth is not supported for a RayJob's cluster
    if dig(spec, "rayClusterSpec", "authOptions", "enableK8sTokenAuth"):
        return [doc.problem("spec.rayClusterSpec.authOptions.enableK8sTokenAuth", "is not supported for a RayJob's "
                            "cluster.", "remove enableK8sTokenAuth (authOptions.mode: token alone works)")]
    return []


def check_job_runtime_env_yaml(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec (dashboardclient.UnmarshalRuntimeEnvYAML): a YAML mapping
    runtime_env = spec.get("runtimeEnvYAML")
    if not runtime_env:
        return []
    fix = "write it as a block string of key: value lines, e.g. 'working_dir: /etc/raytrain-job'"
    try:
        parsed = yamlfile.load(str(runtime_env), "spec.runtimeEnvYAML")
    except yamlfile.YAMLFileError as exc:
        return [doc.problem("spec.runtimeEnvYAML", f"is not a YAML mapping ({exc.message.rstrip('.')}).", fix)]
    if parsed is not None and not isinstance(parsed, dict):
        return [doc.problem("spec.runtimeEnvYAML", "is not a YAML mapping (not a mapping).", fix)]
    return []


def check_job_deadlines_positive(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: activeDeadlineSeconds and preRunningDeadlineSeconds must be positive integers
    return [doc.problem(f"spec.{key}", "must be a positive integer.", "use seconds > 0")
            for key in ("activeDeadlineSeconds", "preRunningDeadlineSeconds")
            if spec.get(key) is not None and spec[key] <= 0]


def check_job_backoff_not_negative(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # ValidateRayJobSpec: backoffLimit must not be negative
    if spec.get("backoffLimit") is not None and spec["backoffLimit"] < 0:
        return [doc.problem("spec.backoffLimit", "must not be negative.", "use 0 or more")]
    return []


# raytrain is stricter: manifests KubeRay v1.7.0 admits that cannot work.


def check_job_submission_mode_known(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # raytrain: KubeRay's CRD has no enum for submissionMode and the controller matches none of its paths
    mode = spec.get("submissionMode", "K8sJobMode")
    if mode not in SUBMISSION_MODES:
        return [doc.problem("spec.submissionMode", f"is {mode!r}, not one of {', '.join(SUBMISSION_MODES)}. KubeRay "
                            "would admit it, but no submission path of its controller matches it: the cluster comes "
                            "up and the job is never submitted.", "use K8sJobMode (the default)")]
    return []


def check_job_submitter_template(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # raytrain: KubeRay admits these, but the Kubernetes API refuses the submitter Job KubeRay then creates from them
    submitter = spec.get("submitterPodTemplate")
    if not isinstance(submitter, dict) or spec.get("submissionMode", "K8sJobMode") != "K8sJobMode":
        return []
    out = []
    policy = dig(submitter, "spec", "restartPolicy")
    if policy not in (None, "Never", "OnFailure"):
        out.append(doc.problem("spec.submitterPodTemplate.spec.restartPolicy", f"is {policy}, but the submitter runs "
                               "as a Kubernetes Job, which allows only Never or OnFailure: KubeRay would admit the "
                               "RayJob and then fail to create its submitter.",
                               "use Never (KubeRay retries the submitter itself)"))
    for i, container in enumerate(dig(submitter, "spec", "containers", default=[])):
        if not container.get("image"):
            out.append(doc.problem(f"spec.submitterPodTemplate.spec.containers[{i}].image", "is missing; KubeRay "
                                   "would admit the RayJob, but it uses a submitterPodTemplate as given and the "
                                   "Kubernetes API refuses a Job container without an image.", "use the cluster's image"))
    return out


def submitter_command(spec: dict) -> list[str] | None:
    """The command of a K8sJobMode RayJob's own submitter container, which KubeRay v1.7.0 runs as given instead of
    `ray job submit ... -- <entrypoint>`: rayjob_controller.go configureSubmitterContainer replaces the container's
    command and args only `if len(container.Command) == 0 || submissionMode == rayv1.SidecarMode`, on the first
    container (utils.RayContainerIndex) of the submitterPodTemplate (common/job.go GetSubmitterTemplate). KubeRay's
    light-weight submitter (config/samples/ray-job.light-weight-submitter.yaml: command ["/submitter"], the job's
    command in args after `--`) and any custom `ray job submit` container work so. None: KubeRay builds the command."""
    if spec.get("submissionMode", "K8sJobMode") != "K8sJobMode":
        return None
    command = dig(spec, "submitterPodTemplate", "spec", "containers", 0, "command")
    if isinstance(command, list) and command:
        return [str(part) for part in command] + [str(a) for a in dig(spec, "submitterPodTemplate", "spec",
                                                                       "containers", 0, "args", default=[]) or []]
    return None


def check_job_entrypoint(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # raytrain: KubeRay submits `ray job submit ... -- <entrypoint>` (common/job.go BuildJobSubmitCommand: K8sJobMode
    # and SidecarMode; HTTPMode posts the entrypoint to the dashboard), so an empty one runs nothing and the job
    # fails. Not needed: InteractiveMode (the user submits), and a K8sJobMode submitter container with its own
    # command (submitter_command), which KubeRay runs as given.
    if spec.get("submissionMode") == "InteractiveMode" or submitter_command(spec) is not None:
        return []
    entrypoint = spec.get("entrypoint")
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        custom = dig(spec, "submitterPodTemplate", "spec", "containers", 0)
        detail = (" The submitterPodTemplate's first container has args but no command, so KubeRay replaces both "
                  "with `ray job submit -- <entrypoint>`." if isinstance(custom, dict) and custom.get("args") else "")
        return [doc.problem("spec.entrypoint", "is empty or missing: KubeRay would admit the RayJob, but its "
                            f"submitter has no command to submit and the job fails.{detail}",
                            "give the command, e.g. raytrain run job.yaml --name my-run (or, in K8sJobMode, give the "
                            "submitterPodTemplate's first container a command of its own)")]
    return []


def check_job_submitter_backoff(doc: Doc, spec: dict, gates: FeatureGates) -> list[Problem]:
    # raytrain: KubeRay copies submitterConfig.backoffLimit into the submitter Job, which the API server refuses
    # below 0 (batch ValidateJobSpec)
    limit = dig(spec, "submitterConfig", "backoffLimit")
    if isinstance(limit, int) and limit < 0:
        return [doc.problem("spec.submitterConfig.backoffLimit", f"is {limit}: KubeRay would admit it, but the "
                            "submitter Job it creates with it is refused (a Job's backoffLimit is 0 or more).",
                            "use 0 or more")]
    return []


JOB_CHECKS: list[Callable[..., list[Problem]]] = [
    check_job_suspend_needs_shutdown, check_job_ttl_not_negative, check_job_ttl_needs_shutdown,
    check_deletion_strategy_gate, check_deletion_rules_without_shutdown, check_deletion_strategy_one_kind,
    check_legacy_policies_set, check_legacy_policy_cluster_selector, check_legacy_delete_workers_autoscaling,
    check_legacy_delete_none_with_shutdown, check_deletion_condition, check_deletion_rule_policy,
    check_deletion_rules_unique, check_deletion_rules_ttl_order, check_job_has_cluster,
    check_job_selector_names_cluster, check_job_selector_no_suspend, check_job_selector_not_sidecar,
    check_job_selector_no_backoff, check_job_interactive_backoff, check_job_sidecar_no_submitter,
    check_job_sidecar_head_restart_policy, check_job_k8s_token_auth, check_job_runtime_env_yaml,
    check_job_deadlines_positive, check_job_backoff_not_negative, check_job_submission_mode_known,
    check_job_submitter_template, check_job_entrypoint, check_job_submitter_backoff,
]


