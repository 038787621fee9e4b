"""bench/e2e.py: the end-to-end figures of the three sides from the rows its rounds produce (the rounds themselves
submit real jobs to a local cluster: `scripts/bench e2e`), and upstream's script is what the figure says it is."""

import ast

from bench.e2e import SIDES, UPSTREAM, e2e_figures


def _row(side: str, end: float) -> dict:
    return {"side": side, "job_status": "SUCCEEDED", "submit_cli_s": 2.0, "loop_start_s": end - 9.0,
            "loop_end_s": end - 8.0, "job_end_s": end}


def test_each_side_gets_its_phases_and_raytrain_is_judged_per_round_against_upstream():
    results = {"raytrain": [_row("raytrain", 26.0), _row("raytrain", 30.0), _row("raytrain", 24.0)],
               "raytrain_ray_interval": [_row("raytrain_ray_interval", 35.0)] * 3,
               "upstream": [_row("upstream", 26.0), _row("upstream", 25.0), _row("upstream", 30.0)]}
    figures = {f["figure"]: f for f in e2e_figures(results)}
    assert set(figures) == {f"e2e_{side}_s" for side in SIDES} | {"e2e_raytrain_over_upstream"}
    assert figures["e2e_raytrain_s"]["median"] == 26.0
    assert figures["e2e_raytrain_s"]["phase_medians_s"] == {"submit_cli_s": 2.0, "loop_start_s": 17.0,
                                                             "loop_end_s": 18.0, "job_end_s": 26.0}
    ratio = figures["e2e_raytrain_over_upstream"]
    assert ratio["rounds"] == [1.0, 1.2, 0.8] and ratio["median"] == 1.0 and ratio["met"] is True
    slower = dict(results, raytrain=[_row("raytrain", 27.0)] * 3)
    assert next(f for f in e2e_figures(slower) if f["figure"] == "e2e_raytrain_over_upstream")["met"] is False


def test_upstreams_job_is_a_plain_ray_train_script_that_marks_its_loop():
    tree = ast.parse(UPSTREAM)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not any(name.startswith("raytrain") for name in imported)
    assert "E2E_LOOP_START" in UPSTREAM and "E2E_LOOP_END" in UPSTREAM and "prepare_model" in UPSTREAM
