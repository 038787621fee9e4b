"""The run directory's files: damaged JSON lines are skipped with a warning naming the file and line."""

from __future__ import annotations

import pytest

from raytrain import runs


@pytest.mark.parametrize("damage, why", [
    (b"42\n", "a JSON int, not an object"),
    (b"\xff\xfe{\"epoch\": 9}\n", "not UTF-8"),
    (b"{\"epoch\": 2, \"train_lo\n", "Unterminated string starting at"),
    (b"[1, 2]\n", "a JSON list, not an object"),
])
def test_a_damaged_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path, damage, why):
    path = tmp_path / runs.METRICS_FILE
    path.write_bytes(b'{"epoch": 1}\n' + damage + b'{"epoch": 3}\n')
    warnings = []
    rows = runs.read_jsonl(path, warn=warnings.append)
    assert rows == [{"epoch": 1}, {"epoch": 3}]
    assert warnings == [f"{path} line 2 is damaged ({why}) and is skipped"]


def test_a_last_line_being_written_is_skipped_silently_and_rows_need_an_epoch(tmp_path, capsys):
    (tmp_path / runs.METRICS_FILE).write_bytes(b'{"epoch": 1}\n{"epoch": "two"}\n{"epoch": 3}\n{"epo')
    assert [r["epoch"] for r in runs.read_metrics(tmp_path)] == [1, 3]
    assert "without an integer epoch" in capsys.readouterr().err
    runs.truncate_metrics(tmp_path, 1)
    assert runs.read_metrics(tmp_path) == [{"epoch": 1}]


def test_results_keep_every_attempts_record(tmp_path):
    runs.write_result(tmp_path, {"status": "succeeded", "epochs_completed": 6})
    runs.write_result(tmp_path, {"status": "failed", "epochs_completed": 6})
    assert runs.read_result(tmp_path)["status"] == "failed"
    assert [r["status"] for r in runs.read_jsonl(tmp_path / runs.RESULTS_HISTORY_FILE)] == ["succeeded", "failed"]
    (tmp_path / runs.RESULT_FILE).write_bytes(b"\x00\x00")
    assert runs.read_result(tmp_path) is None
