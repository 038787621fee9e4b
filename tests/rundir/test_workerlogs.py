"""raytrain.rundir.workerlogs: rank 0's prints copied into the run directory as they are written (still written
where they went), and followed by the driver line by line; Ray's own log lines left in Ray's logs. (The real CLI
on a real run: tests/integration/test_ray_train_scripts.py.)"""

import io
import logging
import sys

import pytest

from raytrain.rundir import layout, runrecords, workerlogs


@pytest.fixture
def streams():
    """sys.stdout and sys.stderr as StringIOs: what a worker's own streams (Ray's logs) receive (set in the test's
    call, after pytest's capture set its own)."""
    saved = sys.stdout, sys.stderr
    out, err = io.StringIO(), io.StringIO()

    def use() -> tuple[io.StringIO, io.StringIO]:
        sys.stdout, sys.stderr = out, err
        return out, err

    yield use
    sys.stdout, sys.stderr = saved


def test_prints_are_copied_in_order_and_still_reach_the_workers_own_streams(tmp_path, streams):
    streams = streams()
    follower = workerlogs.Follower(tmp_path, 3)
    copy = workerlogs.RankOutput(tmp_path, 3, interval_s=3600).start()
    print("epoch 1 done")
    print("a warning", file=sys.stderr)
    copy.flush()
    assert follower.new_lines() == ["epoch 1 done", "a warning"]
    print("half", end="")
    copy.flush()
    assert follower.new_lines() == []  # a line is shown once it is whole
    copy.stop()
    assert (sys.stdout, sys.stderr) == streams  # put back
    print("after the stop")
    assert follower.new_lines(final=True) == ["half"]
    assert workerlogs.log_path(tmp_path, 3) == tmp_path / layout.WORKER_LOGS_DIR / "attempt-3-rank0.log"
    assert workerlogs.log_path(tmp_path, 3).read_text() == "epoch 1 done\na warning\nhalf"
    assert streams[0].getvalue() == "epoch 1 done\nhalfafter the stop\n" and streams[1].getvalue() == "a warning\n"


def test_a_follower_starts_where_the_file_ends_and_a_missing_file_is_no_line(tmp_path, streams):
    streams = streams()
    assert workerlogs.Follower(tmp_path, 1).new_lines(final=True) == []
    copy = workerlogs.RankOutput(tmp_path, 1, interval_s=3600).start()
    print("before the driver looked")
    copy.flush()
    follower = workerlogs.Follower(tmp_path, 1)
    print("after")
    copy.stop()
    assert follower.new_lines() == ["after"]


def test_a_line_printed_before_a_record_is_in_the_file_before_the_record(tmp_path, streams):
    """The driver prints the new lines before the new rows of each poll: a print before a report comes first."""
    streams = streams()
    copy = workerlogs.RankOutput(tmp_path, None, interval_s=3600).start()
    try:
        print("about to report")
        runrecords.Records(tmp_path).append_metrics({"epoch": 1, "loss": 0.5})
        assert workerlogs.log_path(tmp_path, None).read_text() == "about to report\n"
    finally:
        copy.stop()


def test_rays_own_log_lines_stay_in_rays_logs(tmp_path, streams):
    """Ray Train's console handler writes whatever sys.stderr is at emit time (its print goes through the root
    logger): a record of a `ray.*` logger ("Moving model to device") or a library's INFO line is not copied (they
    stay in Ray's logs); print, the root logger's records and a library's warnings are."""
    streams = streams()
    handler = logging._StderrHandler()  # what ray._private.log.PlainRayHandler writes through on a worker
    ray_logger, root = logging.getLogger("ray.train"), logging.getLogger()
    ray_logger.addHandler(handler)
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    try:
        copy = workerlogs.RankOutput(tmp_path, 1, interval_s=3600).start()
        logging.getLogger("ray.train.torch.train_loop_utils").info("Moving model to device: cpu")
        logging.getLogger("ray.train").warning("Ray's own warning")
        logging.getLogger("botocore.credentials").info("Found credentials in environment variables.")
        logging.getLogger().info("what the user printed")
        logging.getLogger("some_library").warning("a library's warning")
        print("plain print")
        copy.stop()
    finally:
        ray_logger.removeHandler(handler)
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert workerlogs.log_path(tmp_path, 1).read_text() == "what the user printed\na library's warning\nplain print\n"
    assert "Moving model to device: cpu" in streams[1].getvalue() and "Found credentials" in streams[1].getvalue()
    assert not handler.filters  # the note-taking filter is removed with the copy


