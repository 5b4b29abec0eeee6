"""``stallfree tune`` (capacity per budget, best budget, launch flags) and ``stallfree sweep``
(a YAML grid of trials to a tidy CSV, resumable). Heavy imports happen inside the handlers."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from stallfree.cli.common import (
    UsageError,
    add_roofline_args,
    int_list,
    measured_profile,
    non_negative_int,
    positive_float,
    positive_int,
    profiled_machine,
    resolve_cost_model,
)
from stallfree.tune.sigint import SigintGuard, sigterm_as_sigint  # light: stdlib only

if TYPE_CHECKING:
    from stallfree.sim.costs import CostChoice
    from stallfree.tune.pools import TrialPool

STRICT_TBT_MULTIPLE = 5  # Sarathi-Serve's strict P99 TBT SLO: 5 x a decode step without prefill
STRICT_TBT_BATCH, STRICT_TBT_CONTEXT = 32, 4096


DEFAULT_MODEL = "mistral-7b"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from stallfree.tune.slo import SLO_FLAGS  # light: no numpy

    p = sub.add_parser(
        "tune",
        help="capacity (max QPS under latency SLOs) per policy and token budget; the best budget",
        description=(
            "For each policy and token budget, binary-search the highest QPS at which a seeded simulation "
            "meets every SLO (Sarathi-Serve's capacity); report the capacity curve, the best budget and the "
            "matching vLLM / SGLang flags. Trials run in a local process pool or as Ray tasks. Exit code 1 "
            "when no budget of any policy meets the SLOs (the closest trial is shown)."
        ),
    )
    _add_deployment_args(p)
    p.add_argument(
        "--policy",
        default="chunked,prefill-first",
        help="comma-separated policies (default %(default)s)",
    )
    p.add_argument(
        "--budgets",
        default="auto",
        metavar="auto|N1,N2,...",
        help="token budgets (--max-num-batched-tokens); auto: powers of two 128..8192 and 1, 2, 4 x the "
        "roofline ridge, rounded to multiples of 64 (default %(default)s)",
    )
    p.add_argument(
        "--step-budgets-ms",
        metavar="auto|MS1,MS2,...",
        help="also try chunked with chunks sized by time (--step-budget-ms): these step-time targets; "
        "auto: 0.5, 0.75 and 1 x the P99 TBT SLO (default: none)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=256,
        help="running sequences at most; each budget uses min(this, budget) (default %(default)s)",
    )
    for name, flag in SLO_FLAGS.items():
        default = 2.0 if name == "sched_delay_p50_s" else None
        extra = {
            "tbt_p99_ms": f" (default: strict, {STRICT_TBT_MULTIPLE} x the cost model's decode step of "
            f"{STRICT_TBT_BATCH} sequences at {STRICT_TBT_CONTEXT} tokens of context, as Sarathi-Serve)",
            "sched_delay_p50_s": " (default 2, as Sarathi-Serve)",
        }.get(name, "")
        p.add_argument(
            f"--slo-{name.replace('_', '-')}",
            dest=f"slo_{name}",
            type=positive_float,
            default=default,
            metavar=flag.unit.upper(),
            help=f"SLO on {flag.label} ({flag.metric}){extra}",
        )
    p.add_argument(
        "--precision",
        type=positive_float,
        default=0.05,
        help="relative precision of each capacity (default %(default)s: within 5%%)",
    )
    p.add_argument(
        "--qps-start",
        type=positive_float,
        default=None,
        help="QPS of each search's first trial (default: half the cost model's throughput at the budget)",
    )
    _add_run_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (every trial included)")
    p.add_argument("--plot", metavar="DIR", help="write capacity-vs-budget and P99-TBT-vs-QPS figures to DIR")
    p.set_defaults(handler=run_tune)

    s = sub.add_parser(
        "sweep",
        help="run a YAML grid (models x hardware x TP x policies x budgets x QPS or capacity) to CSV",
        description=(
            "Run every trial of a YAML grid and write a tidy CSV of them (trials.csv, one row appended per "
            "trial) plus capacity.csv for capacity searches. Rerunning with the same --out resumes: trials "
            "already in trials.csv are not run again. The grid's cost_model defaults to auto, resolved per "
            "hardware as in tune (measured on an a100-*/h100-* preset or with a profile, else full); the "
            "files record the resolved kind."
        ),
    )
    s.add_argument("grid", help="the YAML grid file")
    s.add_argument(
        "--out", required=True, metavar="DIR", help="output directory (created; resumed if present)"
    )
    _add_run_args(s)
    s.set_defaults(handler=run_sweep)


def _add_deployment_args(p: argparse.ArgumentParser) -> None:
    add_roofline_args(p, model=DEFAULT_MODEL, hardware="a100-80gb", cost_model="auto")
    p.add_argument(
        "--gpu-memory-utilization",
        type=positive_float,
        default=0.9,
        help="share of GPU memory for weights + KV cache, as vLLM (default %(default)s)",
    )
    p.add_argument(
        "--num-blocks",
        type=positive_int,
        help="KV-cache blocks of 16 tokens, as the engine's --num-blocks (default: from GPU memory; "
        "with --profile, what the profiled engine allocates: max-num-seqs full contexts)",
    )
    p.add_argument(
        "--lengths",
        default="sharegpt",
        help="request lengths: a trace name or path, fixed:P,O, uniform:..., lognormal:... (default %(default)s)",
    )
    p.add_argument("--arrival", choices=("poisson", "gamma"), default="poisson", help="arrival process")
    p.add_argument("--burstiness", type=positive_float, default=1.0, help="gamma shape (default 1: Poisson)")
    p.add_argument(
        "--num-requests",
        type=positive_int,
        default=2000,
        help="requests per trial (default %(default)s: the P99 TTFT rests on its top 20)",
    )
    p.add_argument(
        "--seed", type=non_negative_int, default=0, help="workload seed, the same for every trial (default 0)"
    )


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="local process pool (default) or Ray tasks",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="local pool size, or CPUs of a local Ray (default: the number of cores)",
    )
    p.add_argument(
        "--address", help="Ray cluster address (auto, HOST:PORT, ray://HOST:PORT); default: a local Ray"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _backend(args: argparse.Namespace) -> TrialPool:
    from stallfree.tune.pools import make_pool
    from stallfree.tune.trial import run_trial

    if args.address is not None and args.backend != "ray":
        raise UsageError("--address applies to --backend ray only")
    workers = args.workers or os.cpu_count() or 1
    return make_pool(args.backend, run_trial, workers=workers, address=args.address)


def _make_dir(path: str, flag: str) -> None:
    """Create an output directory now, so a bad path fails before minutes of trials."""
    from pathlib import Path

    if Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"{flag} {path} is a file, not a directory")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"{flag} {path}: {error.strerror or error}") from None


def _progress(args: argparse.Namespace) -> bool:
    return not args.no_progress and sys.stderr.isatty()


@sigterm_as_sigint()  # a SIGTERM stops the pool and reports as Ctrl-C does
def run_tune(args: argparse.Namespace) -> int:
    from stallfree.tune.candidates import budget_candidates
    from stallfree.tune.capacity import TuneConfig, TuneInterrupted, tune
    from stallfree.tune.slo import SLO_FLAGS, Slos
    from stallfree.tune.trial import DEFAULT_SERVING, TrialSpec, decode_step_ms, full_step_ms, ridge_tokens

    costs, cost_model_note = _tune_costs(args)
    policies = tuple(p.strip() for p in args.policy.split(",") if p.strip())
    base = TrialSpec(
        costs=costs,
        serving=replace(DEFAULT_SERVING, num_blocks=args.num_blocks),
        lengths=args.lengths,
        arrival=args.arrival,
        burstiness=args.burstiness,
        num_requests=args.num_requests,
        seed=args.seed,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    ridge = ridge_tokens(costs)
    budgets = budget_candidates(ridge) if args.budgets == "auto" else tuple(_int_list(args.budgets))
    limits = {
        name: getattr(args, f"slo_{name}") for name in SLO_FLAGS if getattr(args, f"slo_{name}") is not None
    }
    notes = {}
    if "tbt_p99_ms" not in limits:
        step_ms = decode_step_ms(costs, STRICT_TBT_BATCH, STRICT_TBT_CONTEXT)
        limits = {"tbt_p99_ms": round(STRICT_TBT_MULTIPLE * step_ms, 1), **limits}
        notes["tbt_p99_ms"] = (
            f"strict: {STRICT_TBT_MULTIPLE} x a {STRICT_TBT_BATCH}-sequence decode step at "
            f"{STRICT_TBT_CONTEXT:,} tokens of context ({step_ms:.1f} ms)"
        )
    if args.precision >= 1:
        raise UsageError(f"--precision must be below 1, got {args.precision}")
    step_budgets = _step_budgets(args.step_budgets_ms, limits.get("tbt_p99_ms"))
    if step_budgets and "chunked" not in policies:
        raise UsageError("--step-budgets-ms are chunked candidates: include chunked in --policy")
    if args.plot:
        _make_dir(args.plot, "--plot")
    config = TuneConfig(
        base=base,
        policies=policies,
        budgets=budgets,
        slos=Slos.from_mapping(limits),
        max_num_seqs=args.max_num_seqs,
        precision=args.precision,
        qps_start=args.qps_start,
        step_budgets_ms=step_budgets,
    )
    started = time.perf_counter()
    interrupted: TuneInterrupted | None = None
    with _backend(args) as backend:
        try:
            result = tune(config, backend, progress=_progress(args))
        except TuneInterrupted as error:  # Ctrl-C / SIGTERM: report what was measured
            interrupted, result = error, error.result
        workers = backend.workers
    out = result.to_json()
    if interrupted is not None:
        out["partial"] = True
        out["interrupted"] = {
            "searches_finished": len(result.points),
            "searches": interrupted.num_searches,
            "unfinished": [search.to_json() for search in interrupted.unfinished],
        }
    if isinstance(costs.profile, str):  # steps priced as the profiled machine ran them, not --hardware
        from stallfree.specs.step_profile import load_profile

        out["hardware"] = profiled_machine(load_profile(costs.profile).fingerprint)
    out["cost_model_note"] = cost_model_note  # why auto picked the kind; None when named
    out["ridge_tokens"] = ridge
    out["full_step_ms"] = {str(b): full_step_ms(costs, b) for b in budgets}
    out["slo_notes"] = notes
    best_time = out.get("time_budget", {}).get("best_step_budget_ms")
    if best_time is not None:
        from stallfree.tune.capacity import time_budget_commands

        closest = _closest_fixed_budget(costs, best_time)
        out["time_budget"]["closest_fixed_budget"] = closest
        out["time_budget"]["commands"] = time_budget_commands(
            str(costs.model), costs.tp, best_time, closest, args.max_num_seqs
        )
    out["wall_s"] = time.perf_counter() - started
    out["backend"] = {"name": args.backend, "workers": workers}
    if args.plot and interrupted is None:
        from stallfree.plots.tune import plot_tune

        out["figures"] = [str(path) for path in plot_tune(out, args.plot)]
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        from stallfree.tune.report import format_tune

        print(format_tune(out))
    if interrupted is not None:
        sys.stdout.flush()
        print(
            f"stallfree tune: interrupted; the partial result ({len(result.points)} of "
            f"{interrupted.num_searches} searches finished, the {len(result.trials)} trials run, the "
            f"others' bounds so far) is on stdout{' (JSON, partial: true)' if args.json else ''}",
            file=sys.stderr,
        )
        return 130
    met = any(entry["best_budget"] is not None for entry in out["policies"].values())
    return 0 if met else 1


def _step_budgets(text: str | None, tbt_p99_ms: float | None) -> tuple[float, ...]:
    """``--step-budgets-ms``: none, auto (fractions of the P99 TBT SLO) or a comma list."""
    if not text:
        return ()
    if text == "auto":
        if tbt_p99_ms is None:  # pragma: no cover - the strict SLO is the default
            raise UsageError("--step-budgets-ms auto needs a P99 TBT SLO")
        return tuple(round(f * tbt_p99_ms, 1) for f in (0.5, 0.75, 1.0))
    try:
        values = tuple(positive_float(part) for part in text.split(",") if part.strip())
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"--step-budgets-ms: {error}") from None
    if not values or len(set(values)) != len(values):
        raise UsageError("--step-budgets-ms: give auto or distinct step-time targets in ms")
    return values


def _tune_costs(args: argparse.Namespace) -> tuple[CostChoice, str | None]:
    """The trials' cost-model choice (names and paths only, so trials pickle) and why auto
    picked its kind (None when named)."""
    from stallfree.sim.costs import CostChoice

    note = resolve_cost_model(args)
    profile = measured_profile(args, gpu_tables=True)
    model = args.model
    if profile is not None and model == DEFAULT_MODEL:  # the profiled model unless one is named
        from stallfree.specs.step_profile import load_profile

        model = str(load_profile(profile).fingerprint.get("model", model))
    kind = "measured" if profile is not None else args.cost_model
    return CostChoice(kind, model, args.hardware, args.tp, profile), note


def _closest_fixed_budget(costs: CostChoice, step_budget_ms: float) -> int:
    """The largest tile-multiple token budget whose full step, with no earlier context, fits the
    target: the fixed budget nearest a time budget (its later chunks of a long prompt do not)."""
    from stallfree.tune.candidates import TILE_TOKENS
    from stallfree.tune.trial import full_step_ms

    low, high = 1, 16384 // TILE_TOKENS
    while low < high:
        mid = (low + high + 1) // 2
        fits = full_step_ms(costs, mid * TILE_TOKENS) <= step_budget_ms
        low, high = (mid, high) if fits else (low, mid - 1)
    return low * TILE_TOKENS


def _int_list(text: str) -> list[int]:
    try:
        values = int_list(text)
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"--budgets: {error}") from None
    if not values:
        raise UsageError("--budgets: give auto or a comma-separated list of token counts")
    return values


@sigterm_as_sigint()  # a SIGTERM goes where a Ctrl-C goes: recorded by the guard below
def run_sweep(args: argparse.Namespace) -> int:
    # Ctrl-C at any moment: the pool stops and reaps its workers, the rows finished so far stay
    # in trials.csv. The guard records it and raises it where that is safe (each pool call, the
    # checks here), so no C code or callback in between can swallow it.
    with SigintGuard() as sigint:
        try:
            started = time.perf_counter()
            from stallfree.tune.grid import load_grid
            from stallfree.tune.report import duration
            from stallfree.tune.sweep import run_sweep_grid

            grid = load_grid(args.grid)
            _make_dir(args.out, "--out")
            sigint.check()
            with _backend(args) as backend:
                summary = run_sweep_grid(grid, args.out, backend, progress=_progress(args))
            sigint.check()
        except KeyboardInterrupt:
            return _sweep_interrupted(Path(args.out) / "trials.csv")
    print(
        f"{summary.num_trials} trials: {summary.num_run} run, {summary.num_resumed} resumed from "
        f"{summary.trials_path}, {summary.num_trials - summary.num_run - summary.num_resumed} repeats "
        f"(the same spec twice) in {duration(time.perf_counter() - started)}"
    )
    print(f"trials:   {summary.trials_path}")
    if summary.capacity_path is not None:
        print(f"capacity: {summary.capacity_path}")
    return 0


def _sweep_interrupted(trials_path: Path) -> int:
    """Say where the finished rows are (a rerun resumes from them); exit code 130."""
    data = trials_path.read_bytes() if trials_path.is_file() else b""
    rows = max(0, data.count(b"\n") - 1)  # whole lines after the header (a torn one is cut on resume)
    print(
        f"INTERRUPTED: {rows} finished trial{'s' if rows != 1 else ''} in {trials_path}; "
        "rerun the same command to resume from them"
    )
    sys.stdout.flush()
    print("stallfree sweep: interrupted", file=sys.stderr)
    return 130
