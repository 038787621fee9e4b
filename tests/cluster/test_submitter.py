"""KubeRay's K8sJobMode submitter command."""

from __future__ import annotations

import yaml

from raytrain.cluster.submitter import submitter_script

SPEC = yaml.safe_load("""
entrypoint: raytrain run job.yaml --name demo --storage /mnt/shared/runs --address auto
metadata: {team: ml}
entrypointNumCpus: 1
""")


def test_submitter_script_is_kuberays_k8s_job_mode_command():
    script = submitter_script(SPEC, "http://10.0.0.2:8265", "demo-abcde", {"working_dir": "/w"}, SPEC["entrypoint"])
    # wait for the dashboard, skip a duplicate submission, submit without waiting, follow the logs
    order = ["/api/gcs_healthz", "if ! ray job status --address http://10.0.0.2:8265 demo-abcde",
             "then ray job submit --address http://10.0.0.2:8265 --no-wait", "--runtime-env-json",
             "--metadata-json", "--submission-id demo-abcde", "--entrypoint-num-cpus 1.000000",
             "-- raytrain run job.yaml --name demo", "; fi ;",
             "ray job logs --address http://10.0.0.2:8265 --follow demo-abcde"]
    positions = [script.index(part) for part in order]
    assert positions == sorted(positions), script
    assert '\'{"working_dir":"/w"}\'' in script


def test_an_empty_spec_submits_the_entrypoint_alone():
    script = submitter_script({}, "http://h:8265", "id-1", {}, "raytrain run linear")
    assert "--runtime-env-json" not in script and "--metadata-json" not in script
    assert "--submission-id id-1 -- raytrain run linear ; fi ;" in script
