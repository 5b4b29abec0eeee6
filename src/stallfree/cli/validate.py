"""``stallfree validate``: one workload through the real engine and through the simulator, compared.

The same requests (arrival times, lengths), the same scheduler configuration (policy, token
budget, max sequences, KV blocks, block size, context length) run (1) through ``LLMEngine``
in process on the wall clock (:mod:`stallfree.engine.replay`) and (2) through the simulator
with the measured cost model of ``--profile``. Both are scored by :mod:`stallfree.metrics`.
Printed: measured vs predicted vs ratio for TTFT, TPOT, ITL (median, p99), max ITL and
throughput, and the per-step error: every real step's plan priced by the model against its
measured wall time. ``--measured RESULT.json`` takes a ``stallfree bench --save-result`` file
as the measured side instead (no engine run; with the server's ``--step-log`` of that run, the
per-step error of the served steps too). Where the per-step error is known, the simulation runs
again with each kind of step (decode-only, with prompt tokens) priced at the speed this run's
steps ran (``at run speed``): not a prediction, but the simulator's check with the machine's
drift taken out. ``--step-noise`` adds a prediction with each step varied as the profiled
machine's steps varied.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from stallfree.cli.common import DTYPE_CHOICES, ENGINE_MODELS, UsageError, positive_float, positive_int
from stallfree.core import DEFAULT_STEP_TOKEN_CAP, DEFAULT_TOKEN_BUDGET
from stallfree.sim.costs import CostChoice

_DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else ""

_EPILOG = """\
examples:
  stallfree profile --model random:medium --out medium.profile.json
  stallfree validate --profile medium.profile.json --qps 1 --lengths fixed:512,64 --num-requests 150 \\
      --policy chunked,prefill-first --token-budget 64 --plot out/validate
  stallfree validate --profile medium.profile.json --measured bench-result.json --token-budget 64
