"""The run directory's records: damaged JSON lines are skipped with a warning naming the file and line; every
write passes the run control's fence."""

from __future__ import annotations

import pytest

from raytrain.lifecycle.endings import AttemptEnded, Ending
from raytrain.rundir import layout, runrecords


@pytest.mark.parametrize("damage, why", [
    (b"42\n", "a JSON int, not an object"),
    (b"\xff\xfe{\"epoch\": 9}\n", "not UTF-8"),
    (b"{\"epoch\": 2, \"train_lo\n", "Unterminated string starting at"),
    (b"[1, 2]\n", "a JSON list, not an object"),
])
def test_a_damaged_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path, damage, why):
    path = tmp_path / layout.METRICS_FILE
    path.write_bytes(b'{"epoch": 1}\n' + damage + b'{"epoch": 3}\n')
    warnings = []
    rows = runrecords.read_jsonl(path, warn=warnings.append)
    assert rows == [{"epoch": 1}, {"epoch": 3}]
    assert warnings == [f"{path} line 2 is damaged ({why}) and is skipped"]


def test_a_last_line_being_written_is_skipped_silently_and_rows_need_an_epoch(tmp_path, capsys):
    (tmp_path / layout.METRICS_FILE).write_bytes(b'{"epoch": 1}\n{"epoch": "two"}\n{"epoch": 3}\n{"epo')
    assert [r["epoch"] for r in runrecords.read_metrics(tmp_path)] == [1, 3]
    assert "without an integer epoch" in capsys.readouterr().err
    runrecords.Records(tmp_path).truncate_metrics(1)
    assert runrecords.read_metrics(tmp_path) == [{"epoch": 1}]


def test_step_rows_are_truncated_to_the_restored_position(tmp_path):
    records = runrecords.Records(tmp_path)
    for epoch, step in ((1, 10), (1, 20), (2, 10), (2, 20), (3, 10)):
        records.append_step({"epoch": epoch, "step": step, "train_loss": 1.0})
    records.truncate_metrics(1, 10)  # epoch 1 done, 10 steps into epoch 2
    assert [(r["epoch"], r["step"]) for r in runrecords.read_steps(tmp_path)] == [(1, 10), (1, 20), (2, 10)]


def test_results_keep_every_attempts_record(tmp_path):
    records = runrecords.Records(tmp_path)
    records.write_result({"status": "succeeded", "epochs_completed": 6})
    records.write_result({"status": "failed", "epochs_completed": 6})
    assert runrecords.read_result(tmp_path)["status"] == "failed"
    assert [r["status"] for r in runrecords.read_jsonl(tmp_path / layout.RESULTS_HISTORY_FILE)] == ["succeeded", "failed"]
    (tmp_path / layout.RESULT_FILE).write_bytes(b"\x00\x00")
    assert runrecords.read_result(tmp_path) is None


class Fenced:
    def __init__(self, token):
        self.token, self.open = token, True

    def check(self):
        if not self.open:
            raise AttemptEnded(Ending.LEASE_LOST, "taken over")

    def poll(self):
        return None


def test_every_write_passes_the_fence_and_rows_carry_the_attempt(tmp_path):
    control = Fenced(4)
    records = runrecords.Records(tmp_path, control)
    records.append_metrics({"epoch": 1})
    records.write_config("a: 1\n")
    assert runrecords.read_metrics(tmp_path) == [{"epoch": 1, "attempt": 4}]
    control.open = False
    for write in (lambda: records.append_metrics({"epoch": 2}), lambda: records.append_event("start"),
                  lambda: records.write_result({"status": "succeeded"}), lambda: records.write_config("a: 2\n"),
                  lambda: records.truncate_metrics(0)):
        with pytest.raises(AttemptEnded):
            write()
    assert runrecords.read_metrics(tmp_path) == [{"epoch": 1, "attempt": 4}]
    assert (tmp_path / layout.CONFIG_FILE).read_text() == "a: 1\n" and not (tmp_path / layout.RESULT_FILE).exists()
