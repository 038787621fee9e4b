"""training/raytrain/driver/raytrainer.py: the driver's pieces that run without a cluster."""

from __future__ import annotations

from raytrain.driver.raytrainer import root_cause


def test_root_cause_is_the_innermost_last_line():
    try:
        try:
            raise ValueError("first line\nthe real reason")
        except ValueError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        assert root_cause(outer) == "the real reason"
