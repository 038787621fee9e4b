"""`raytrain report`: a PNG (and an HTML page embedding it) of one or more run directories: training and
validation loss, validation accuracy and throughput per epoch, worker-group restarts and resumes (events.jsonl)
marked on the curves, and each run's summary (config, status, checkpoints, duration, goodput). Each run's goodput
(raytrain.rundir.goodput: its wall time split into productive training and the rest by cause) is a line of the
summary, a table in the page and on the console, and `--json`'s object. Each panel's title names the
metrics it draws and what they measured (a Ray Train function's own `loss` and `accuracy` are drawn as what it
reported, not as validation); a panel no run has a metric for is left out, with a line saying so. Each run's
section names `raytrain why RUN_DIR`, the post-mortem of its attempts (raytrain.rundir.postmortem).

Several run directories share one plot, to compare runs; a `raytrain tune` directory (it holds tune.json) stands
for its trials, the best one drawn bold. It reads only the files of the run layout (raytrain.rundir.layout), so it works
on a finished run, a running one and one copied off the shared volume.
"""

from __future__ import annotations

import base64
import html
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from raytrain.checkpoint import checkpoints
from raytrain.rundir import goodput, layout, runrecords, storage
from raytrain.spec import components


class ReportError(Exception):
    """The input is not something to report on; the message names the path and the fix."""


@dataclass
class RunData:
    name: str
    run_dir: Path
    rows: list[dict]
    events: list[dict]
    result: Optional[dict]
    config: dict
    checkpoints: list[Path]
    best: bool = False
    params: dict = field(default_factory=dict)  # a tune trial's sampled keys
    _goodput: Optional[goodput.Goodput] = field(default=None, repr=False)

    @property
    def restarts(self) -> list[dict]:
        """Worker-group starts after the first: each either resumed from a checkpoint or began again at epoch 1."""
        return [e for e in self.events if e.get("event") == "start"][1:]

    @property
    def resizes(self) -> list[dict]:
        """An elastic run's changes of worker count (raytrain.worker.elastic), each at the position its new group resumed."""
        return [e for e in self.events if e.get("event") == "resize"]

    @property
    def goodput(self) -> goodput.Goodput:
        """Where the run's wall time went, from its records (computed once)."""
        if self._goodput is None:
            epochs = (self.config.get("train") or {}).get("epochs")
            self._goodput = goodput.read(self.run_dir, None if _ray_train_function(self) else epochs)
        return self._goodput

    @property
    def status(self) -> str:
        return self.result["status"] if self.result else "running (or stopped before it finished)"

    @property
    def duration_s(self) -> Optional[float]:
        if self.result and "duration_s" in self.result:
            return float(self.result["duration_s"])
        times = [e["time"] for e in self.events if "time" in e]
        return time.time() - min(times) if times else None


def _read_config(run_dir: Path) -> dict:
    path = run_dir / layout.CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ReportError(f"{path}: not valid YAML ({err.__class__.__name__}). Fix: restore the run's "
                          f"config.yaml (it is written by `raytrain run`)") from None
    return loaded if isinstance(loaded, dict) else {}


def load_run(run_dir: Path, name: Optional[str] = None) -> RunData:
    run_dir = storage.as_path(run_dir)
    if not run_dir.is_dir():
        why = "is not a directory" if run_dir.exists() else "no such directory"
        raise ReportError(f"{run_dir}: {why}. Fix: pass a run directory, STORAGE/NAME (e.g. runs/digits)")
    markers = (layout.CONFIG_FILE, layout.METRICS_FILE, layout.RESULT_FILE)
    if not any((run_dir / m).is_file() for m in markers):
        raise ReportError(f"{run_dir} is not a raytrain run directory (it has none of {', '.join(markers)}). "
                          f"Fix: pass STORAGE/NAME of a run started with `raytrain run`, `local` or `tune`")
    try:
        result = runrecords.read_result(run_dir)
    except ValueError:
        result = None  # being rewritten: read as still running
    return RunData(name=name or run_dir.name, run_dir=run_dir, rows=runrecords.read_metrics(run_dir),
                   events=runrecords.read_events(run_dir), result=result, config=_read_config(run_dir),
                   checkpoints=checkpoints.committed(run_dir))


