"""The sweep's report: ``python -m simulation report --in DIR --out DIR``.

Reads the Parquet a sweep wrote (``results/``, ``aggregates/``, ``events/``, ``sweep.json``; see
simulation/sweep.py) with pyarrow + pandas (no Spark needed: the tables are small) and writes
into ``--out``:

* ``index.html`` and ``report.md``: the same content, HTML and Markdown;
* ``convergence.png``, ``downtime.png``, ``outage.png``, ``rebalances.png``: distributions per
  scenario, assignor and size (box plots);
* ``moved.png``: items moved per run vs the minimum that had to move.

Content: the sweep's parameters; the characterisation of seed 003 ("Incremental Cooperative
Rebalancing: Support and Policies": Kubernetes process death, rolling bounce, scale up/down)
with the measured numbers of Eager vs IncrementalCooperative; the per scenario x assignor x size
aggregates; every run with an invariant violation or an error (and the first runs that did not
converge), each with the command that replays it.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

ASSIGNOR_LABEL = {"eager": "Eager", "incremental": "IncrementalCooperative"}
ASSIGNOR_COLOR = {"eager": "#d62728", "incremental": "#1f77b4"}
MAX_LISTED_RUNS = 200  # violations / errors listed in the report (all are in results/)
MAX_UNCONVERGED_LISTED = 20


def replay_command(scenario: str, assignor: str, workers: int, tasks: int, seed: int) -> str:
    return (f"python -m simulation replay {seed} --scenario {scenario} --assignor {assignor} "
            f"--workers {workers} --tasks {tasks}")


# -- seed 003's characterisation -----------------------------------------------------------------


@dataclass(frozen=True)
class UseCase:
    key: str
    title: str
    tag: str  # simulation/scenarios.py descriptions start "Seed 003 '<tag>'"
    keywords: tuple[str, ...]  # else matched against scenario names
    eager: str  # what seed 003 says of the stop-the-world protocol (its Motivation)
    design1: str  # Design I: Simple Cooperative Rebalancing
    design2: str  # Design II: Deferred Resolution of Imbalance (KIP-415, our IncrementalCooperative)


STOP_THE_WORLD = ("NO: stop-the-world, every member gives up all its resources at every rebalance "
                  "(seed 003, Motivation)")
USE_CASES: tuple[UseCase, ...] = (
    UseCase(
        "process_death", "Kubernetes process death", "kubernetes process death",
        ("process-death", "process_death"),
        STOP_THE_WORLD,
        "doesn't help if restoring the process takes longer than the rejoin; better than before, "
        "only the node's partitions are affected",
        "YES: waits (ScheduledRebalanceTimeout) for the process to reappear before reassigning; "
        "the outage is limited by how fast the process comes back",
    ),
    UseCase(
        "rolling_bounce", "Rolling bounce", "rolling bounce", ("rolling",),
        STOP_THE_WORLD,
        "IMPROVED: still multiple rebalances, but only the bounced node's partitions move",
        "YES: effectively the same as process death; multiple rebalances per bounce, but they "
        "don't have the same impact",
    ),
    UseCase(
        "scale", "Scale up/down", "scale up/down", ("scale",),
        STOP_THE_WORLD,
        "YES: everyone rebalances but only the affected partitions stop temporarily",
        "YES: scale up is detected as a new member and reassigned immediately; scale down takes "
        "the ScheduledRebalanceTimeout to resolve (the member must really be gone)",
    ),
)


def _scenario_descriptions() -> dict[str, str]:
    """Scenario name -> its description, when the simulator is importable (the report also works
    on Parquet alone, then by names)."""
    try:
        import simulation

        scenarios = dict(getattr(simulation, "SCENARIOS", {}))
    except Exception:
        return {}
    return {name: str(getattr(s, "description", "") or "").lower() for name, s in scenarios.items()}


def use_case_of(scenario: str, descriptions: dict[str, str] | None = None) -> UseCase | None:
    """The seed 003 use case a scenario measures: its description says "Seed 003 '<use case>'",
    else its name has a keyword (``process-death``, ``rolling``, ``scale``)."""
    text = (descriptions or {}).get(scenario, "")
    for case in USE_CASES:
        if f"seed 003 '{case.tag}'" in text:
            return case
    name = scenario.lower()
    for case in USE_CASES:
        if any(k in name for k in case.keywords):
            return case
    return None


# -- loading ------------------------------------------------------------------------------------


@dataclass
class SweepData:
    results: pd.DataFrame
    aggregates: pd.DataFrame
    events: pd.DataFrame | None
    manifest: dict[str, Any]


def _read(path: Path) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    for column in ("scenario", "assignor"):  # hive partition columns come back as categories
        if column in frame.columns:
            frame[column] = frame[column].astype(str)
    return frame


def load(in_dir: str | Path) -> SweepData:
    in_dir = Path(in_dir)
    if not (in_dir / "results").is_dir():
        raise FileNotFoundError(f"{in_dir}/results: not a sweep output directory (run `sweep` first)")
    results = _read(in_dir / "results").sort_values(["scenario", "assignor", "workers", "tasks", "seed"])
    results = results.reset_index(drop=True)
    for column in ("violation", "error"):
        results[column] = results[column].fillna("").astype(str)
    aggregates = _read(in_dir / "aggregates") if (in_dir / "aggregates").is_dir() else pd.DataFrame()
    events_dir = in_dir / "events"
    events = _read(events_dir) if events_dir.is_dir() and any(events_dir.rglob("*.parquet")) else None
    manifest_path = in_dir / "sweep.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    return SweepData(results, aggregates, events, manifest)


# -- plots --------------------------------------------------------------------------------------


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 2)
    return math.ceil(n / cols), cols


def _box_figure(results: pd.DataFrame, column: str, title: str, ylabel: str, path: Path,
                only_converged: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    scenarios = sorted(results["scenario"].unique())
    rows, cols = _grid(len(scenarios))
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(scenarios):]:
        ax.set_visible(False)
    for ax, scenario in zip(axes.flat, scenarios, strict=False):
        sub = results[results["scenario"] == scenario]
        if only_converged:
            sub = sub[sub["converged"].astype(bool)]
        data, labels, colors = [], [], []
        for (workers, tasks), size_rows in sub.groupby(["workers", "tasks"], sort=True):
            for assignor in sorted(size_rows["assignor"].unique()):
                values = size_rows.loc[size_rows["assignor"] == assignor, column].dropna().to_numpy()
                if len(values) == 0:
                    continue
                data.append(values)
                labels.append(f"{workers}:{tasks}\n{assignor}")
                colors.append(ASSIGNOR_COLOR.get(assignor, "#7f7f7f"))
        if data:
            box = ax.boxplot(data, patch_artist=True, showfliers=True, widths=0.6,
                             flierprops={"markersize": 2, "alpha": 0.4})
            for patch, color in zip(box["boxes"], colors, strict=True):
                patch.set_facecolor(color)
                patch.set_alpha(0.55)
            ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(scenario, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    handles = [Patch(facecolor=ASSIGNOR_COLOR[a], alpha=0.55, label=ASSIGNOR_LABEL[a]) for a in ASSIGNOR_COLOR
               if a in set(results["assignor"])]
    fig.legend(handles=handles, loc="upper right", fontsize=9)
    fig.suptitle(title + "  (x: WORKERS:TASKS and assignor)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / fig.get_figheight()))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _moved_figure(results: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = sorted(results["scenario"].unique())
    rows, cols = _grid(len(scenarios))
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(scenarios):]:
        ax.set_visible(False)
    for ax, scenario in zip(axes.flat, scenarios, strict=False):
        sub = results[(results["scenario"] == scenario) & (results["error"] == "")]
        means = sub.groupby(["workers", "tasks", "assignor"], sort=True)[["moved", "moved_min"]].mean()
        sizes = sorted({(w, t) for w, t, _ in means.index})
        assignors = sorted({a for _, _, a in means.index})
        width = 0.8 / max(len(assignors), 1)
        for j, assignor in enumerate(assignors):
            xs, moved, minimum = [], [], []
            for i, (w, t) in enumerate(sizes):
                if (w, t, assignor) in means.index:
                    xs.append(i + (j - (len(assignors) - 1) / 2) * width)
                    moved.append(means.loc[(w, t, assignor), "moved"])
                    minimum.append(means.loc[(w, t, assignor), "moved_min"])
            ax.bar(xs, moved, width=width * 0.95, color=ASSIGNOR_COLOR.get(assignor, "#7f7f7f"), alpha=0.6,
                   label=f"{ASSIGNOR_LABEL.get(assignor, assignor)}: moved")
            ax.scatter(xs, minimum, marker="_", s=400, color="black", zorder=3,
                       label="minimum that had to move" if j == 0 else None)
        ax.set_xticks(range(len(sizes)), [f"{w}:{t}" for w, t in sizes], fontsize=8)
        ax.set_title(scenario, fontsize=10)
        ax.set_ylabel("items moved per run (mean)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Items moved vs the minimum  (x: WORKERS:TASKS)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / fig.get_figheight()))
    fig.savefig(path, dpi=90)
    plt.close(fig)


FIGURES = (
    ("convergence.png", "Convergence time (converged runs)"),
    ("downtime.png", "Task downtime per run"),
    ("outage.png", "Longest single task outage per run"),
    ("rebalances.png", "Rebalances per run"),
    ("moved.png", "Items moved vs the minimum"),
)


def make_figures(results: pd.DataFrame, out: Path) -> list[tuple[str, str]]:
    ok = results[results["error"] == ""]
    _box_figure(ok, "convergence_ms", "Convergence time", "ms (simulated)", out / "convergence.png",
                only_converged=True)
    _box_figure(ok, "downtime_ms", "Task downtime", "task-ms not running", out / "downtime.png")
    _box_figure(ok, "longest_outage_ms", "Longest outage of one task", "ms", out / "outage.png")
    _box_figure(ok, "rebalances", "Rebalances", "rebalances per run", out / "rebalances.png")
    _moved_figure(results, out / "moved.png")
    return list(FIGURES)


# -- tables -------------------------------------------------------------------------------------


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    code_columns: tuple[int, ...] = ()  # rendered as code

    def markdown(self) -> str:
        def cell(i: int, text: str) -> str:
            text = text.replace("|", "\\|").replace("\n", " ")
            return f"`{text}`" if i in self.code_columns and text else text

        lines = ["| " + " | ".join(self.headers) + " |", "|" + "---|" * len(self.headers)]
        lines += ["| " + " | ".join(cell(i, c) for i, c in enumerate(row)) + " |" for row in self.rows]
        return "\n".join(lines)

    def html(self, css_class: str = "") -> str:
        def cell(i: int, text: str) -> str:
            text = html.escape(text)
            return f"<td><code>{text}</code></td>" if i in self.code_columns and text else f"<td>{text}</td>"

        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "\n".join(
            "<tr>" + "".join(cell(i, c) for i, c in enumerate(row)) + "</tr>" for row in self.rows
        )
        return f'<table class="{css_class}"><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>'


def _num(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if digits == 0:
        return f"{float(value):,.0f}"
    return f"{float(value):,.{digits}f}"


@dataclass
class Pooled:
    """One scenario x assignor over all sizes and seeds."""

    runs: int
    converged_ratio: float
    rebalances_mean: float
    convergence_p50: float
    convergence_p95: float
    downtime_mean: float
    outage_p95: float
    moved_mean: float
    moved_min_mean: float
    double_running_max: float
    violations: int

    @property
    def moved_factor(self) -> float:
        return self.moved_mean / self.moved_min_mean if self.moved_min_mean else float("nan")


def pooled(results: pd.DataFrame, scenario: str, assignor: str) -> Pooled | None:
    sub = results[(results["scenario"] == scenario) & (results["assignor"] == assignor)]
    if sub.empty:
        return None
    ok = sub[sub["error"] == ""]
    conv = ok.loc[ok["converged"].astype(bool), "convergence_ms"]
    return Pooled(
        runs=len(sub),
        converged_ratio=float(ok["converged"].astype(bool).sum()) / len(sub),
        rebalances_mean=float(ok["rebalances"].mean()),
        convergence_p50=float(conv.quantile(0.5)) if len(conv) else float("nan"),
        convergence_p95=float(conv.quantile(0.95)) if len(conv) else float("nan"),
        downtime_mean=float(ok["downtime_ms"].mean()),
        outage_p95=float(ok["longest_outage_ms"].quantile(0.95)),
        moved_mean=float(ok["moved"].mean()),
        moved_min_mean=float(ok["moved_min"].mean()),
        double_running_max=float(ok["double_running_ms"].max()),
        violations=int((sub["violation"] != "").sum()),
    )


def _measured(p: Pooled | None) -> list[str]:
    """The measured cells of one scenario x assignor (see CHARACTERISATION_HEADERS)."""
    if p is None:
        return ["not swept"] + ["–"] * 7
    factor = "" if math.isnan(p.moved_factor) else f" ({p.moved_factor:.1f}x)"
    return [
        f"{p.rebalances_mean:.1f}",
        f"{p.converged_ratio:.0%}",
        f"{_num(p.convergence_p50)} / {_num(p.convergence_p95)}",
        _num(p.downtime_mean),
        _num(p.outage_p95),
        f"{p.moved_mean:.1f} / {p.moved_min_mean:.1f}{factor}",
        _num(p.double_running_max),
        str(p.violations),
    ]


def verdict(eager: Pooled | None, incremental: Pooled | None) -> str:
    """Does IncrementalCooperative measurably help in this use case, compared with Eager?"""
    if eager is None or incremental is None:
        return "n/a (both assignors needed)"
    parts = []
    if eager.downtime_mean > 0:
        ratio = incremental.downtime_mean / eager.downtime_mean
        parts.append(f"downtime {ratio:.2f}x Eager's")
    else:
        ratio = 1.0 if incremental.downtime_mean == 0 else math.inf
        parts.append("no downtime with Eager" if incremental.downtime_mean == 0 else "Eager had no downtime")
    parts.append(f"moved {incremental.moved_mean:.1f} vs {eager.moved_mean:.1f}")
    parts.append(f"rebalances {incremental.rebalances_mean:.1f} vs {eager.rebalances_mean:.1f}")
    if ratio < 0.9 and incremental.moved_mean <= eager.moved_mean:
        word = "YES"
    elif ratio > 1.1:
        word = "NO"
    else:
        word = "SIMILAR"
    return f"{word}: " + ", ".join(parts)


CHARACTERISATION_HEADERS = [
    "use case (seed 003)", "scenario", "assignor", "seed 003 says", "rebalances (mean)", "converged",
    "convergence p50 / p95 ms", "task downtime (task-ms, mean)", "longest outage p95 ms",
    "moved / min (mean)", "double-running max ms", "violations", "measured: does incremental help?",
]


def characterisation(results: pd.DataFrame) -> Table:
    """Seed 003's use cases x {Eager, IncrementalCooperative}: what seed 003 says of the design
    and what the sweep measured (pooled over sizes and seeds), with a verdict per scenario."""
    descriptions = _scenario_descriptions()
    rows = []
    by_case: dict[str, list[str]] = {}
    for scenario in sorted(results["scenario"].unique()):
        case = use_case_of(scenario, descriptions)
        if case is not None:
            by_case.setdefault(case.key, []).append(scenario)
    for case in USE_CASES:
        scenarios = by_case.get(case.key, [])
        if not scenarios:
            rows.append([case.title, "(not in this sweep)", ASSIGNOR_LABEL["eager"], case.eager]
                        + ["–"] * 9)
            rows.append([case.title, "(not in this sweep)", ASSIGNOR_LABEL["incremental"], case.design2]
                        + ["–"] * 9)
            continue
        for scenario in scenarios:
            eager = pooled(results, scenario, "eager")
            incremental = pooled(results, scenario, "incremental")
            rows.append([case.title, scenario, ASSIGNOR_LABEL["eager"], case.eager, *_measured(eager), ""])
            rows.append([case.title, scenario, ASSIGNOR_LABEL["incremental"], case.design2,
                         *_measured(incremental), verdict(eager, incremental)])
    return Table(list(CHARACTERISATION_HEADERS), rows)


AGGREGATE_COLUMNS = (
    ("scenario", "scenario", None), ("assignor", "assignor", None), ("workers", "W", None),
    ("tasks", "T", None), ("runs", "runs", 0), ("converged_ratio", "converged", "pct"),
    ("convergence_p50", "conv p50 ms", 0), ("convergence_p95", "conv p95 ms", 0),
    ("convergence_max", "conv max ms", 0), ("rebalances_mean", "rebalances", 2),
    ("downtime_mean", "downtime mean", 0), ("downtime_p95", "downtime p95", 0),
    ("longest_outage_p95", "outage p95 ms", 0), ("moved_mean", "moved", 2),
    ("moved_min_mean", "moved min", 2), ("double_running_max", "double-run max ms", 0),
    ("violations", "violations", 0), ("errors", "errors", 0),
)


def aggregates_table(aggregates: pd.DataFrame) -> Table:
    rows = []
    for record in aggregates.to_dict("records"):
        row = []
        for column, _, digits in AGGREGATE_COLUMNS:
            value = record.get(column)
            if digits is None:
                row.append(str(value))
            elif digits == "pct":
                row.append("–" if value is None else f"{float(value):.1%}")
            else:
                row.append(_num(value, digits))
        rows.append(row)
    return Table([label for _, label, _ in AGGREGATE_COLUMNS], rows)


def _run_rows(frame: pd.DataFrame, what: str) -> Table:
    rows = []
    for r in frame.itertuples(index=False):
        text = r.error if what == "error" else (r.violation if what == "violation" else
                                                 f"not converged after {r.sim_ms} ms simulated")
        rows.append([r.scenario, r.assignor, str(r.workers), str(r.tasks), str(r.seed), str(text),
                     replay_command(r.scenario, r.assignor, int(r.workers), int(r.tasks), int(r.seed))])
    return Table(["scenario", "assignor", "W", "T", "seed", what, "replay"], rows, code_columns=(6,))


# -- rendering ----------------------------------------------------------------------------------


@dataclass
class Section:
    title: str
    paragraphs: list[str]
    tables: list[Table]
    images: list[tuple[str, str]]


def build_sections(data: SweepData, figures: list[tuple[str, str]]) -> list[Section]:
    results, manifest = data.results, data.manifest
    config = manifest.get("config", {})
    scenarios = sorted(results["scenario"].unique())
    assignors = sorted(results["assignor"].unique())
    sizes = sorted({(int(w), int(t)) for w, t in zip(results["workers"], results["tasks"], strict=True)})
    seeds = results.groupby(["scenario", "assignor", "workers", "tasks"])["seed"].nunique()
    overview = [
        f"{len(results)} runs: scenarios {', '.join(scenarios)}; assignors "
        f"{', '.join(ASSIGNOR_LABEL.get(a, a) for a in assignors)}; sizes (workers:tasks) "
        f"{', '.join(f'{w}:{t}' for w, t in sizes)}; "
        + (f"{seeds.min()} seeds" if seeds.min() == seeds.max() else f"{seeds.min()}..{seeds.max()} seeds")
        + " per combination"
        + (f" (seeds {config['seed_start']}..{config['seed_start'] + config['seeds'] - 1})" if config else "")
        + ".",
    ]
    if manifest:
        overview.append(
            f"Spark {manifest.get('spark_version')} on {manifest.get('master')} (parallelism "
            f"{manifest.get('default_parallelism')}): simulated in {manifest.get('simulate_s', 0):.1f} s "
            f"({manifest.get('runs_per_s', 0):.0f} runs/s), {manifest.get('traced_runs')} runs traced "
            f"({manifest.get('events')} events); sweep of {manifest.get('created_at')}."
        )
        if manifest.get("inconsistent_traces"):
            overview.append(f"WARNING: {manifest['inconsistent_traces']} traced reruns did not reproduce "
                            "their metrics: the simulator is not deterministic for those seeds.")
    violations = results[results["violation"] != ""]
    errors = results[results["error"] != ""]
    unconverged = results[(~results["converged"].astype(bool)) & (results["error"] == "")]
    overview.append(f"Invariant violations: {len(violations)}; simulator errors: {len(errors)}; runs "
                    f"that did not converge: {len(unconverged)}.")
    sections = [Section("Sweep", overview, [], [])]
    sections.append(Section(
        "Seed 003's characterisation, measured",
        ["Seed 003 (\"Incremental Cooperative Rebalancing: Support and Policies\") characterises each "
         "design by three use cases: Kubernetes process death (a process dies and is restarted "
         "quickly), rolling bounce, and scale up/down. Eager is the stop-the-world protocol it "
         "starts from; IncrementalCooperative is KIP-415, its Design II (deferred resolution of "
         "imbalance: a departed worker's work is held for the scheduled rebalance delay). The "
         "measured columns pool all sizes and seeds of the scenario; downtime is summed over tasks "
         "(task-ms not running), moved counts items that changed worker, min is the least that had "
         "to move. \"YES\" means IncrementalCooperative had < 0.9x Eager's task downtime without "
         "moving more; \"NO\" means > 1.1x."],
        [characterisation(results)], []))
    sections.append(Section("Distributions", [], [], figures))
    if not data.aggregates.empty:
        sections.append(Section(
            "Aggregates per scenario x assignor x size",
            ["Computed by Spark SQL in the sweep (aggregates/); percentiles are exact (Spark's "
             "percentile, linear interpolation); convergence over converged runs only."],
            [aggregates_table(data.aggregates)], []))
    listed = pd.concat([violations, errors]).drop_duplicates(
        ["scenario", "assignor", "workers", "tasks", "seed"])
    paragraphs = ["None: every run kept the invariants."] if listed.empty else [
        f"{len(listed)} runs; the first {min(len(listed), MAX_LISTED_RUNS)} are listed (all are in "
        "results/ where violation or error is not empty; traced ones have their events in events/)."]
    tables = []
    if not violations.empty:
        tables.append(_run_rows(violations.head(MAX_LISTED_RUNS), "violation"))
    if not errors.empty:
        tables.append(_run_rows(errors.head(MAX_LISTED_RUNS), "error"))
    sections.append(Section("Invariant violations", paragraphs, tables, []))
    if not unconverged.empty:
        sections.append(Section(
            "Runs that did not converge",
            [f"{len(unconverged)} runs; the first {min(len(unconverged), MAX_UNCONVERGED_LISTED)}:"],
            [_run_rows(unconverged.head(MAX_UNCONVERGED_LISTED), "outcome")], []))
    return sections


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 110em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.5em; vertical-align: top; text-align: left; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
code { font-size: 0.9em; }
"""