def test_a_print_through_ray_trains_print_patch_is_copied_once(tmp_path, streams):
    """Ray Train 2.60's patched print (the pinned Ray's own function) writes to a wrapped sys.stdout and logs the same
    message to the root logger: the copy keeps it once; a root-logger line of its own and a repeat print stay."""
    from ray.train.v2._internal.logging.patch_print import redirected_print

    streams = streams()
    handler = logging._StderrHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    try:
        copy = workerlogs.RankOutput(tmp_path, 1, interval_s=3600).start()
        redirected_print("rank 0 trained epoch", 0)
        redirected_print("rank 0 trained epoch", 0)
        logging.getLogger().info("logged, not printed")
        redirected_print("no newline", end="")
        redirected_print("")
        copy.stop()
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert workerlogs.log_path(tmp_path, 1).read_text() == \
        "rank 0 trained epoch 0\nrank 0 trained epoch 0\nlogged, not printed\nno newline\n"
    assert streams[0].getvalue().count("rank 0 trained epoch 0") == 2  # still written where it went


def test_a_copy_that_cannot_be_written_says_so_once_and_printing_goes_on(tmp_path, streams):
    streams = streams()
    copy = workerlogs.RankOutput(tmp_path, 1, interval_s=3600).start()
    workerlogs.log_path(tmp_path, 1).mkdir(parents=True)  # a directory where the file goes: every append fails
    print("one")
    copy.flush()
    print("two")
    copy.stop()
    assert copy.failed and streams[0].getvalue() == "one\ntwo\n"
    assert streams[1].getvalue().count("rank output is no longer copied") == 1


def test_on_an_object_store_the_lines_are_appended_and_followed(s3_prefix, streams):
    streams = streams()
    run_dir = runrecords.run_dir_of(s3_prefix, "printing")
    follower = workerlogs.Follower(run_dir, 2)
    copy = workerlogs.RankOutput(run_dir, 2, interval_s=3600).start()
    print("first")
    copy.flush()
    assert follower.new_lines() == ["first"]
    print("second")
    copy.stop()
    assert follower.new_lines() == ["second"]


def test_a_progress_bars_redraws_are_kept_as_a_terminal_shows_them(tmp_path, streams):
    streams = streams()
    copy = workerlogs.RankOutput(tmp_path, 1, interval_s=3600).start()
    for done in range(0, 101, 10):  # tqdm: a carriage return, then the bar again
        sys.stderr.write(f"\r{done:3d}%|{'#' * (done // 10):10s}|")
    sys.stderr.write("\n")
    print("line\r")  # a Windows line end stays a line
    copy.stop()
    assert workerlogs.log_path(tmp_path, 1).read_bytes() == b"100%|##########|\nline\r\n"
    assert streams[1].getvalue().count("\r") == 11  # the worker's own stream got every redraw


@pytest.mark.parametrize(("text", "shown"), [
    ("a\rb\rc\n", "c\n"), ("a\r\n", "a\r\n"), ("x\ny\rz", "x\nz"), ("no return\n", "no return\n"),
    ("\r", "\r"), ("\r50%", "50%"),
])
def test_redrawn_lines(text, shown):
    assert workerlogs._redrawn(text) == shown


def test_the_copy_stops_at_its_cap_with_a_line_that_says_where_the_rest_is(tmp_path, streams):
    streams = streams()
    copy = workerlogs.RankOutput(tmp_path, 2, interval_s=3600, max_bytes=100).start()
    print("x" * 60)
    copy.flush()
    print("y" * 60)
    copy.flush()
    print("z" * 10)
    copy.stop()
    kept = workerlogs.log_path(tmp_path, 2).read_text().splitlines()
    assert kept == ["x" * 60, "raytrain: rank 0's output past 0 MiB is in Ray's logs on its node only"]
    assert streams[0].getvalue().endswith("z" * 10 + "\n")  # the worker's own stream still got everything


def test_the_cap_is_per_attempt_and_the_last_lines_outlive_it(tmp_path, streams):
    """A restarted worker group of the same attempt appends to its rank's file and counts what is there; past the
    cap the rank's last lines are still known (for its failure record)."""
    streams = streams()
    workerlogs.log_path(tmp_path, 2, 1).parent.mkdir(parents=True)
    workerlogs.log_path(tmp_path, 2, 1).write_text("e" * 90 + "\n")  # the group before wrote 91 bytes
    copy = workerlogs.RankOutput(tmp_path, 2, rank=1, interval_s=3600, max_bytes=100).start()
    print("x" * 60)
    copy.flush()
    print("after the cap")
    print("unflushed", end="")
    assert copy.last_lines() == ["x" * 60, "after the cap", "unflushed"]
    copy.stop()
    kept = workerlogs.log_path(tmp_path, 2, 1).read_text().splitlines()
    assert kept == ["e" * 90, "raytrain: rank 1's output past 0 MiB is in Ray's logs on its node only"]
    assert workerlogs.Follower(tmp_path, 2, rank=1).path.name == "attempt-2-rank1.log"