def load_runs(paths: list[Path]) -> list[RunData]:
    """The runs to draw: each path a run directory, or a tune directory standing for its trials."""
    loaded: list[RunData] = []
    for path in paths:
        path = storage.as_path(path)
        tune_file = path / layout.TUNE_FILE
        if tune_file.is_file():
            loaded.extend(load_tune(tune_file))
        else:
            loaded.append(load_run(path))
    return loaded


def load_tune(tune_file: Path) -> list[RunData]:

    try:
        summary = json.loads(tune_file.read_text())
        trials = summary["trials"]
    except (ValueError, KeyError, TypeError) as err:
        raise ReportError(f"{tune_file}: unreadable ({err.__class__.__name__}). Fix: pass the trials' run "
                          f"directories (STORAGE/NAME-trial-<id>) instead") from None
    best_id = (summary.get("best") or {}).get("trial_id")
    root, sweep = tune_file.parent.parent, tune_file.parent.name
    found = []
    for trial in trials:
        trial_dir = root / f"{sweep}-trial-{trial['trial_id']}"
        if not trial_dir.is_dir():
            continue  # a trial that never started has no directory
        run = load_run(trial_dir, name=f"trial {trial['trial_id']}")
        run.best, run.params = trial["trial_id"] == best_id, dict(trial.get("params") or {})
        found.append(run)
    if not found:
        raise ReportError(f"{tune_file}: none of its {len(trials)} trials has a run directory beside it "
                          f"({storage}/{sweep}-trial-*). Fix: report on the trial directories where they are")
    return found


# ----------------------------------------------------------------------------------------------------------
# text


def _fmt_duration(seconds: Optional[float]) -> str:
    return "unknown" if seconds is None else goodput.duration_text(seconds)


def component_name(section: dict, name: str) -> str:
    """What a stored config section trains with; configs stored before components name it with `name:`."""
    path = section.get(components.COMPONENT_KEY) or section.get(components.LEGACY_NAME_KEY)
    return components.short_name(components.canonical_path(str(path), name), name) if path else "?"


def _ray_train_function(run: RunData) -> Optional[str]:
    """The import path of a run's Ray Train function (raytrain.worker.raytrain_function), else None."""
    loop = run.config.get("loop") or {}
    return loop.get(components.COMPONENT_KEY) if isinstance(loop, dict) and "train_loop_config" in loop else None


def _workers(scaling: dict) -> str:
    count = scaling.get("num_workers", "?")
    return f"{count[0]}..{count[-1]} (elastic)" if isinstance(count, list) and count else str(count)


def config_line(run: RunData) -> str:
    c = run.config
    model, data, train, scaling = (c.get(k, {}) or {} for k in ("model", "data", "train", "scaling"))
    function = _ray_train_function(run)
    if function:
        settings = ", ".join(f"{k}={v}" for k, v in (c["loop"].get("train_loop_config") or {}).items())
        return f"Ray Train function {function}({settings[:120]}), {_workers(scaling)} workers"
    parts = [f"{component_name(model, 'model')} on {component_name(data, 'data')}",
             f"{train.get('optimizer', '?')} lr {train.get('lr', '?')}",
             f"batch {train.get('batch_size', '?')}", f"{_workers(scaling)} workers"]
    return ", ".join(parts)


def _resize_text(event: dict) -> str:
    epoch, step = event.get("epoch"), event.get("step")
    where = f" at epoch {epoch + 1} step {step}" if isinstance(epoch, int) and isinstance(step, int) else ""
    return f"{event.get('previous', '?')} -> {event.get('workers', '?')}{where}"


def goodput_line(run: RunData) -> str:
    """The goodput and its largest causes, in one line (the table: goodput.table)."""
    found = run.goodput
    if found.goodput is None:
        return "goodput: no records with times yet"
    causes = sorted(((s, c) for c, s in found.seconds.items() if c != "training" and s >= 0.05), reverse=True)
    parts = [f"{goodput.LABELS[c]} {_fmt_duration(s)}" for s, c in causes[:4]]
    return (f"goodput {found.goodput * 100:.1f}% of {_fmt_duration(found.wall_s)}"
            + (f"; besides training: {', '.join(parts)}" if parts else ""))


