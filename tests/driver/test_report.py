"""`raytrain report`: run directories in the layout raytrain.rundir.runrecords writes, drawn to a PNG and an HTML page."""

import base64
import json

import matplotlib.image
import pytest

from raytrain.checkpoint import checkpoints
from raytrain.cli import EXIT_OK, EXIT_USAGE, main
from raytrain.driver.report import load_runs, plan_panels, report, summary_lines
from raytrain.rundir import runrecords
from raytrain.spec.config import dump_yaml, load_config


def make_run(storage, name, epochs, *, accuracy=True, resumed_at=None, checkpoint_at=None, result=True):
    run_dir = runrecords.run_dir_of(str(storage), name)
    runrecords.Records(run_dir).write_config(dump_yaml(load_config("digits", [f"run.name={name}"])))
    runrecords.Records(run_dir).append_event("start", start_epoch=1, resumed_from_epoch=None, world_size=2)
    for epoch in range(1, epochs + 1):
        row = {"epoch": epoch, "train_loss": 2.0 / epoch, "val_loss": 2.2 / epoch, "samples": 1437,
               "samples_per_s": 4000.0 + epoch, "epoch_s": 0.3}
        if accuracy:
            row["val_accuracy"] = 1 - 0.5 / epoch
        runrecords.Records(run_dir).append_metrics(row)
        if epoch == resumed_at:
            runrecords.Records(run_dir).append_event("start", start_epoch=epoch + 1, resumed_from_epoch=epoch, world_size=2)
    if checkpoint_at:
        checkpoints.FileCheckpointer(run_dir).save(
            checkpoints.Position(checkpoint_at), lambda: {"model": {}, "epoch": checkpoint_at, "step": 0}, writer=True)
    if result:
        runrecords.Records(run_dir).write_result({"status": "succeeded", "duration_s": 75.0, "epochs_completed": epochs})
    return run_dir


def test_one_run_gives_a_png_and_an_html_page_that_embeds_it(tmp_path):
    run_dir = make_run(tmp_path, "digits", 12, resumed_at=6, checkpoint_at=12)
    loaded, png, page = report([run_dir])
    assert png == run_dir / "report.png" and page == run_dir / "report.html"
    height, width, _ = matplotlib.image.imread(png).shape
    assert width > 1000 and height > 700
    text = page.read_text()
    assert base64.b64encode(png.read_bytes()).decode() in text
    assert "small_cnn" in text and "train:" in text  # the config.yaml is on the page
    assert f"<code>raytrain why {run_dir}</code>" in text  # the post-mortem of its attempts (issue 38)
    [summary, config, last, state, time_went] = summary_lines(loaded[0])
    assert summary.startswith("digits: succeeded, epoch 12/12, 1m15s")
    assert "small_cnn on digits" in config and "2 workers" in config
    assert "val_accuracy 0.9583" in last
    assert "1 checkpoint(s)" in state and "1 restart(s), 1 resumed" in state
    assert time_went.startswith("  goodput ") and "<h3>Where its time went</h3>" in text


def test_thousands_of_epochs_and_several_runs_on_one_plot(tmp_path):
    long_run = make_run(tmp_path, "long", 5000)
    other = make_run(tmp_path, "regression", 30, accuracy=False)
    out = tmp_path / "out" / "compare.png"
    loaded, png, page = report([long_run, other], out)
    assert png == out and page == out.with_suffix(".html") and [r.name for r in loaded] == ["long", "regression"]
    assert matplotlib.image.imread(png).shape[1] > 1000


def test_a_tune_directory_stands_for_its_trials_and_marks_the_best(tmp_path):
    for trial_id in ("a1", "b2"):
        make_run(tmp_path, f"sweep-trial-{trial_id}", 4)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "tune.json").write_text(json.dumps({
        "metric": "val_accuracy", "mode": "max", "best": {"trial_id": "b2"},
        "trials": [{"trial_id": "a1", "params": {"train.lr": 0.01}}, {"trial_id": "b2", "params": {"train.lr": 0.003}},
                   {"trial_id": "never-started", "params": {"train.lr": 0.1}}]}))
    loaded, png, _ = report([sweep])
    assert [(r.name, r.best) for r in loaded] == [("trial a1", False), ("trial b2", True)]
    assert png == sweep / "report.png"
    assert summary_lines(loaded[1])[0].startswith("trial b2  (best): ") and "train.lr=0.003" in summary_lines(loaded[1])[1]