def render_html(title: str, sections: list[Section]) -> str:
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        parts += [f"<p>{html.escape(p)}</p>" for p in section.paragraphs]
        parts += [t.html() for t in section.tables]
        for file, caption in section.images:
            parts.append(f'<figure><img src="{html.escape(file)}" alt="{html.escape(caption)}">'
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def render_markdown(title: str, sections: list[Section]) -> str:
    parts = [f"# {title}", ""]
    for section in sections:
        parts += [f"## {section.title}", ""]
        for p in section.paragraphs:
            parts += [p, ""]
        for t in section.tables:
            parts += [t.markdown(), ""]
        for file, caption in section.images:
            parts += [f"![{caption}]({file})", ""]
    return "\n".join(parts)


def write_report(in_dir: str | Path, out_dir: str | Path,
                 title: str = "Connect rebalance simulation") -> Path:
    """Write the report of the sweep in ``in_dir`` into ``out_dir``; return index.html's path."""
    data = load(in_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = make_figures(data.results, out)
    sections = build_sections(data, figures)
    (out / "index.html").write_text(render_html(title, sections))
    (out / "report.md").write_text(render_markdown(title, sections))
    return out / "index.html"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulation report",
                                description="HTML + Markdown report (with PNG plots) of a sweep's Parquet.")
    p.add_argument("--in", dest="in_dir", required=True, help="the sweep's --out directory")
    p.add_argument("--out", required=True, help="where to write index.html, report.md and the PNGs")
    p.add_argument("--title", default="Connect rebalance simulation")
    args = p.parse_args(argv)
    try:
        path = write_report(args.in_dir, args.out, args.title)
    except FileNotFoundError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path} (and report.md, {len(FIGURES)} PNGs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