def summary_lines(run: RunData) -> list[str]:
    epochs = (run.config.get("train") or {}).get("epochs", "?")
    done = run.rows[-1]["epoch"] if run.rows else 0
    last = run.rows[-1] if run.rows else {}
    of = "" if _ray_train_function(run) else f"/{epochs}"  # a Ray Train function counts its own epochs
    lines = [f"{run.name}{'  (best)' if run.best else ''}: {run.status}, epoch {done}{of}, "
             f"{_fmt_duration(run.duration_s)} (its last invocation)"]
    if run.params:
        lines.append("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in run.params.items()))
    lines.append("  " + config_line(run) + f"  ({run.run_dir})")
    scores = [f"{k} {last[k]:.4f}" for k in ("train_loss", "loss", "val_loss", "val_accuracy", "accuracy")
              if isinstance(last.get(k), (int, float))]
    if scores:
        lines.append("  last: " + ", ".join(scores))
    resumes = [e for e in run.restarts if e.get("resumed_from_epoch") is not None]
    ckpt = f"{len(run.checkpoints)} checkpoint(s), newest {run.checkpoints[0].name}" if run.checkpoints else "no checkpoint"
    lines.append(f"  {ckpt}; {len(run.restarts)} restart(s), {len(resumes)} resumed")
    lines.append("  " + goodput_line(run))
    if run.resizes:
        lines.append("  workers: " + ", ".join(map(_resize_text, run.resizes)))
    heals = [e for e in run.events if e.get("event") == "healed"]
    fewest = [row["replicas_min"] for row in run.rows if isinstance(row.get("replicas_min"), int)]
    if fewest:  # scaling.fault_tolerance torchft (raytrain.worker.replicas): lost replicas and their replacements
        full = max(int(row.get("replicas_max") or 0) for row in run.rows)
        short = sum(1 for n in fewest if n < full)
        if heals or short:
            lines.append(f"  replicas (torchft): {short} epoch(s) with fewer than {full} (as few as {min(fewest)}); "
                         f"{len(heals)} replacement(s) healed from a live peer")
    if run.result and run.result.get("error"):
        lines.append("  error: " + run.result["error"][:160])
    if not run.rows:
        lines.append("  no metrics yet (metrics.jsonl is empty or missing)")
    return lines


# ----------------------------------------------------------------------------------------------------------
# drawing

# What each metric a run may report measured, as a figure names it. A Ray Train function's `loss` and `accuracy`
# are what the function measured (on its training data or a validation split: it does not say), never called
# validation here.
MEASURED = {
    "train_loss": "train_loss: training loss",
    "val_loss": "val_loss: validation loss (dashed)",
    "loss": "loss: as the Ray Train function reported it",
    "val_accuracy": "val_accuracy: validation accuracy",
    "accuracy": "accuracy: as the Ray Train function reported it",
    "samples_per_s": "samples/s of all workers: samples trained in each epoch's attempt over its training time",
}
PANEL_NAMES = {"loss": "Loss", "accuracy": "Accuracy", "samples_per_s": "Training throughput"}


@dataclass
class Panel:
    key: str  # "loss", "accuracy" or "samples_per_s"
    series: list[tuple[RunData, str, bool]]  # (run, metric key, dashed) drawn in it

    @property
    def title(self) -> str:
        """The panel's name and what each of its curves measured (the metric keys, as in metrics.jsonl)."""
        keys = list(dict.fromkeys(key for _, key, _ in self.series))
        if self.key == "samples_per_s":
            return f"{PANEL_NAMES[self.key]} ({MEASURED['samples_per_s']})"
        name = "Validation accuracy" if keys == ["val_accuracy"] else PANEL_NAMES[self.key]
        return f"{name} ({'; '.join(MEASURED[k] for k in keys)})"


def _loss_key(run: RunData) -> str:
    return "train_loss" if any("train_loss" in r for r in run.rows) else "loss"


def _accuracy_key(run: RunData) -> str:
    return "val_accuracy" if any("val_accuracy" in r for r in run.rows) else "accuracy"


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs = [r["epoch"] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    ys = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return xs, ys


def plan_panels(loaded: list[RunData]) -> tuple[list[Panel], list[str]]:
    """The panels with something to draw (the loss panel always: it says when no epoch finished yet), and a line
    for each panel left out, saying why (a regression run has no accuracy; a Ray Train function reports no
    throughput)."""
    panels = {key: Panel(key, []) for key in PANEL_NAMES}
    for run in loaded:
        for panel, key, dashed in (("loss", _loss_key(run), False), ("loss", "val_loss", True),
                                   ("accuracy", _accuracy_key(run), False), ("samples_per_s", "samples_per_s", False)):
            if _series(run.rows, key)[0]:
                panels[panel].series.append((run, key, dashed))
    left_out = []
    if any(run.rows for run in loaded):
        if not panels["accuracy"].series:
            left_out.append("no accuracy panel: no run reports val_accuracy or accuracy (a regression, or a function "
                            "that measures none)")
        if not panels["samples_per_s"].series:
            left_out.append("no throughput panel: no run reports samples_per_s (a Ray Train function's rows hold "
                            "what it reports)")
    drawn = [panels["loss"]] + [p for p in (panels["accuracy"], panels["samples_per_s"]) if p.series]
    return drawn, left_out


def draw(loaded: list[RunData], out: Path) -> Path:
    """Write the PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels, left_out = plan_panels(loaded)
    summaries = [line for run in loaded for line in summary_lines(run)] + left_out
    text_height = 0.18 * len(summaries) + 0.4
    keys = [p.key for p in panels]
    rows = 2 if "samples_per_s" in keys else 1
    fig = plt.figure(figsize=(13, 3.75 * rows + 0.5 + text_height))
    grid = fig.add_gridspec(rows + 1, 2, height_ratios=[3.2] * rows + [text_height], hspace=0.5, wspace=0.18)
    axes = {"loss": fig.add_subplot(grid[0, 0] if "accuracy" in keys else grid[0, :])}
    if "accuracy" in keys:
        axes["accuracy"] = fig.add_subplot(grid[0, 1])
    if "samples_per_s" in keys:
        axes["samples_per_s"] = fig.add_subplot(grid[1, :])
    text_ax = fig.add_subplot(grid[rows, :])
    text_ax.axis("off")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    many = len(loaded) > 1
    marks: list[tuple[float, str, str]] = []  # (x, label, colour) of each restart and resume
    for i, run in enumerate(loaded):
        color = colors[i % len(colors)]
        width = 2.6 if run.best or not many else 1.3
        alpha = 1.0 if run.best or not many else 0.75
        marker = "o" if len(run.rows) <= 40 else None  # thousands of epochs: lines only
        label = run.name + (" (best)" if run.best else "")
        style = dict(color=color, linewidth=width, alpha=alpha, marker=marker, markersize=3.5,
                     zorder=3 if run.best else 2)  # the best trial drawn over the others
        for panel in panels:
            for _, key, dashed in (series for series in panel.series if series[0] is run):
                xs, ys = _series(run.rows, key)
                if many:  # one colour per run, named once in the figure's legend
                    line_label = None if dashed else label
                    line_style = style
                else:  # one run: validation in a colour of its own
                    line_label = {"train_loss": "train", "loss": "loss (reported)", "val_loss": "validation"}.get(key)
                    line_style = {**style, "color": colors[1]} if dashed else style
                axes[panel.key].plot(xs, ys, linestyle="--" if dashed else "-", label=line_label, **line_style)
        mark = color if many else "tab:red"  # one run: restarts in a colour no curve has
        starts = [e for e in run.events if e.get("event") == "start"]
        previous_size = starts[0].get("world_size") if starts else None
        for event in run.restarts:
            at = event.get("resumed_from_epoch")
            x = (at if at is not None else 0) + 0.5
            note = f"resumed from epoch {at}" if at is not None else "restarted from scratch"
            if event.get("world_size") != previous_size and previous_size is not None:  # an elastic resize
                note += f" on {event.get('world_size')} workers"
            previous_size = event.get("world_size")
            for ax in axes.values():
                ax.axvline(x, color=mark, linestyle=":", linewidth=1.4, alpha=0.9)
            marks.append((x, note, mark))
        if run.best and "accuracy" in axes:
            xs, ys = _series(run.rows, _accuracy_key(run))
            if xs:
                axes["accuracy"].annotate("best", (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 4),
                                          fontsize=9, fontweight="bold", color=color)
    if not many and panels[0].series:
        axes["loss"].legend(fontsize=8, loc="upper right")
    for panel in panels:
        ax = axes[panel.key]
        ax.set_title(panel.title, fontsize=9, loc="left", wrap=True)
        ax.set_xlabel("epoch", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
        if not panel.series:  # the loss panel of runs with no row yet, or whose rows hold no loss
            note = ("no loss in these runs' metrics" if any(run.rows for run in loaded)
                    else "no metrics yet (no epoch finished)")
            ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="gray")
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _label_marks(axes, marks)
    if "accuracy" in axes:
        axes["accuracy"].set_ylim(top=min(1.0, axes["accuracy"].get_ylim()[1]) + 0.02)
    if many:
        named = {}
        for ax in axes.values():
            for handle, name in zip(*ax.get_legend_handles_labels()):
                named.setdefault(name, handle)
        if named:
            fig.legend(list(named.values()), list(named), loc="upper right", fontsize=8, ncol=min(4, len(named)))
    text_ax.text(0, 1, "\n".join(summaries), va="top", ha="left", family="monospace", fontsize=8,
                 transform=text_ax.transAxes)
    title = loaded[0].name if not many else f"{len(loaded)} runs"
    fig.suptitle(f"raytrain report: {title}", x=0.01, ha="left", fontsize=12, fontweight="bold")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def _label_marks(axes: dict, marks: list[tuple[float, str, str]]) -> None:
    """Each restart's label in the loss panel, whole: every panel's epochs widened to show the marks (a resume
    from epoch 0 is left of epoch 1), the label on the side of its line with room, below the panel's top edge, on
    a backing of its own (never hidden by a curve)."""
    if not marks:
        return
    for ax in axes.values():
        left, right = ax.get_xlim()
        ax.set_xlim(min(left, min(x for x, _, _ in marks) - 0.5), max(right, max(x for x, _, _ in marks) + 0.5))
    left, right = axes["loss"].get_xlim()
    for x, note, color in marks:
        ha = "right" if x > (left + right) / 2 else "left"
        axes["loss"].annotate(note, xy=(x, 0.97), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                              va="top", ha=ha, color=color, zorder=5,
                              bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none",
                                    "alpha": 0.8})


def why_command(run: RunData) -> str:
    """The command that says why each attempt of `run` ended (raytrain.rundir.postmortem)."""
    return f"raytrain why {run.run_dir}"


def write_html(loaded: list[RunData], png: Path) -> Path:
    page = png.with_suffix(".html")
    image = base64.b64encode(png.read_bytes()).decode()
    sections = []
    for run in loaded:
        config = (run.run_dir / layout.CONFIG_FILE)
        config_text = config.read_text() if config.is_file() else "(no config.yaml)"
        sections.append(f"<h2>{html.escape(run.name)}</h2><pre>{html.escape(chr(10).join(summary_lines(run)))}</pre>"
                        f"<h3>Where its time went</h3><pre>{html.escape(chr(10).join(goodput.table(run.goodput)))}"
                        f"</pre>"
                        f"<p>{html.escape(str(run.run_dir))}</p><p>Why each attempt ended (the rank that failed "
                        f"first, its exception and last lines): <code>{html.escape(why_command(run))}</code></p>"
                        f"<details><summary>config.yaml</summary>"
                        f"<pre>{html.escape(config_text)}</pre></details>")
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>raytrain report</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:.6em}</style></head><body>"
        f"<h1>raytrain report</h1><img alt='training curves' style='max-width:100%' "
        f"src='data:image/png;base64,{image}'>{''.join(sections)}</body></html>\n", encoding="utf-8")
    return page


def default_out(paths: list[Path]) -> Path:
    return (storage.output_dir(paths[0]) if len(paths) == 1 else Path.cwd()) / "report.png"


def report(paths: list[Path], out: Optional[Path] = None) -> tuple[list[RunData], Path, Path]:
    """Load, draw and write; returns (runs, png, html)."""
    loaded = load_runs(paths)
    png = Path(out) if out else default_out(paths)
    if png.suffix.lower() != ".png":
        raise ReportError(f"--out {png}: the report is a PNG. Fix: name the file *.png (the HTML page goes beside it)")
    draw(loaded, png)
    return loaded, png, write_html(loaded, png)