"""

# (label, summary key, format) of the comparison table.
ROWS: tuple[tuple[str, str], ...] = (
    ("TTFT median (ms)", "median_ttft_ms"),
    ("TTFT p99 (ms)", "p99_ttft_ms"),
    ("TPOT median (ms)", "median_tpot_ms"),
    ("TPOT p99 (ms)", "p99_tpot_ms"),
    ("ITL median (ms)", "median_itl_ms"),
    ("ITL p99 (ms)", "p99_itl_ms"),
    ("ITL max (ms)", "max_itl_ms"),
    ("output tokens/s", "output_throughput"),
    ("requests/s", "request_throughput"),
    ("duration (s)", "duration"),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "validate",
        help="the same workload through the real engine and the measured simulator: predicted vs measured",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--profile", required=True, help="step profile from `stallfree profile`")
    p.add_argument("--model", help=f"{ENGINE_MODELS} (default: the profiled model)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, help="engine dtype (default: the profile's)")
    p.add_argument("--device", help="cpu or cuda (default: the profile's)")
    p.add_argument(
        "--measured",
        metavar="RESULT.json",
        help="a `stallfree bench --save-result` file as the measured side",
    )
    p.add_argument(
        "--step-log",
        metavar="FILE",
        help="with --measured: the server's `serve --step-log` of that run, for the per-step error",
    )
    g = p.add_argument_group("scheduler (the same for both sides)")
    g.add_argument("--policy", default="chunked", help="policy or comma list (default %(default)s)")
    g.add_argument(
        "--token-budget", type=positive_int, help=f"chunked: tokens per step (default {DEFAULT_TOKEN_BUDGET})"
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        help="prefill-first/decode-first: prompt tokens a step batches (default max-model-len)",
    )
    g.add_argument(
        "--max-num-seqs", type=positive_int, default=64, help="running requests at most (default 64)"
    )
    g.add_argument(
        "--step-budget-ms",
        type=positive_float,
        metavar="MS",
        help="chunked: size prompt chunks so each step's predicted time (the profile's model, on "
        "both sides) stays within MS; --token-budget is then a cap",
    )
    g.add_argument("--max-model-len", type=positive_int, help="context length (default: the model's)")
    g.add_argument("--num-blocks", type=positive_int, help="KV-cache blocks (default: the engine's sizing)")
    g.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block (default 16)")
    g.add_argument(
        "--sampling",
        choices=("greedy", "temperature", "top-p"),
        default="greedy",
        help="every request's sampler (temperature: T=1; top-p: T=1, p=0.9; default greedy)",
    )
    g = p.add_argument_group("workload")
    g.add_argument("--qps", type=float, default=1.0, help="Poisson arrivals per second (default 1)")
    g.add_argument("--burstiness", type=float, help="gamma shape (1 = Poisson)")
    g.add_argument("--lengths", default="fixed:512,64", help="length distribution (default %(default)s)")
    g.add_argument("--num-requests", type=positive_int, default=150, help="requests (default 150)")
    g.add_argument("--seed", type=int, default=0, help="workload seed (default 0; --step-noise's too)")
    g = p.add_argument_group("output")
    g.add_argument(
        "--step-noise",
        action="store_true",
        help="also predict with each step's time varied as the profiled machine's steps varied "
        "(`stallfree profile`'s repeats and reference steps): the tails of a noisy host",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--plot", metavar="DIR", help="overlaid CDFs of TTFT and ITL, measured vs predicted")
    g.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from stallfree.cli.simulate import _policies
    from stallfree.sim.measured import MeasuredCostModel
    from stallfree.specs.step_profile import load_profile

    policies = _policies(args.policy)
    profile = load_profile(args.profile)
    model = MeasuredCostModel(profile, sampling=args.sampling)
    if args.step_budget_ms is not None and "chunked" not in policies:
        raise UsageError("--step-budget-ms applies to the chunked policy only")
    if args.step_log and not args.measured:
        raise UsageError(
            "--step-log goes with --measured (in process, validate times the engine's steps itself)"
        )
    if args.measured and len(policies) != 1:
        raise UsageError("--measured compares one run: give one --policy")
    results = [_validate_policy(args, policy, model) for policy in policies]
    body: dict[str, Any] = {
        "profile": profile.describe(),
        "scenario": {
            "model": args.model or profile.fingerprint.get("model"),
            # a bench result brings its own requests and arrival times
            "qps": None if args.measured else args.qps,
            "lengths": None if args.measured else args.lengths,
            "num_requests": results[0]["completed"]["requests"] if args.measured else args.num_requests,
            "seed": args.seed,
            "sampling": args.sampling,
            "measured": args.measured or "engine in process",
        },
        "policies": {r["policy"]: {k: v for k, v in r.items() if not k.startswith("_")} for r in results},
    }
    if args.step_noise:  # the factors' spread: p1, p10, median, p90, p99
        body["step_noise"] = [float(q) for q in np.percentile(model.step_noise(), [1, 10, 50, 90, 99])]
    if len(results) > 1:
        body["ordering"] = _ordering(list(body["policies"].values()))
    if args.plot:
        body["outputs"] = _plot(results, args.plot)
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(format_report(body))
    return 0


def _serving(args: argparse.Namespace, policy: str) -> Any:
    """One scheduling configuration for both sides (the chunked default caps max_num_seqs)."""
    from stallfree.core.serving import ServingConfig

    budget = args.token_budget if policy == "chunked" else args.max_num_batched_tokens
    step_budget_ms = args.step_budget_ms if policy == "chunked" else None
    max_num_seqs = args.max_num_seqs
    if policy == "chunked":  # --max-num-seqs defaults to 64 here: keep it inside the budget
        default = DEFAULT_TOKEN_BUDGET if step_budget_ms is None else DEFAULT_STEP_TOKEN_CAP
        max_num_seqs = min(max_num_seqs, budget or default)
    try:
        return ServingConfig(
            policy=policy,
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            max_model_len=args.max_model_len,
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            step_budget_ms=step_budget_ms,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _validate_policy(args: argparse.Namespace, policy: str, model: Any) -> dict[str, Any]:
    from dataclasses import replace

    from stallfree.metrics import summarize
    from stallfree.sim import simulate

    serving = _serving(args, policy)
    per_step: dict[str, Any] | None = None
    planned_by: dict[str, float] | None = None  # a time budget's engine predictor, at the end
    machine: dict[str, dict[str, float]] | None = None  # the profile's reference steps, profiled vs now
    measured_itl: Any
    if args.measured:
        from stallfree.workload.bench_result import load_bench_result

        if serving.num_blocks is None:
            raise UsageError("--measured needs --num-blocks (the served engine's KV blocks)")
        bench = load_bench_result(args.measured)
        requests = list(bench.arrays.iter_requests())
        records, measured_itl, duration = bench.records, bench.itl, bench.duration_s
        if args.step_log:
            from stallfree.server.step_log import load_step_log

            per_step = step_errors(model, load_step_log(args.step_log), serving.step_budget_s)
    else:
        run, engine, requests = _engine_run(args, serving, model)
        machine = _machine(model.profile, engine)
        if engine.predictor is not None and engine.step_budget_stats is not None:
            # what the engine planned by: the profile scaled by measured / predicted (CalibratedPredictor)
            planned_by = {
                "final_scale": engine.predictor.scale,
                "mean_abs_error": engine.step_budget_stats.mean_prediction_error,
            }
        records, measured_itl, duration = run.records, run.itl, run.duration_s
        serving = replace(
            serving, num_blocks=engine.model_runner.kv_cache.num_blocks, max_model_len=engine.max_model_len
        )
        del engine  # its weights and KV cache are not needed for the simulation
        per_step = step_errors(model, run.steps, serving.step_budget_s)
    measured = summarize(records, measured_itl, duration)
    measured["max_itl_ms"] = max((r.max_itl_s for r in records if r.is_completed), default=0.0) * 1000
    sim = simulate(requests, CostChoice(kind="measured", profile=model), serving)
    predicted = sim.summary
    comparison = {
        key: {
            "measured": measured.get(key),
            "predicted": predicted.get(key),
            "ratio": _ratio(predicted.get(key), measured.get(key)),
        }
        for _, key in ROWS
    }
    extra = {}  # further predictions: with noise; at the run's own step speed (not a prediction)
    if args.step_noise:
        extra["with_noise"] = {"step_noise": True, "seed": args.seed}
    run_scales = None
    if per_step is not None:
        # Each kind of step priced at the speed this run's steps ran (1 / (1 + median error)):
        # what the simulator gives when the step prices are right, the machine's drift taken out.
        run_scales = tuple(
            1 / (1 + per_step[kind]["median_error"]) if per_step[kind]["num_steps"] else 1.0
            for kind in ("decode_only", "with_prompt_tokens")
        )
        extra["at_run_speed"] = {"step_scales": run_scales}
    for name, options in extra.items():
        again = simulate(requests, CostChoice(kind="measured", profile=model), serving, **options).summary
        for key, m in comparison.items():
            m[name] = again.get(key)
            m[f"{name}_ratio"] = _ratio(m[name], m["measured"])
    target: dict[str, Any] | None = None
    if serving.step_budget_ms is not None:
        target = {
            "step_budget_ms": serving.step_budget_ms,
            "steps_over": {
                "measured": None if per_step is None else per_step["num_steps_over_target"],
                "predicted": predicted["num_steps_over_budget"],
            },
            "num_steps": {
                "measured": None if per_step is None else per_step["num_steps"],
                "predicted": predicted["num_steps"],
            },
            "max_step_ms": {
                "measured": None if per_step is None else per_step["max_step_ms"],
                "predicted": predicted["max_step_ms"],
            },
            "engine_predictor": planned_by,
        }
    return {
        "policy": policy,
        "time_budget": target,
        "token_budget": serving.token_budget
        if policy == "chunked"
        else serving.whole_prompt_cap(serving.max_model_len or 1 << 30),
        "max_num_seqs": serving.num_seqs_limit,
        "num_blocks": serving.num_blocks,
        "completed": {
            "measured": measured["completed"],
            "predicted": predicted["completed"],
            "requests": len(requests),
        },
        "metrics": comparison,
        "per_step": per_step,
        "run_step_scales": run_scales,
        "machine": machine,
        "_itl": (measured_itl, sim.itl),
        "_ttft": (
            [
                r.first_token_s - r.arrival_s
                for r in records
                if r.first_token_s is not None and r.is_completed
            ],
            [
                r.first_token_s - r.arrival_s
                for r in sim.records
                if r.first_token_s is not None and r.is_completed
            ],
        ),
    }


def _engine_run(args: argparse.Namespace, serving: Any, model: Any) -> tuple[Any, Any, list[Any]]:
    """The workload through ``LLMEngine`` on the wall clock: the replay run, the engine, the requests."""
    from tqdm import tqdm

    from stallfree.core import SamplingParams
    from stallfree.engine.engine import LLMEngine
    from stallfree.engine.replay import replay
    from stallfree.workload import WorkloadOptions, sample, workload_from_options

    fp = model.profile.fingerprint
    workload = workload_from_options(
        WorkloadOptions(
            arrival="poisson" if args.burstiness is None else "gamma",
            qps=args.qps,
            burstiness=args.burstiness,
            lengths=args.lengths,
        )
    )
    requests = list(sample(workload, args.num_requests, args.seed).iter_requests())
    engine = LLMEngine(
        args.model or str(fp.get("model")),
        dtype=args.dtype or str(fp.get("dtype", "auto")),
        device=args.device or fp.get("device"),
        serving=serving,
        seed=args.seed,
        step_time_predictor=model.step_time_s if serving.step_budget_ms is not None else None,
    )
    _warm_up(engine)
    sampling = {
        "greedy": SamplingParams(temperature=0.0),
        "temperature": SamplingParams(temperature=1.0),
        "top-p": SamplingParams(temperature=1.0, top_p=0.9),
    }[args.sampling]
    show = sys.stderr.isatty() and not args.no_progress
    with tqdm(total=len(requests), disable=not show, unit="req", file=sys.stderr, desc=serving.policy) as bar:
        run = replay(engine, requests, sampling=sampling, seed=args.seed, on_finish=bar.update)
    return run, engine, requests


def _machine(profile: Any, engine: Any) -> dict[str, dict[str, float]] | None:
    """The profile's reference steps (``stallfree profile`` times them throughout): each one's
    median when profiled, and its time again on the idle engine after the run. Is this machine as
    fast now, for memory-bound (decode) and compute-bound (prompt) steps?"""
    import statistics

    from stallfree.engine.profiler import reference_times_s
    from stallfree.specs.step_profile import REFERENCES

    settings = profile.settings
    if not settings.get("reference_step_s") or engine.has_unfinished_requests():
        return None
    engine.model_runner.reset()  # the last finished requests' tables (the scheduler freed their blocks)
    now = reference_times_s(engine.model_runner, int(settings.get("max_num_seqs", 16)), 5)
    return {
        kind: {"profiled_s": float(statistics.median(settings[key])), "after_run_s": now[kind]}
        for key, kind in REFERENCES.items()
        if settings.get(key)
    }


def machine_summary(machine: dict[str, dict[str, float]]) -> str:
    """``decode 48.3 ms after the run vs 46.1 profiled (+5%), prompt ...``"""
    return ", ".join(
        f"{kind} {t['after_run_s'] * 1e3:.1f} ms after the run vs {t['profiled_s'] * 1e3:.1f} profiled"
        f" ({t['after_run_s'] / t['profiled_s'] - 1:+.0%})"
        for kind, t in machine.items()
    )


def _warm_up(engine: Any) -> None:
    """A few steps before the clock starts: the first calls of each kernel are slow."""
    from stallfree.core import SamplingParams

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for n in (8, 64):
        engine.add_request(f"warm-up-{n}", prompt_token_ids=[5] * n, sampling_params=params)
    while engine.has_unfinished_requests():
        engine.step()


def step_errors(model: Any, steps: list[Any], target_s: float | None = None) -> dict[str, Any]:
    """Each real step's plan priced by ``model`` against its measured wall time (and, with a
    step-time ``target_s``, how many real steps took longer than it)."""
    measured = np.array([s.duration_s for s in steps])
    predicted = np.array([model.step_time_s(s.plan) for s in steps])
    errors = predicted / measured - 1
    abs_errors = np.abs(errors)
    decode_only = np.array([s.plan.num_prefill_tokens == 0 for s in steps])

    def summary(mask: Any) -> dict[str, float | int]:
        if not mask.any():
            return {"num_steps": 0}
        return {
            "num_steps": int(mask.sum()),
            "median_abs_error": float(np.median(abs_errors[mask])),
            "p90_abs_error": float(np.percentile(abs_errors[mask], 90)),
            "median_error": float(np.median(errors[mask])),
        }

    return {
        **summary(np.ones(len(steps), dtype=bool)),
        "measured_step_s_total": float(measured.sum()),
        "predicted_step_s_total": float(predicted.sum()),
        "decode_only": summary(decode_only),
        "with_prompt_tokens": summary(~decode_only),
        **(
            {}
            if target_s is None
            else {
                "num_steps_over_target": int((measured > target_s).sum()),
                "num_predicted_over_target": int((predicted > target_s).sum()),
                "max_step_ms": float(measured.max(initial=0.0)) * 1000,
            }
        ),
    }


def _ratio(predicted: Any, measured: Any) -> float | None:
    if predicted is None or measured is None or not measured:
        return None
    return float(predicted) / float(measured)


# further predictions a report can carry: (metrics key, column label)
_EXTRA_COLUMNS = (("with_noise", "with noise"), ("at_run_speed", "at run speed"))


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def _ordering(results: list[dict[str, Any]]) -> dict[str, bool]:
    """Whether the policies rank the same, measured and predicted, on TTFT and on the ITL tail."""
    out = {}
    for key in ("median_ttft_ms", "p99_ttft_ms", "p99_itl_ms", "max_itl_ms"):
        measured = [r["metrics"][key]["measured"] or 0.0 for r in results]
        predicted = [r["metrics"][key]["predicted"] or 0.0 for r in results]
        out[key] = bool(np.array_equal(np.argsort(measured), np.argsort(predicted)))
    return out


def format_report(body: dict[str, Any]) -> str:
    sc = body["scenario"]
    workload = (
        f"poisson {sc['qps']:g} QPS, lengths {sc['lengths']}"
        if sc["qps"] is not None
        else "the measured run's arrivals and lengths"
    )
    lines = [
        f"validate: {sc['model']}, {sc['num_requests']} requests, {workload}, "
        f"sampling {sc['sampling']}; measured: {sc['measured']}",
        f"profile: {body['profile']}",
    ]
    if body.get("step_noise"):
        q = body["step_noise"]
        lines.append(
            "with noise: each step's time x a factor drawn from how the profiled machine's steps varied "
            f"(p1 {q[0]:.2f}, p10 {q[1]:.2f}, median {q[2]:.2f}, p90 {q[3]:.2f}, p99 {q[4]:.2f})"
        )
    for policy, r in body["policies"].items():
        columns = [(c, label) for c, label in _EXTRA_COLUMNS if c in r["metrics"]["median_ttft_ms"]]
        budget = (
            f"token budget {r['token_budget']}" if policy == "chunked" else f"batch cap {r['token_budget']}"
        )
        if r["time_budget"] is not None:
            budget = f"time budget {r['time_budget']['step_budget_ms']:g} ms, token cap {r['token_budget']}"
        lines += [
            "",
            f"{policy} ({budget}, max {r['max_num_seqs']} seqs, {r['num_blocks']} KV blocks); completed "
            f"{r['completed']['measured']} measured, {r['completed']['predicted']} predicted",
            f"  {'':<20}{'measured':>12}{'predicted':>12}{'ratio':>8}"
            + "".join(f"{label:>14}{'ratio':>8}" for _, label in columns),
        ]
        for label, key in ROWS:
            m = r["metrics"][key]
            line = f"  {label:<20}{_num(m['measured']):>12}{_num(m['predicted']):>12}{_ratio_text(m['ratio']):>8}"
            for c, _ in columns:
                line += f"{_num(m[c]):>14}{_ratio_text(m[f'{c}_ratio']):>8}"
            lines.append(line)
        steps = r["per_step"]
        if steps:
            lines.append(
                f"  per-step error over {steps['num_steps']} engine steps: median {steps['median_abs_error']:.1%}, "
                f"p90 {steps['p90_abs_error']:.1%} (bias {steps['median_error']:+.1%}); "
                f"step time summed {steps['predicted_step_s_total']:.1f} s predicted vs {steps['measured_step_s_total']:.1f} s"
            )
            for part in ("decode_only", "with_prompt_tokens"):
                s = steps[part]
                if s["num_steps"]:
                    lines.append(
                        f"    {part.replace('_', ' '):<20} {s['num_steps']:>6} steps: median {s['median_abs_error']:.1%}, "
                        f"p90 {s['p90_abs_error']:.1%} (bias {s['median_error']:+.1%})"
                    )
        if r.get("run_step_scales"):
            decode, prompt = r["run_step_scales"]
            lines.append(
                f"  at run speed: the same simulation with decode-only steps x{decode:.2f} and steps with "
                f"prompt tokens x{prompt:.2f} (this run's per-step bias): not a prediction, the simulator "
                "checked with the machine's drift taken out"
            )
        lines += _target_lines(r["time_budget"], steps)
        if r.get("machine"):
            lines.append(f"  machine: the profile's reference steps took {machine_summary(r['machine'])}")
    if "ordering" in body:
        same = ", ".join(f"{k}: {'same' if v else 'DIFFERENT'}" for k, v in body["ordering"].items())
        lines += ["", f"policy ordering, measured vs predicted: {same}"]
    if body.get("outputs"):
        lines += ["", "wrote: " + ", ".join(body["outputs"])]
    return "\n".join(lines)


def _target_lines(target: dict[str, Any] | None, steps: dict[str, Any] | None) -> list[str]:
    """A time-budgeted run: the steps that took longer than the target, measured and predicted."""
    if target is None:
        return []
    over, num, longest = target["steps_over"], target["num_steps"], target["max_step_ms"]
    line = f"  steps over the {target['step_budget_ms']:g} ms target: "
    if over["measured"] is not None:
        line += f"measured {over['measured']} of {num['measured']} (longest {longest['measured']:.1f} ms), "
    line += f"predicted {over['predicted']} of {num['predicted']} (longest {longest['predicted']:.1f} ms)"
    lines = [line]
    if steps is not None:
        lines.append(
            f"    the model priced {steps['num_predicted_over_target']} of the real steps over the target"
        )
    calibrated = target.get("engine_predictor")
    if calibrated:
        lines.append(
            f"    the engine planned by the profile x {calibrated['final_scale']:.2f} at the end (measured / "
            f"predicted of its recent steps); its steps' mean |error| {calibrated['mean_abs_error']:.1%}"
        )
    return lines


def _num(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:,.3f}"


def _plot(results: list[dict[str, Any]], folder: str) -> list[str]:
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, key in (("itl", "_itl"), ("ttft", "_ttft")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for r in results:
            measured, predicted = r[key]
            for label, data, style in (("measured", measured, "-"), ("predicted", predicted, "--")):
                values, counts = _weighted(data)
                if not len(values):
                    continue
                order = np.argsort(values)
                cdf = np.cumsum(counts[order]) / counts.sum()
                ax.step(values[order] * 1000, cdf, style, where="post", label=f"{r['policy']} {label}")
        ax.set_xscale("log")
        ax.set_xlabel(f"{name.upper()} (ms)")
        ax.set_ylabel("fraction")
        ax.set_title(f"{name.upper()} CDF: real engine vs measured-model simulation")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = out / f"validate-{name}-cdf.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(str(path))
    return written


def _weighted(data: Any) -> tuple[Any, Any]:
    if hasattr(data, "values_s"):
        return np.asarray(data.values_s), np.asarray(data.counts, dtype=np.float64)
    values = np.asarray(data, dtype=np.float64)
    return values, np.ones_like(values)
