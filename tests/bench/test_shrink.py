"""bench/shrink.py: the shrink figures of both sides from the rows its rounds produce (the rounds themselves run a
real cluster: `scripts/bench shrink`)."""

from __future__ import annotations

from bench.shrink import shrink_figures


def _row(side: str, seconds: float, failed: int = 0) -> dict:
    return {"side": side, "to_next_step_s": seconds, "workers_after": 1, "failed_starts": failed,
            "pre_stop_rc": 0, "job_status": "STOPPED"}


def test_the_refresh_side_is_judged_against_the_target_and_the_ray_side_is_not():
    refresh, ray = shrink_figures([_row("refresh", 9.0), _row("refresh", 20.0), _row("refresh", 11.0)],
                                  [_row("ray", 41.0, failed=1), _row("ray", 44.0, failed=1)])
    assert (refresh["figure"], refresh["median"], refresh["target"], refresh["met"]) == \
        ("shrink_refresh_to_next_step_s", 11.0, "<= 15", True)
    assert refresh["failed_starts"] == [0, 0, 0] and refresh["workers_after"] == [1, 1, 1]
    assert ray["figure"] == "shrink_ray_to_next_step_s" and ray["median"] == 42.5 and "target" not in ray
    assert ray["failed_starts"] == [1, 1]
    slow, _ = shrink_figures([_row("refresh", 16.0)], [_row("ray", 40.0)])
    assert slow["met"] is False