def timed_run(storage, name="timed"):
    """A run whose records carry times (raytrain.rundir.goodput's input), written as the session writes them."""
    run_dir = make_run(storage, name, 0, result=False)
    (run_dir / "events.jsonl").write_text(json.dumps({"event": "start", "time": 1010.0, "attempt": 1}) + "\n")
    rows = [{"epoch": e, "train_loss": 1.0, "attempt": 1,
             "timing": {"time": 1010.0 + 20 * e, "data_s": 1.0, "val_s": 3.0, "checkpoint_s": 0.0}} for e in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / ".lease").mkdir()
    (run_dir / ".lease" / "1.json").write_text(json.dumps({"token": 1, "since": 1000.0}))
    runrecords.Records(run_dir).write_result({"status": "succeeded", "duration_s": 60.0, "epochs_completed": 2,
                                              "attempt": 1})
    results = run_dir / "results.jsonl"  # its time, as the attempt wrote it
    results.write_text(json.dumps({"time": 1060.0, "status": "succeeded", "duration_s": 60.0, "attempt": 1}) + "\n")
    return run_dir


def test_the_goodput_table_and_json(tmp_path, capsys):
    """Issue 38: each run's wall time by cause, on the console (and the page), or one JSON object with --json."""
    run_dir = timed_run(tmp_path)
    assert main(["report", str(run_dir)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "raytrain: where the time of timed went:\ngoodput 53.3% of 1m00s" in out
    for line in ("productive training", "start-up (Ray, workers, data)", "data wait", "evaluation", "stopping"):
        assert f"  {line}" in out
    assert "progress: epoch 2/" in out
    [run] = load_runs([run_dir])
    assert summary_lines(run)[4] == ("  goodput 53.3% of 1m00s; besides training: stopping 10.0s, start-up (Ray, "
                                     "workers, data) 10.0s, evaluation 6.0s, data wait 2.0s")
    assert main(["report", str(run_dir), "--json"]) == EXIT_OK
    found = json.loads(capsys.readouterr().out)
    [one] = found["runs"]
    assert found["png"] == str(run_dir / "report.png") and one["status"] == "succeeded"
    assert one["goodput"]["wall_s"] == 60.0 and one["goodput"]["goodput"] == pytest.approx(32 / 60, abs=1e-4)
    assert sum(one["goodput"]["seconds"].values()) == pytest.approx(60.0)
    assert [a["attempt"] for a in one["goodput"]["attempts"]] == [1]


def test_a_run_with_no_metrics_yet_says_so(tmp_path, capsys):
    run_dir = make_run(tmp_path, "fresh", 0, result=False)
    assert main(["report", str(run_dir)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "has no metrics yet" in out and (run_dir / "report.png").is_file()
    [run] = load_runs([run_dir])
    assert "running" in summary_lines(run)[0] and "no metrics yet" in summary_lines(run)[-1]


@pytest.mark.parametrize("setup, args, says", [
    (lambda d: None, ["{d}/missing"], "no such directory"),
    (lambda d: (d / "empty").mkdir(), ["{d}/empty"], "is not a raytrain run directory"),
    (lambda d: (d / "file.txt").write_text("x"), ["{d}/file.txt"], "is not a directory"),
    (lambda d: make_run(d, "r", 2), ["{d}/r", "--out", "{d}/r.pdf"], "the report is a PNG"),
    (lambda d: ((d / "sweep").mkdir(), (d / "sweep" / "tune.json").write_text("{")), ["{d}/sweep"], "tune.json: unreadable"),
    (lambda d: ((d / "cfg").mkdir(), (d / "cfg" / "config.yaml").write_text("a: [")), ["{d}/cfg"], "not valid YAML"),
])
def test_bad_inputs_get_a_clear_error(tmp_path, capsys, setup, args, says):
    setup(tmp_path)
    assert main(["report", *[a.format(d=tmp_path) for a in args]]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("raytrain: error: report: ") and says in err and "Fix:" in err and "Traceback" not in err


def test_a_ray_train_function_run_is_summarised_by_its_own_metrics(tmp_path):
    """raytrain.worker.raytrain_function: the function's name and train_loop_config, its `loss`, no "of N epochs"."""
    run_dir = runrecords.run_dir_of(str(tmp_path), "script")
    cfg = load_config("digits", ["run.name=script"])
    stored = cfg.to_dict()
    stored["loop"] = {"_component_": "train_func.train_func", "train_loop_config": {"lr": 0.01}}
    runrecords.Records(run_dir).write_config(__import__("yaml").safe_dump(stored))
    for epoch in range(3):
        runrecords.Records(run_dir).append_metrics({"epoch": epoch, "loss": 1.0 / (epoch + 1), "accuracy": 0.5})
    runrecords.Records(run_dir).write_result({"status": "succeeded", "duration_s": 5.0, "epochs_completed": 2})
    loaded, png, _ = report([run_dir])
    summary, config, last, _, _ = summary_lines(loaded[0])
    assert summary.startswith("script: succeeded, epoch 2, ") and png.exists()
    assert config.startswith("  Ray Train function train_func.train_func(lr=0.01), 2 workers")
    assert last == "  last: loss 0.3333, accuracy 0.5000"


def test_an_elastic_runs_resizes_are_marked(tmp_path):
    run_dir = make_run(tmp_path, "elastic", 4, resumed_at=2)
    records = runrecords.Records(run_dir)
    records.write_config(dump_yaml(load_config("digits", ["run.name=elastic", "scaling.num_workers=[1, 2]",
                                                          "data.loader=torch"])))
    records.append_event("resize", previous=2, workers=1, epoch=2, step=40)
    records.append_event("start", start_epoch=3, resumed_from_epoch=2, resumed_at_step=40, world_size=1)
    records.append_event("resize", previous=1, workers=2, epoch="bad", step=None)  # an edited file: no position
    loaded, png, _ = report([run_dir])
    lines = summary_lines(loaded[0])
    assert "1..2 (elastic) workers" in lines[1]
    assert lines[-1] == "  workers: 2 -> 1 at epoch 3 step 40, 1 -> 2"
    assert matplotlib.image.imread(png).shape[1] > 1000


def test_a_torchft_runs_lost_replicas_and_heals_are_summed_up(tmp_path):
    run_dir = runrecords.run_dir_of(str(tmp_path), "ft")
    records = runrecords.Records(run_dir)
    records.write_config(dump_yaml(load_config("digits", ["run.name=ft", "scaling.fault_tolerance=torchft"])))
    records.append_event("start", start_epoch=1, resumed_from_epoch=None, world_size=2)
    for epoch, (fewest, most) in enumerate([(2, 2), (1, 2), (1, 1), (1, 2), (2, 2)], start=1):
        records.append_metrics({"epoch": epoch, "train_loss": 1.0, "samples": 1438, "samples_per_s": 1000.0,
                                "epoch_s": 1.0, "replicas_min": fewest, "replicas_max": most})
    records.append_event("healed", rank=1, epoch=4, step=5, from_step=300)
    lines = summary_lines(load_runs([run_dir])[0])
    assert "  replicas (torchft): 3 epoch(s) with fewer than 2 (as few as 1); 1 replacement(s) healed from a live " \
           "peer" in lines
    whole = make_run(tmp_path, "whole", 2)  # a run without replicas says nothing of them
    assert not [line for line in summary_lines(load_runs([whole])[0]) if "replicas" in line]


def function_run(storage, name, rows):
    """A Ray Train function's run directory (raytrain.worker.raytrain_function) holding `rows`."""
    run_dir = runrecords.run_dir_of(str(storage), name)
    stored = load_config("digits", [f"run.name={name}"]).to_dict()
    stored["loop"] = {"_component_": "train_func.train_func", "train_loop_config": {"lr": 0.01}}
    runrecords.Records(run_dir).write_config(__import__("yaml").safe_dump(stored))
    for row in rows:
        runrecords.Records(run_dir).append_metrics(row)
    return run_dir


def test_each_panel_says_what_it_measured_and_a_panel_with_nothing_to_draw_is_left_out_saying_why(tmp_path):
    """Issue 38: a regression run draws no empty accuracy panel, a Ray Train function's `accuracy` is not called
    validation accuracy, and a function's run (no samples/s) draws no empty throughput panel."""
    regression = load_runs([make_run(tmp_path, "regression", 3, accuracy=False)])
    panels, left_out = plan_panels(regression)
    assert [p.key for p in panels] == ["loss", "samples_per_s"]
    assert "train_loss: training loss" in panels[0].title and "val_loss: validation loss" in panels[0].title
    assert "samples trained" in panels[1].title
    assert left_out == [("no accuracy panel: no run reports val_accuracy or accuracy (a regression, or a function "
                         "that measures none)")]

    classifier = load_runs([make_run(tmp_path, "digits", 3)])
    panels, left_out = plan_panels(classifier)
    assert (panels[1].key, panels[1].title) == ("accuracy", "Validation accuracy (val_accuracy: validation accuracy)")
    assert left_out == []

    function = load_runs([function_run(tmp_path, "script", [{"epoch": e, "loss": 1.0 / (e + 1), "accuracy": 0.5}
                                                             for e in range(3)])])
    panels, left_out = plan_panels(function)
    assert [p.key for p in panels] == ["loss", "accuracy"]
    assert panels[0].title == "Loss (loss: as the Ray Train function reported it)"
    assert panels[1].title == "Accuracy (accuracy: as the Ray Train function reported it)"
    assert "validation" not in panels[1].title.lower()
    assert left_out[0].startswith("no throughput panel: no run reports samples_per_s")
    _, png, _ = report([function[0].run_dir])
    height, width, _ = matplotlib.image.imread(png).shape
    assert width > 1000 and height < 700  # one row of panels: no empty one drawn

    both = load_runs([classifier[0].run_dir, function[0].run_dir])  # compared: each curve's key is named
    panels, _ = plan_panels(both)
    assert panels[1].title == ("Accuracy (val_accuracy: validation accuracy; accuracy: as the Ray Train function "
                               "reported it)")
    assert plan_panels(load_runs([make_run(tmp_path, "fresh", 0, result=False)])) == ([panels[0].__class__(
        "loss", [])], [])  # no row yet: the loss panel alone says so, nothing is "left out"


def test_a_resumes_label_is_drawn_whole_inside_the_loss_panel(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.text import Annotation

    import raytrain.driver.report as report_module

    figures = []
    real_close = matplotlib.pyplot.close
    run_dir = make_run(tmp_path, "digits", 12, resumed_at=12)
    records = runrecords.Records(run_dir)
    records.append_event("start", start_epoch=1, resumed_from_epoch=None, world_size=2)  # began again: at 0.5
    try:
        matplotlib.pyplot.close = figures.append  # keep the figure to look at
        report_module.draw(load_runs([run_dir]), tmp_path / "r.png")
    finally:
        matplotlib.pyplot.close = real_close
    [figure] = figures
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    labels = {t.get_text(): t for ax in figure.axes for t in ax.texts if isinstance(t, Annotation)}
    assert set(labels) == {"resumed from epoch 12", "restarted from scratch"}  # at each end of the epochs
    for label in labels.values():
        inside = label.axes.get_window_extent(renderer)
        box = label.get_window_extent(renderer)
        assert inside.y0 <= box.y0 and box.y1 <= inside.y1 and inside.x0 <= box.x0 and box.x1 <= inside.x1, \
            label.get_text()
    real_close(figure)
