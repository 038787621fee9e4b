"""KubeRay's K8sJobMode submitter: the bash command its submitter pod runs (wait for the dashboard's GCS health,
skip a duplicate submission, `ray job submit --no-wait`, then follow the logs). `raytrain emulate` runs it for a
RayJob; `raytrain cluster submit` runs it for a run on plain machines."""

from __future__ import annotations

import json
import shlex


def submitter_script(spec: dict, address: str, job_id: str, runtime_env: dict, entrypoint: str) -> str:
    """The K8sJobMode submitter's shell command for a RayJob spec, built like KubeRay v1.7.0's
    BuildJobSubmitCommand (common/job.go)."""
    q = shlex.quote
    parts = [f"until python -c {q(_HEALTH_PROBE)} {q(address + '/api/gcs_healthz')} >/dev/null 2>&1 ;",
             f"do echo {q('Waiting for Ray Dashboard GCS to become healthy at ' + address + ' ...')} ; sleep 2 ; done ;",
             f"if ! ray job status --address {address} {job_id} >/dev/null 2>&1 ;",
             f"then ray job submit --address {address} --no-wait"]
    if runtime_env:
        parts.append(f"--runtime-env-json {q(json.dumps(runtime_env, separators=(',', ':')))}")
    if spec.get("metadata"):
        parts.append(f"--metadata-json {q(json.dumps(spec['metadata'], separators=(',', ':')))}")
    parts.append(f"--submission-id {job_id}")
    if spec.get("entrypointNumCpus"):
        parts.append(f"--entrypoint-num-cpus {float(spec['entrypointNumCpus']):f}")
    if spec.get("entrypointNumGpus"):
        parts.append(f"--entrypoint-num-gpus {float(spec['entrypointNumGpus']):f}")
    if spec.get("entrypointResources"):
        parts.append(f"--entrypoint-resources {q(str(spec['entrypointResources']))}")
    # The entrypoint goes in unquoted, as KubeRay joins it into the bash command.
    parts += ["--", entrypoint.strip(), "; fi ;", f"ray job logs --address {address} --follow {job_id}"]
    return " ".join(parts)


# KubeRay's health probe (utils.BasePythonHealthCommand): a short urllib GET that fails unless the answer is 200.
_HEALTH_PROBE = ("import sys, urllib.request\n"
                 "sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)")
