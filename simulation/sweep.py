"""Seed sweeps of the simulator on Spark: ``python -m simulation sweep``.

One *run* is ``simulation.run(scenario, assignor, workers, tasks, seed)``. A sweep is every
combination of the chosen scenarios, assignors and sizes (``W:T`` = W workers, T tasks) times
``--seeds`` consecutive seeds. The pipeline (docs/simulation-pipeline.md):

1. A DataFrame of (scenario, assignor, workers, tasks, seed) rows, one per run, built from
   ``spark.range`` (each Spark partition = one *batch* of ``--batch-size`` runs: consecutive
   seeds of every combination, see :func:`plan_frame`) and a broadcast join with the small table
   of combinations, so nothing of size "runs" is built on the driver.
2. ``mapInPandas`` over the batches: each batch calls ``simulation.run`` per row, in the executor's
   Python worker, and yields one result row per run. Runs with a violation or an error (up to
   ``--trace-violations`` per batch) and the first ``--trace-sample`` seeds of every combination are
   run a second time with ``trace=True``; their events (at most ``--max-trace-events`` per run:
   head and tail kept) ride along in a nested column. The rerun must reproduce the metrics
   (``trace_consistent``), a free determinism check.
3. The runs are persisted once, then written as Parquet: ``results/`` (one row per run) and
   ``events/`` (one row per traced event), both partitioned by ``scenario`` and ``assignor``; the
   per scenario x assignor x size aggregates are computed by Spark SQL from the written results
   (``aggregates/``), and ``sweep.json`` records the parameters, counts and timings.

While the runs execute, a thread prints ``sweep: N/M runs done`` to stderr, from a Spark
accumulator each batch adds its run count to (so it moves once per finished batch).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

# -- schemas ------------------------------------------------------------------------------------

# The simulator's RunResult.metrics, in order, with their Spark SQL types.
METRIC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("scenario", "string"),
    ("assignor", "string"),
    ("workers", "int"),
    ("tasks", "int"),
    ("seed", "bigint"),
    ("converged", "boolean"),
    ("convergence_ms", "bigint"),
    ("rebalances", "int"),
    ("moved", "bigint"),
    ("moved_min", "bigint"),
    ("downtime_ms", "bigint"),
    ("longest_outage_ms", "bigint"),
    ("double_running_ms", "bigint"),
    ("messages", "bigint"),
    ("violation", "string"),
    ("sim_ms", "bigint"),
    ("wall_ms", "double"),
)
# Added by the sweep.
EXTRA_COLUMNS: tuple[tuple[str, str], ...] = (
    ("error", "string"),  # "" or the exception simulation.run raised (metrics are then null)
    ("traced", "boolean"),  # events of this run are in events/
    ("trace_events", "int"),  # events the traced run produced (before the cap)
    ("trace_consistent", "boolean"),  # traced rerun gave the same metrics (null: not traced)
    # From the run's RunResult.extra (null if the run raised): faults injected, the instances'
    # offset commits as the coordinator answered them, the fencing tokens' grants and the
    # modelled resources' writes (accepted, refused by the token), self-fences and fail-stops.
    *((name, "bigint") for name in (
        "faults", "grants", "commits_accepted", "commits_refused", "fetches_checked",
        "writes_accepted", "writes_refused", "self_fences", "fail_stops")),
)
RUN_EXTRA = tuple(name for name, _ in EXTRA_COLUMNS[4:])
EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("seq", "int"),  # index of the event in the run's trace (gaps where the cap cut)
    ("t_ms", "bigint"),
    ("kind", "string"),
    ("worker", "string"),
    ("item", "string"),
    ("epoch", "bigint"),
    ("detail", "string"),
)
KEY_COLUMNS = ("scenario", "assignor", "workers", "tasks", "seed")
PARTITION_COLUMNS = ("scenario", "assignor")
# Metrics that a traced rerun must reproduce exactly (wall_ms is a measurement, not a result).
_DETERMINISTIC = tuple(name for name, _ in METRIC_COLUMNS if name != "wall_ms")
_INT_TYPES = {"int", "bigint"}


def _ddl(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in columns)


def run_schema_ddl() -> str:
    """The mapInPandas output: result columns plus the nested events of traced runs."""
    return f"{_ddl(METRIC_COLUMNS + EXTRA_COLUMNS)}, events array<struct<{_ddl_struct(EVENT_COLUMNS)}>>"


def _ddl_struct(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{name}: {kind}" for name, kind in columns)


# -- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepConfig:
    scenarios: tuple[str, ...]
    assignors: tuple[str, ...]
    sizes: tuple[tuple[int, int], ...]  # (workers, tasks)
    seeds: int
    seed_start: int = 0
    batch_size: int = 50  # runs per Spark partition (= per mapInPandas batch, per progress step)
    trace_sample: int = 2  # the first N seeds of every combination are traced
    trace_violations: int = 5  # at most N runs with a violation or an error traced per batch
    max_trace_events: int = 10_000  # per traced run; the first and last halves are kept
    run_timeout_s: float = 300.0  # a run taking longer is recorded as an error (0: no limit)

    def __post_init__(self) -> None:
        if self.seeds <= 0:
            raise ValueError(f"--seeds must be > 0, got {self.seeds}")
        if self.seed_start < 0:
            raise ValueError(f"--seed-start must be >= 0, got {self.seed_start}")
        if self.batch_size <= 0:
            raise ValueError(f"--batch-size must be > 0, got {self.batch_size}")
        if min(self.trace_sample, self.trace_violations) < 0 or self.max_trace_events < 2:
            raise ValueError("trace limits must be >= 0 (and --max-trace-events >= 2)")
        if self.run_timeout_s < 0:
            raise ValueError(f"--run-timeout must be >= 0, got {self.run_timeout_s}")
        if not (self.scenarios and self.assignors and self.sizes):
            raise ValueError("a sweep needs at least one scenario, assignor and size")
        for workers, tasks in self.sizes:
            if workers <= 0 or tasks <= 0:
                raise ValueError(f"size {workers}:{tasks}: workers and tasks must be > 0")

    def combinations(self) -> list[tuple[str, str, int, int]]:
        return [(s, a, w, t) for s in self.scenarios for a in self.assignors for w, t in self.sizes]

    @property
    def total_runs(self) -> int:
        return len(self.combinations()) * self.seeds


def parse_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """``"3:12,5:40"`` -> ((3, 12), (5, 40))."""
    sizes = []
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        workers, sep, tasks = part.partition(":")
        try:
            if not sep:
                raise ValueError
            sizes.append((int(workers), int(tasks)))
        except ValueError:
            raise ValueError(f"bad size {part!r}: expected WORKERS:TASKS, e.g. 3:12") from None
    if not sizes:
        raise ValueError("no size given")
    return tuple(dict.fromkeys(sizes))


def _names(values: Sequence[str] | None) -> tuple[str, ...]:
    out: list[str] = []
    for value in values or ():
        out.extend(v for v in value.replace(",", " ").split() if v)
    return tuple(dict.fromkeys(out))


# -- the per-batch simulation (runs in Spark's Python workers) ----------------------------------


def _cap_events(events: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    indexed = [(i, e) for i, e in enumerate(events)]
    if len(indexed) > cap:
        head = cap // 2
        indexed = indexed[:head] + indexed[len(indexed) - (cap - head) :]
    return [
        {
            "seq": i,
            "t_ms": int(e.get("t_ms", 0)),
            "kind": str(e.get("kind", "")),
            "worker": str(e.get("worker", "")),
            "item": str(e.get("item", "")),
            "epoch": int(e.get("epoch", 0)),
            "detail": str(e.get("detail", "")),
        }
        for i, e in indexed
    ]


def _error_row(key: tuple[Any, ...], exc: BaseException) -> dict[str, Any]:
    row: dict[str, Any] = {name: None for name, _ in METRIC_COLUMNS}
    row.update(zip(KEY_COLUMNS, key, strict=True))
    row.update(dict.fromkeys(RUN_EXTRA))
    row["converged"] = False
    row["violation"] = ""
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    row["error"] = last[:2000]
    return row


class RunTimeout(BaseException):
    """A run took longer than ``run_timeout_s``. A BaseException, so that no ``except Exception``
    inside the simulator swallows it."""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise RunTimeout in this thread after ``seconds`` (SIGALRM: only in the main thread, where
    Spark's Python worker runs mapInPandas; elsewhere, or with 0, no limit)."""
    usable = (seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise RunTimeout(f"the run took more than {seconds:g} s (wall clock)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def simulate_rows(
    rows: pd.DataFrame,
    config: SweepConfig,
    run_fn: Any = None,
) -> tuple[list[dict[str, Any]], int]:
    """Run every row of one batch; return (output rows, runs done). Pure Python, no Spark: the
    mapInPandas function wraps it, and tests can call it directly."""
    if run_fn is None:
        from simulation import run as run_fn
    out: list[dict[str, Any]] = []
    violation_traces = 0
    for key in rows[list(KEY_COLUMNS)].itertuples(index=False, name=None):
        scenario, assignor, workers, tasks, seed = (str(key[0]), str(key[1]), int(key[2]), int(key[3]),
                                                    int(key[4]))
        key = (scenario, assignor, workers, tasks, seed)
        try:
            with _time_limit(config.run_timeout_s):
                result = run_fn(scenario, assignor, workers, tasks, seed)
                metrics = dict(result.metrics)
            row = {name: metrics.get(name) for name, _ in METRIC_COLUMNS}
            extra = getattr(result, "extra", None) or {}
            row.update({name: extra.get(name) for name in RUN_EXTRA})
            row["error"] = ""
        except (Exception, RunTimeout) as exc:  # a crash or hang of the simulator is a finding
            metrics = None
            row = _error_row(key, exc)
        bad = bool(row["error"]) or bool(row["violation"])
        sampled = seed - config.seed_start < config.trace_sample
        want_trace = sampled or (bad and violation_traces < config.trace_violations)
        row["traced"] = False
        row["trace_events"] = None
        row["trace_consistent"] = None
        row["events"] = []
        if want_trace:
            if bad and not sampled:
                violation_traces += 1
            try:
                with _time_limit(config.run_timeout_s):
                    traced = run_fn(scenario, assignor, workers, tasks, seed, trace=True)
                again = dict(traced.metrics)
                row["traced"] = True
                row["trace_events"] = len(traced.events)
                row["trace_consistent"] = metrics is not None and all(
                    again.get(k) == metrics.get(k) for k in _DETERMINISTIC
                )
                row["events"] = _cap_events(list(traced.events), config.max_trace_events)
            except (Exception, RunTimeout) as exc:
                row["traced"] = True
                row["trace_consistent"] = metrics is None and _error_row(key, exc)["error"] == row["error"]
        out.append(row)
    return out, len(rows)


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    columns = [name for name, _ in METRIC_COLUMNS + EXTRA_COLUMNS] + ["events"]
    frame = pd.DataFrame(rows, columns=columns)
    for name, kind in METRIC_COLUMNS + EXTRA_COLUMNS:  # nullable ints: a null must not become float
        if kind in _INT_TYPES:
            frame[name] = frame[name].astype("Int64" if kind == "bigint" else "Int32")
        elif kind == "boolean":
            frame[name] = frame[name].astype("boolean")
        elif kind == "double":
            frame[name] = frame[name].astype("float64")
    return frame


def simulate_batches(
    batches: Iterator[pd.DataFrame], config: SweepConfig, counter: Any
) -> Iterator[pd.DataFrame]:
    """mapInPandas body: each pandas batch of plan rows -> its result rows."""
    from simulation.spark import quiet_pandas_warning

    quiet_pandas_warning()
    for rows in batches:
        out, done = simulate_rows(rows, config)
        counter.add(done)
        yield _frame(out)


def _batch_function(config: SweepConfig, counter: Any) -> Any:
    def simulate(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        # Imported by name so that only this closure is pickled, never this module's globals
        # (when sweep.py runs as __main__, cloudpickle would ship the module by value).
        from simulation import sweep

        return sweep.simulate_batches(batches, config, counter)

    return simulate


# -- progress -----------------------------------------------------------------------------------


class Progress:
    """Prints ``sweep: N/M runs done`` to stderr while a Spark job runs, from an accumulator."""

    def __init__(self, counter: Any, total: int, interval_s: float = 2.0, stream: Any = None,
                 enabled: bool = True) -> None:
        self.counter = counter
        self.total = total
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sweep-progress", daemon=True)
        self._started = 0.0
        self._last = -1

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()
            self.report(final=True)

    def done(self) -> int:
        return min(int(self.counter.value), self.total)

    def report(self, final: bool = False) -> None:
        done = self.done()
        if done == self._last:
            return
        self._last = done
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = done / elapsed
        text = f"sweep: {done}/{self.total} runs done ({100.0 * done / max(self.total, 1):.0f}%)"
        text += f", {rate:.0f} runs/s"
        if not final and 0 < done < self.total:
            text += f", ~{(self.total - done) / rate:.0f} s left"
        print(text, file=self.stream, flush=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.report()


# -- the pipeline -------------------------------------------------------------------------------


@dataclass
class SweepSummary:
    out: str
    master: str
    spark_version: str
    default_parallelism: int
    config: dict[str, Any]
    runs: int = 0
    batches: int = 0
    violations: int = 0
    errors: int = 0
    traced_runs: int = 0
    events: int = 0
    inconsistent_traces: int = 0
    simulate_s: float = 0.0
    write_s: float = 0.0
    aggregate_s: float = 0.0
    runs_per_s: float = 0.0
    session_start_s: float | None = None
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


def plan_frame(spark: SparkSession, config: SweepConfig) -> DataFrame:
    """The (scenario, assignor, workers, tasks, seed) rows, one Spark partition per batch.

    Run ``id`` is seed ``seed_start + id // C`` of combination ``id % C`` (C combinations), so a
    batch holds consecutive seeds of every combination: slow scenarios or sizes are spread over
    all the batches instead of making a few batches (and the end of the sweep) slow."""
    from pyspark.sql import functions as F

    combinations = config.combinations()
    combos = spark.createDataFrame(
        [(i, s, a, w, t) for i, (s, a, w, t) in enumerate(combinations)],
        "combo bigint, scenario string, assignor string, workers int, tasks int",
    )
    n = len(combinations)
    batches = max(1, math.ceil(config.total_runs / config.batch_size))
    ids = spark.range(0, config.total_runs, 1, batches)
    runs = ids.select(
        (F.col("id") % F.lit(n)).alias("combo"),
        (F.lit(config.seed_start) + (F.col("id") / F.lit(n)).cast("bigint")).alias("seed"),
    )
    return runs.join(F.broadcast(combos), "combo").select(*KEY_COLUMNS)


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


AGGREGATE_SQL = """
SELECT scenario, assignor, workers, tasks,
  count(*) AS runs,
  count(DISTINCT seed) AS seeds,
  sum(CASE WHEN error <> '' THEN 1 ELSE 0 END) AS errors,
  sum(CASE WHEN converged THEN 1 ELSE 0 END) AS converged_runs,
  avg(CASE WHEN converged THEN 1.0D ELSE 0.0D END) AS converged_ratio,
  percentile(CASE WHEN converged THEN convergence_ms END, 0.5) AS convergence_p50,
  percentile(CASE WHEN converged THEN convergence_ms END, 0.95) AS convergence_p95,
  max(CASE WHEN converged THEN convergence_ms END) AS convergence_max,
  avg(rebalances) AS rebalances_mean,
  percentile(rebalances, 0.95) AS rebalances_p95,
  max(rebalances) AS rebalances_max,
  avg(downtime_ms) AS downtime_mean,
  percentile(downtime_ms, 0.5) AS downtime_p50,
  percentile(downtime_ms, 0.95) AS downtime_p95,
  max(downtime_ms) AS downtime_max,
  avg(longest_outage_ms) AS longest_outage_mean,
  percentile(longest_outage_ms, 0.95) AS longest_outage_p95,
  max(longest_outage_ms) AS longest_outage_max,
  avg(moved) AS moved_mean,
  avg(moved_min) AS moved_min_mean,
  sum(moved) AS moved_total,
  sum(moved_min) AS moved_min_total,
  avg(moved - moved_min) AS moved_excess_mean,
  max(moved - moved_min) AS moved_excess_max,
  sum(CASE WHEN moved > moved_min THEN 1 ELSE 0 END) AS moved_excess_runs,
  max(double_running_ms) AS double_running_max,
  sum(CASE WHEN double_running_ms > 0 THEN 1 ELSE 0 END) AS double_running_runs,
  sum(CASE WHEN violation <> '' THEN 1 ELSE 0 END) AS violations,
  slice(array_sort(collect_list(CASE WHEN violation <> '' OR error <> '' THEN seed END)), 1, 20)
    AS violation_seeds,
  sum(faults) AS faults_total,
  sum(grants) AS grants_total,
  sum(commits_accepted) AS commits_accepted_total,
  sum(commits_refused) AS commits_refused_total,
  sum(fetches_checked) AS fetches_checked_total,
  sum(writes_accepted) AS writes_accepted_total,
  sum(writes_refused) AS writes_refused_total,
  sum(self_fences) AS self_fences_total,
  sum(fail_stops) AS fail_stops_total,
  avg(messages) AS messages_mean,
  avg(sim_ms) AS sim_ms_mean,
  avg(wall_ms) AS wall_ms_mean,
  sum(wall_ms) AS wall_ms_total
FROM {view}
GROUP BY scenario, assignor, workers, tasks
ORDER BY scenario, assignor, workers, tasks
"""


def aggregate(spark: SparkSession, results: DataFrame, view: str = "sweep_results") -> DataFrame:
    """Per scenario x assignor x size aggregates (Spark SQL over the results)."""
    results.createOrReplaceTempView(view)
    return spark.sql(AGGREGATE_SQL.format(view=view))


def run_sweep(
    spark: SparkSession,
    config: SweepConfig,
    out: str | Path,
    *,
    progress: bool = True,
    progress_interval_s: float = 2.0,
    session_start_s: float | None = None,
) -> SweepSummary:
    """Run the sweep on an existing session and write ``out`` (see the module doc)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sc = spark.sparkContext
    summary = SweepSummary(
        out=str(out), master=sc.master, spark_version=spark.version,
        default_parallelism=sc.defaultParallelism, config=asdict(config),
        session_start_s=session_start_s,
        batches=max(1, math.ceil(config.total_runs / config.batch_size)),
    )
    counter = sc.accumulator(0)
    runs = plan_frame(spark, config).mapInPandas(_batch_function(config, counter), run_schema_ddl())
    runs = runs.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        sc.setJobGroup("sweep", f"simulate {config.total_runs} runs")
        started = time.monotonic()
        with Progress(counter, config.total_runs, progress_interval_s, enabled=progress):
            counts = runs.agg(
                F.count(F.lit(1)).alias("runs"),
                F.sum(F.when(F.col("violation") != "", 1).otherwise(0)).alias("violations"),
                F.sum(F.when(F.col("error") != "", 1).otherwise(0)).alias("errors"),
                F.sum(F.when(F.col("traced"), 1).otherwise(0)).alias("traced"),
                F.sum(F.size("events")).alias("events"),
                F.sum(F.when(F.col("trace_consistent") == F.lit(False), 1).otherwise(0)).alias("bad"),
            ).collect()[0]
        summary.simulate_s = time.monotonic() - started
        summary.runs = int(counts["runs"])
        summary.violations = int(counts["violations"] or 0)
        summary.errors = int(counts["errors"] or 0)
        summary.traced_runs = int(counts["traced"] or 0)
        summary.events = int(counts["events"] or 0)
        summary.inconsistent_traces = int(counts["bad"] or 0)
        summary.runs_per_s = summary.runs / max(summary.simulate_s, 1e-9)

        started = time.monotonic()
        sc.setJobGroup("sweep", "write results and events")
        results = runs.drop("events")
        (results.repartition(*PARTITION_COLUMNS).sortWithinPartitions("workers", "tasks", "seed")
         .write.mode("overwrite").partitionBy(*PARTITION_COLUMNS).parquet(str(out / "results")))
        events = runs.where(F.size("events") > 0).select(
            *KEY_COLUMNS, F.explode("events").alias("e")
        ).select(*KEY_COLUMNS, *(F.col(f"e.{name}").alias(name) for name, _ in EVENT_COLUMNS))
        (events.repartition(*PARTITION_COLUMNS).sortWithinPartitions("workers", "tasks", "seed", "seq")
         .write.mode("overwrite").partitionBy(*PARTITION_COLUMNS).parquet(str(out / "events")))
        summary.write_s = time.monotonic() - started
    finally:
        runs.unpersist()

    started = time.monotonic()
    sc.setJobGroup("sweep", "aggregate")
    written = spark.read.parquet(str(out / "results"))
    aggregate(spark, written).coalesce(1).write.mode("overwrite").parquet(str(out / "aggregates"))
    summary.aggregate_s = time.monotonic() - started
    sc.setJobGroup("", "")
    _write_json(out / "sweep.json", asdict(summary))
    return summary


# -- command line -------------------------------------------------------------------------------

DEFAULT_SIZES = "3:12,6:48"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m simulation sweep",
        description="Simulate every scenario x assignor x size x seed on Spark; write Parquet.",
    )
    p.add_argument("--seeds", type=int, required=True, help="seeds per combination")
    p.add_argument("--seed-start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--out", required=True, help="output directory (results/, events/, aggregates/)")
    p.add_argument("--scenarios", nargs="+", help="scenario names (default: all)")
    p.add_argument("--assignors", nargs="+", help="assignors (default: all)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"WORKERS:TASKS,... (default {DEFAULT_SIZES})")
    p.add_argument("--master", default=None, help="Spark master URL (default local[*], embedded)")
    p.add_argument("--batch-size", type=int, default=SweepConfig.batch_size,
                   help="runs per Spark task (default %(default)s)")
    p.add_argument("--trace-sample", type=int, default=SweepConfig.trace_sample,
                   help="trace the first N seeds of every combination (default %(default)s)")
    p.add_argument("--trace-violations", type=int, default=SweepConfig.trace_violations,
                   help="trace at most N runs with a violation or error per batch (default %(default)s)")
    p.add_argument("--max-trace-events", type=int, default=SweepConfig.max_trace_events,
                   help="events kept per traced run, head and tail (default %(default)s)")
    p.add_argument("--run-timeout", type=float, default=SweepConfig.run_timeout_s,
                   help="seconds after which a run is recorded as an error (0: none; default %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--fail-on-violation", action="store_true",
                   help="exit 1 if any run has a violation or an error")
    return p


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    import simulation

    scenarios = _names(args.scenarios) or tuple(simulation.SCENARIOS)
    assignors = _names(args.assignors) or tuple(simulation.ASSIGNORS)
    unknown = [s for s in scenarios if s not in simulation.SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; "
                         f"known: {', '.join(simulation.SCENARIOS)}")
    unknown = [a for a in assignors if a not in simulation.ASSIGNORS]
    if unknown:
        raise ValueError(f"unknown assignor(s) {', '.join(unknown)}; "
                         f"known: {', '.join(simulation.ASSIGNORS)}")
    return SweepConfig(
        scenarios=scenarios, assignors=assignors, sizes=parse_sizes(args.sizes), seeds=args.seeds,
        seed_start=args.seed_start, batch_size=args.batch_size, trace_sample=args.trace_sample,
        trace_violations=args.trace_violations, max_trace_events=args.max_trace_events,
        run_timeout_s=args.run_timeout,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    from pyspark.sql import SparkSession

    from simulation.spark import DEFAULT_MASTER, session

    existing = SparkSession.getActiveSession()  # e.g. a test's: used as is, and not stopped
    master = args.master or DEFAULT_MASTER
    print(f"sweep: {config.total_runs} runs ({len(config.combinations())} combinations x "
          f"{config.seeds} seeds) on {master}", file=sys.stderr, flush=True)
    started = time.monotonic()
    spark = session(master)
    start_s = time.monotonic() - started
    print(f"sweep: Spark {spark.version} session started in {start_s:.1f} s "
          f"(parallelism {spark.sparkContext.defaultParallelism})", file=sys.stderr, flush=True)
    try:
        summary = run_sweep(spark, config, args.out, progress=not args.no_progress, session_start_s=start_s)
    finally:
        if existing is None:
            spark.stop()
    print(
        f"sweep: {summary.runs} runs in {summary.simulate_s:.1f} s ({summary.runs_per_s:.0f} runs/s), "
        f"{summary.violations} with a violation, {summary.errors} errors, {summary.traced_runs} traced "
        f"({summary.events} events); written in {summary.write_s:.1f} s, aggregated in "
        f"{summary.aggregate_s:.1f} s -> {args.out}",
        file=sys.stderr, flush=True,
    )
    if summary.inconsistent_traces:
        print(f"sweep: WARNING {summary.inconsistent_traces} traced reruns did not reproduce their "
              "metrics (the simulator is not deterministic for those seeds)", file=sys.stderr)
    if args.fail_on_violation and (summary.violations or summary.errors):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
