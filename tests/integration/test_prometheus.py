"""A real Prometheus (Debian's `prometheus`, installed by scripts/setup-system) scrapes a real Ray node while
`raytrain run` trains on it; then every PromQL query of the chart's Grafana dashboard must return data for that
run, as Grafana would ask for it (a range query over the run's time), and the values must be the run's own.
The same run's console output, with --log-format json, must parse line by line.

Prometheus finds Ray's metrics endpoints the way Ray documents it: the service-discovery file Ray writes in its
temp dir (prom_metrics_service_discovery.json), read through file_sd_configs. The node is the session's shared Ray
head (tests/integration/conftest.py), whose processes report metrics every second; every query names this file's
runs, so the other runs that joined the head do not count.

    .venv/bin/python -m pytest -m integration tests/integration/test_prometheus.py -v
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from raytrain.cluster.raynode import free_port
from raytrain.platform.processes import kill_pids
from raytrain.rundir import goodput
from tests.support.tools import require_tool

# One xdist worker runs the module's tests: its Prometheus and its trained run are module fixtures, started once.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("prometheus")]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "helm" / "raytrain-cluster" / "dashboards" / "raytrain.json"
RAYTRAIN = str(Path(sys.executable).parent / "raytrain")
SCRAPE_S = 1
EPOCHS = 6
RUN = "prom-digits"
RESUMED = "prom-resume"
# Grafana's $__rate_interval at a 1 s scrape interval: max(4 x scrape interval, $__interval + scrape interval).
RATE_INTERVAL = f"{4 * SCRAPE_S}s"


def get_json(url: str, timeout: float = 10.0) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:  # Prometheus says why in the body (e.g. a PromQL parse error)
        pytest.fail(f"{urllib.parse.unquote(url)}: HTTP {err.code}: {err.read().decode(errors='replace')}")


def wait_for(what: str, check, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited ({proc.returncode}): {log.read_text()[-3000:] if log else ''}")
        try:
            value = check()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{what}: not ready after {timeout:.0f}s" + (f": {log.read_text()[-3000:]}" if log else ""))


def run_digits(ray_head, storage: Path, name: str, *options: str) -> subprocess.CompletedProcess:
    # Ray Data ingest, as the preset had before data.loader: auto: its slower epochs keep the run training over
    # the scrapes the checks below count (with a DataLoader the run can end within four 1 s scrapes).
    proc = subprocess.run([RAYTRAIN, "run", "digits", "--address", ray_head.address, "--storage", str(storage),
                           "--name", name, "--set", "data.loader=ray", *options], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def first_attempt(ray_head, tmp_path_factory) -> Path:
    """The storage of RESUMED's first attempt (2 epochs, a checkpoint each), run before Prometheus scrapes.

    It also shows the node's metrics agent every metric name (raytrain's and Ray's for this workload) before any
    scrape: Ray 2.55's agent deadlocked for good when a name it has not seen arrives while a scrape collects
    (ray-project/ray#64946, fixed in Ray 2.57: the registration takes the recorder's lock, then the OpenTelemetry
    SDK's; the scrape the other way round), which a scrape every second made likely. Seen in CI: the agent's
    endpoint answered for 18 s and never again (docs/guides/monitoring.md says what a user can do)."""
    storage = tmp_path_factory.mktemp("resumed")
    run_digits(ray_head, storage, RESUMED, "--set", "train.epochs=2", "--set", "run.checkpoint_every=1")
    return storage


@pytest.fixture(scope="module")
def prometheus(ray_head, first_attempt, tmp_path_factory):
    binary = require_tool("prometheus")
    discovery = ray_head.temp_dir / "prom_metrics_service_discovery.json"
    wait_for(f"Ray's service-discovery file {discovery}", discovery.is_file, timeout=60)
    work = tmp_path_factory.mktemp("prometheus")
    config = work / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "scrape_configs": [{"job_name": "ray", "file_sd_configs": [{"files": [str(discovery)],
                                                                     "refresh_interval": f"{SCRAPE_S}s"}]}],
    }))
    port = free_port("127.0.0.1")
    log_path = work / "prometheus.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("prometheus ready", lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200,
                 timeout=60, proc=proc, log=log_path)
        # The node's metrics endpoint, found through the discovery file, is scraped and up.
        wait_for("Ray's metrics endpoint scraped", lambda: any(
            r["value"][1] == "1" for r in get_json(f"{url}/api/v1/query?query=up")["data"]["result"]),
            timeout=60, proc=proc, log=log_path)
        yield url
    finally:
        kill_pids([proc.pid])


@pytest.fixture(scope="module")
def trained(ray_head, prometheus, tmp_path_factory):
    """A short digits run on the Ray node, console lines in JSON; returns (run dir, stdout, stderr, start, end)."""
    storage = tmp_path_factory.mktemp("runs")
    began = time.time()
    proc = run_digits(ray_head, storage, RUN, "--set", f"train.epochs={EPOCHS}", "--set", "run.checkpoint_every=2",
                      "--log-format", "json")
    time.sleep(3 * SCRAPE_S)  # the last values reach Prometheus
    # On a loaded machine Ray's metrics agent exports late: wait until the run's series are there (a run whose
    # metrics never arrive still fails, in the test that asks for them).
    arrived(prometheus, f'ray_raytrain_samples_per_second{{run="{RUN}"}}', began)
    return storage / RUN, proc.stdout, proc.stderr, began, time.time()


def arrived(url: str, expr: str, began: float, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not range_query(url, expr, began, time.time()) and time.monotonic() < deadline:
        time.sleep(SCRAPE_S)


def last_value(url: str, metric: str, run: str, start: float, end: float) -> float:
    series = range_query(url, f'max by (run) ({metric}{{run="{run}"}})', start, end)
    assert len(series) == 1, f"{metric} of run {run}: {len(series)} series; scrapes: {scrape_health(url, start, end)}"
    return float(series[0]["values"][-1][1])


def scrape_health(url: str, start: float, end: float) -> str:
    """What Prometheus saw of its targets over [start, end]: failed scrapes and the slowest one, for a failure's
    message (a scrape that times out has already taken the agent's gauge values: Ray clears them on each collect)."""
    lines = []
    for series in range_query(url, "up", start, end):
        ups = [v for _, v in series["values"]]
        lines.append(f"{series['metric'].get('instance')}: {ups.count('0')} of {len(ups)} scrapes failed")
    for series in range_query(url, "scrape_duration_seconds", start, end):
        slowest = max(float(v) for _, v in series["values"])
        lines.append(f"{series['metric'].get('instance')}: slowest scrape {slowest:.2f}s")
    return "; ".join(lines)


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def grafana_expr(expr: str) -> str:
    """The query Grafana sends for this run: $run as the chosen run, $__rate_interval at our scrape interval."""
    assert re.fullmatch(r"[\w-]+", RUN)  # nothing to escape in a regex matcher
    return expr.replace("$run", RUN).replace("$__rate_interval", RATE_INTERVAL)


def range_query(url: str, expr: str, start: float, end: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": f"{SCRAPE_S}s"})
    body = get_json(f"{url}/api/v1/query_range?{params}")
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_every_dashboard_panel_has_data_for_a_run_on_a_real_ray_node(prometheus, trained):
    run_dir, _, _, began, ended = trained
    queries = dashboard_queries()
    assert queries
    empty = []
    for title, expr in queries:
        series = range_query(prometheus, grafana_expr(expr), began, ended)
        values = [float(v) for s in series for _, v in s["values"]]
        if not values or all(v != v for v in values):  # no samples, or NaN only
            empty.append(f"{title}: {expr}")
    assert not empty, ("dashboard queries without data:\n" + "\n".join(empty)
                       + f"\nscrapes: {scrape_health(prometheus, began, ended)}")

    # The run selector lists the run.
    params = urllib.parse.urlencode({"match[]": "ray_raytrain_epoch", "start": began, "end": ended})
    assert RUN in get_json(f"{prometheus}/api/v1/label/run/values?{params}")["data"]

    # The values are the run's own: last epoch, last losses, no restarts.
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    def last(metric: str) -> float:
        return last_value(prometheus, metric, RUN, began, ended)

    assert last("ray_raytrain_epoch") == EPOCHS
    assert last("ray_raytrain_train_loss") == pytest.approx(rows[-1]["train_loss"])
    assert last("ray_raytrain_val_accuracy") == pytest.approx(rows[-1]["val_accuracy"])
    assert last("ray_raytrain_restarts") == 0 and last("ray_raytrain_resumes") == 0
    [start] = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
               if json.loads(line)["event"] == "start"]
    assert last("ray_raytrain_training_workers") == start["world_size"] > 0  # no torchft: the whole group
    # The run's goodput as of its last epoch: all done, a share of the time trained, every cause exported
    assert last("ray_raytrain_progress_percent") == 100 and last("ray_raytrain_time_left_seconds") == 0
    assert 0 < last("ray_raytrain_goodput_ratio") <= 1
    causes = range_query(prometheus, f'ray_raytrain_goodput_seconds{{run="{RUN}"}}', began, ended)
    assert {s["metric"]["cause"] for s in causes} == set(goodput.CAUSES)
    # Set once at the start, yet in (nearly) every scrape while the run trains: the values are kept alive.
    [series] = range_query(prometheus, f'ray_raytrain_restarts{{run="{RUN}"}}', began, ended)
    assert len(series["values"]) >= 5, series["values"]
    per_rank = range_query(prometheus, f'ray_raytrain_worker_samples_per_second{{run="{RUN}"}}', began, ended)
    assert sorted({s["metric"]["rank"] for s in per_rank}) == ["0", "1"]


def test_json_console_lines_parse_one_by_one(trained):
    run_dir, stdout, stderr, _, _ = trained
    records = [json.loads(line) for line in stdout.splitlines()]  # every line, or this raises
    assert records and all(set(r) == {"time", "level", "run", "rank", "event", "message", "fields"} for r in records)
    assert {r["run"] for r in records} == {RUN}
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["fields"]["epoch"] for r in epochs] == list(range(1, EPOCHS + 1))
    assert all(r["rank"] == 0 and r["level"] == "info" for r in epochs)
    [result] = [r for r in records if r["event"] == "result"]
    assert result["fields"]["status"] == "succeeded" and result["fields"]["run_dir"] == str(run_dir)
    # The attempt's lines are kept beside the run (a failed RayJob attempt's pod goes, and its logs with it).
    [copy] = (run_dir / "driver-logs").iterdir()
    assert copy.read_text().splitlines() == stdout.splitlines()
    for line in stderr.splitlines():  # Ray's own lines may appear there; raytrain's are JSON
        if line.startswith("{"):
            json.loads(line)
        else:
            assert not line.startswith("raytrain:"), line


def test_a_resumed_run_reports_its_restart_and_resume(ray_head, first_attempt, prometheus):
    """The same run invoked again (a RayJob retried) resumes from its checkpoint: restarts 1, resumes 1."""
    name, tmp_path = RESUMED, first_attempt
    began = time.time()
    proc = run_digits(ray_head, tmp_path, name, "--set", "train.epochs=3", "--set", "run.checkpoint_every=1")
    assert "resuming after epoch 2" in proc.stdout
    time.sleep(3 * SCRAPE_S)
    arrived(prometheus, f'ray_raytrain_resumes{{run="{name}"}}', began)
    ended = time.time()

    def last(metric: str) -> float:
        return last_value(prometheus, metric, name, began, ended)

    assert last("ray_raytrain_restarts") == 1 and last("ray_raytrain_resumes") == 1
    assert last("ray_raytrain_epoch") == 3
    newest = max(p.stat().st_mtime for p in (tmp_path / name).glob("checkpoint_*/meta.json"))
    assert last("ray_raytrain_last_checkpoint_timestamp_seconds") == pytest.approx(newest, abs=5)
