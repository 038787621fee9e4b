"""raytrain.rundir.console: today's human lines by default, one JSON object per line with --log-format json
(the real CLI on a real run: tests/integration/test_prometheus.py)."""

import io
import json

import pytest

from raytrain.cli import EXIT_OK, EXIT_USAGE, main
from raytrain.rundir import console, layout


@pytest.fixture(autouse=True)
def human_afterwards():
    yield
    console.configure("human")
    console._settings["run"] = None


def test_human_lines_are_those_of_before():
    out = io.StringIO()
    console.info("connected", "started embedded Ray (2 CPUs)", out=out, run_dir="/x")
    console.warning("checkpoint unreadable", out=out, rank=0)
    console.epoch("epoch 1/2  train_loss 1.0000", {"epoch": 1}, out=out)
    console.error("it broke", out=out)
    assert out.getvalue().splitlines() == ["raytrain: started embedded Ray (2 CPUs)",
                                           "raytrain: warning: checkpoint unreadable",
                                           "epoch 1/2  train_loss 1.0000", "raytrain: error: it broke"]


def test_json_lines_carry_time_level_run_rank_event_and_fields():
    console.configure("json", run="digits")
    out = io.StringIO()
    console.epoch("epoch 1/2", {"epoch": 1, "train_loss": 0.5}, out=out)
    console.info("connected", "joined", out=out, run_dir="/runs/digits", event="start")  # a field named event too
    console.error("bad", out=out)
    first, second, third = [json.loads(line) for line in out.getvalue().splitlines()]
    assert first["time"].endswith("Z") and first["level"] == "info" and first["run"] == "digits"
    assert first["rank"] == 0 and first["event"] == "epoch" and first["fields"] == {"epoch": 1, "train_loss": 0.5}
    assert second["rank"] is None and second["event"] == "connected"
    assert second["fields"] == {"run_dir": "/runs/digits", "event": "start"}
    assert third["level"] == "error" and third["message"] == "bad"


def test_cli_errors_come_out_as_json_and_the_env_var_picks_the_format(tmp_path, capsys, monkeypatch):
    assert main(["report", str(tmp_path / "missing"), "--log-format", "json"]) == EXIT_USAGE
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["level"] == "error" and "no such directory" in record["message"]
    monkeypatch.setenv("RAYTRAIN_LOG_FORMAT", "json")
    assert main(["report", str(tmp_path / "missing")]) == EXIT_USAGE
    json.loads(capsys.readouterr().err)
    assert main(["--log-format", "human", "report", str(tmp_path / "missing")]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("raytrain: error: report: ")


def test_a_bad_env_var_is_a_usage_error_naming_it(capsys, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_LOG_FORMAT", "xml")
    assert main(["presets"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "RAYTRAIN_LOG_FORMAT='xml'" in err and "Fix:" in err


def test_a_terminal_gets_one_redrawn_progress_line_and_the_copy_gets_plain_lines(tmp_path):
    path = console.keep_copy(tmp_path / "run")
    try:
        out = io.StringIO()
        console.epoch("epoch 1/2  train_loss 1.0000", {"epoch": 1}, out=out, bar=0.5)
        console.epoch("epoch 2/2  train_loss 0.5000", {"epoch": 2}, out=out, bar=1.0)
        console.info("result", "succeeded", out=out)
    finally:
        console.stop_copy()
    assert out.getvalue() == ("\r\033[K[###############...............] epoch 1/2  train_loss 1.0000"
                              "\r\033[K[##############################] epoch 2/2  train_loss 0.5000\n"
                              "raytrain: succeeded\n")
    assert path.parent == tmp_path / "run" / layout.DRIVER_LOGS_DIR and path.suffix == ".log"
    assert path.read_text().splitlines() == ["epoch 1/2  train_loss 1.0000", "epoch 2/2  train_loss 0.5000",
                                             "raytrain: succeeded"]


def test_the_cli_keeps_each_attempts_lines_in_the_run_directory(tmp_path, capsys):
    storage = tmp_path / "runs"
    for attempt in (1, 2):
        assert main(["local", "linear", "--smoke-test", "--storage", str(storage), "--name", "lin",
                     "--log-format", "json"]) == EXIT_OK
        shown = capsys.readouterr().out.splitlines()
        copies = sorted((storage / "lin" / layout.DRIVER_LOGS_DIR).iterdir())
        assert len(copies) == attempt
        kept = [line for path in copies for line in path.read_text().splitlines()][-len(shown):]
        # The second start finds the run finished: its one line is kept like any attempt's.
        assert kept == shown and json.loads(kept[-1])["event"] == ("result" if attempt == 1 else "nothing_to_train")
