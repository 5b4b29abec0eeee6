"""``stallfree sweep``: every trial of a :class:`~stallfree.tune.grid.Grid`, to tidy CSV, resumable.

Output directory layout:

- ``trials.csv``: one row per trial (spec fields, ``passed`` against the grid's SLOs, every
  summary metric, and ``key``), appended and flushed as each trial finishes, so an interrupted
  sweep loses at most the trials in flight;
- ``capacity.csv``: one row per (model, hardware, tp, policy, budget) capacity search (its spec
  without the QPS, the SLOs and precision, what it found), written when the sweep ends, with
  ``best`` marking each (model, hardware, tp, policy)'s best budget.

The grid's ``cost_model: auto`` (its default) is resolved per hardware, as ``tune`` resolves it
(:func:`~stallfree.costs.choice.pick_cost_model`), so both files record the kind that ran.

Resume: rows already in ``trials.csv`` are read back by ``key`` and never run again; a search
replays them and continues where it stopped (searches are deterministic given their trials).
A torn last line (killed mid-write) is cut off. Parquet is not written: CSV needs no extra
dependency, and ``pandas.read_csv`` loads it as easily.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from stallfree.costs.choice import CostChoice, pick_cost_model
from stallfree.metrics import Summary
from stallfree.sim.deployment import Deployment
from stallfree.tune.candidates import budget_candidates
from stallfree.tune.capacity import QPS_RANGE_FACTOR
from stallfree.tune.grid import CapacityGrid, Grid
from stallfree.tune.jobs import FixedQps, Job, TrialRecord, run_jobs
from stallfree.tune.pools import TrialPool
from stallfree.tune.search import CapacitySearch, SearchConfig
from stallfree.tune.trial import COLUMNS as SPEC_COLUMNS
from stallfree.tune.trial import DEFAULT_SERVING, TrialSpec, check_spec, estimate_qps, ridge_tokens

# The search's deployment and workload (its spec without the QPS), then what it found.
CAPACITY_COLUMNS = (
    *(name for name in SPEC_COLUMNS if name != "qps"),
    "slos",
    "precision",
    "capacity_qps",
    "hit_qps_max",
    "num_trials",
    "best",
)


@dataclass(frozen=True, slots=True)
class SweepSummary:
    num_trials: int  # every trial of the grid, repeats (the same spec in two jobs) included
    num_run: int
    num_resumed: int
    trials_path: Path
    capacity_path: Path | None


def grid_jobs(grid: Grid) -> tuple[list[Job], list[tuple[TrialSpec, CapacitySearch]]]:
    """Every fixed-QPS trial and capacity search of the grid (each base spec checked first)."""
    jobs: list[Job] = []
    searches: list[tuple[TrialSpec, CapacitySearch]] = []
    for model in grid.models:
        for hardware in grid.hardware:
            kind = (
                grid.cost_model
                if grid.cost_model != "auto"
                else pick_cost_model(CostChoice(model=model, hardware=hardware)).kind
            )
            profile = kind.removeprefix("measured:") if kind.startswith("measured:") else None
            for tp in grid.tp:
                costs = CostChoice("measured" if profile else kind, model, hardware, tp, profile)
                budgets = sorted(grid.budgets) if grid.budgets else budget_candidates(ridge_tokens(costs))
                for policy in grid.policies:
                    for budget in budgets:
                        deployment = Deployment(
                            costs=costs,
                            serving=DEFAULT_SERVING,
                            gpu_memory_utilization=grid.gpu_memory_utilization,
                        )
                        base = TrialSpec(
                            deployment=deployment,
                            lengths=grid.lengths,
                            arrival=grid.arrival,
                            burstiness=grid.burstiness,
                            num_requests=grid.num_requests,
                            seed=grid.seed,
                        ).with_serving(grid.max_num_seqs, policy=policy, max_num_batched_tokens=budget)
                        check_spec(base)
                        jobs.extend(Job(base, FixedQps(qps)) for qps in grid.qps)
                        if grid.capacity is not None:
                            start = grid.capacity.qps_start or estimate_qps(base)
                            search = CapacitySearch(
                                SearchConfig(
                                    qps_start=start,
                                    precision=grid.capacity.precision,
                                    qps_min=start / QPS_RANGE_FACTOR,
                                    qps_max=start * QPS_RANGE_FACTOR,
                                )
                            )
                            searches.append((base, search))
                            jobs.append(Job(base, search))
    return jobs, searches


def run_sweep_grid(
    grid: Grid, out_dir: str | Path, pool: TrialPool, *, progress: bool = False
) -> SweepSummary:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trials_path = out / "trials.csv"
    jobs, searches = grid_jobs(grid)
    done = read_trials(trials_path)
    slos = grid.capacity.slos if grid.capacity is not None else None
    with TrialWriter(trials_path) as writer:
        records = run_jobs(
            jobs, pool, slos, done=done, on_trial=writer.write, progress=progress, desc="sweep"
        )
    capacity_path = None
    if grid.capacity is not None:
        capacity_path = out / "capacity.csv"
        write_capacity(capacity_path, searches, grid.capacity)
    num_run = sum(r.origin == "run" for r in records)
    num_resumed = sum(r.origin == "resumed" for r in records)
    return SweepSummary(len(records), num_run, num_resumed, trials_path, capacity_path)


class TrialWriter:
    """Appends trial rows to a CSV, header first when the file is new; flushes every row."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._writer: csv.DictWriter[str] | None = None

    def write(self, record: TrialRecord) -> None:
        row: dict[str, object] = record.spec.columns()
        row["passed"] = record.passed
        row.update(record.metrics)
        row["key"] = record.spec.key()
        if self._writer is None:
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            columns = _header(self.path) if not fresh else [*SPEC_COLUMNS, "passed", *record.metrics, "key"]
            self._file = self.path.open("a", newline="")
            self._writer = csv.DictWriter(self._file, fieldnames=columns, extrasaction="ignore")
            if fresh:
                self._writer.writeheader()
        assert self._file is not None  # opened together with the writer
        self._writer.writerow({k: "" if v is None else v for k, v in row.items()})
        self._file.flush()

    def __enter__(self) -> TrialWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()


