"""The Ray dashboard's HTTP API as KubeRay and raytrain use it: GCS health (what KubeRay's submitter polls before
`ray job submit`), alive nodes from the state API, a job's status; with the cluster's auth token."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from raytrain.cluster.raynode import ClusterError

HEALTH_PATH = "/api/gcs_healthz"  # what KubeRay's submitter polls before `ray job submit`


def http_get(url: str, token: str | None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_dashboard(url: str, token: str | None, timeout: float) -> None:
    """Wait as KubeRay's submitter does: until the dashboard's GCS health endpoint answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http_get(url + HEALTH_PATH, token, timeout=2)[0] == 200:
                return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"the Ray dashboard at {url} did not become healthy within {timeout:.0f}s")
        time.sleep(0.5)


def alive_nodes(url: str, token: str | None) -> list[dict]:
    """Alive Ray nodes through the dashboard's state API (same auth as job submission)."""
    status, body = http_get(url + "/api/v0/nodes?limit=1000&detail=1", token)
    if status != 200:
        return []
    return [n for n in json.loads(body)["data"]["result"]["result"] if n.get("state") == "ALIVE"]