def read_trials(path: Path) -> dict[str, Summary]:
    """Metrics of the trials already in ``path`` by key (empty when there is no file)."""
    if not path.exists():
        return {}
    _cut_torn_line(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            return {}
        missing = [c for c in (*SPEC_COLUMNS, "key") if c not in reader.fieldnames]
        if missing:
            raise ValueError(f"{path} is not a stallfree trials file (missing columns: {', '.join(missing)})")
        metric_columns = [c for c in reader.fieldnames if c not in (*SPEC_COLUMNS, "passed", "key")]
        return {row["key"]: {c: _number(row[c]) for c in metric_columns} for row in reader}


def write_capacity(
    path: Path, searches: list[tuple[TrialSpec, CapacitySearch]], capacity: CapacityGrid
) -> None:
    """One row per search; ``best`` marks the smallest budget reaching its group's highest
    capacity, a group being everything but the budget (as ``stallfree tune`` picks)."""

    def group(spec: TrialSpec) -> tuple[object, ...]:
        columns = spec.columns()
        return tuple(
            columns[name] for name in SPEC_COLUMNS if name not in ("qps", "token_budget", "max_num_seqs")
        )

    best: dict[tuple[object, ...], float] = {}
    for spec, search in searches:
        best[group(spec)] = max(best.get(group(spec), 0.0), search.capacity_qps)
    ranked = sorted(searches, key=lambda s: s[0].token_budget)
    winners: dict[tuple[object, ...], str] = {}
    for spec, search in ranked:
        if search.capacity_qps > 0 and search.capacity_qps == best[group(spec)]:
            winners.setdefault(group(spec), spec.key())
    slos = ";".join(f"{name}={limit:g}" for name, limit in capacity.slos.as_dict().items())
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CAPACITY_COLUMNS)
        for spec, search in searches:
            writer.writerow(
                [
                    *(value for name, value in spec.columns().items() if name != "qps"),
                    slos,
                    capacity.precision,
                    search.capacity_qps,
                    search.hit_qps_max,
                    search.num_trials,
                    winners.get(group(spec)) == spec.key(),
                ]
            )


def _header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f))


def _cut_torn_line(path: Path) -> None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def _number(text: str | None) -> float | int | None:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)
