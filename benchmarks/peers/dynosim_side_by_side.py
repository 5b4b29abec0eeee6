"""stallfree vs NVIDIA's DynoSim (Dynamo's mocker replay) on the same requests, at the same prices.

DynoSim (``ai-dynamo`` and ``ai-dynamo-runtime`` 1.4.2) is installed into its own venv
(``--venv``, created when missing) and run offline: ``python -m dynamo.replay TRACE --trace-format
mooncake --replay-mode offline``. Every case is one Mooncake JSON-lines file that both replay:
Poisson arrivals with arXiv lengths (no shared prefixes), Mooncake's conversation and synthetic
traces (their prefix-block hashes), and multi-turn sessions (each turn's prompt repeats the
conversation so far), on 1 and 16 workers, round-robin and each side's cache-aware router.

The prices: stallfree's cost model for Llama-3.1-8B on one H100 (its measured GPU tables) is written
in DynoSim's profile-data format (stallfree.interop.dynosim_tables), and DynoSim prices every
pass from it. The "same prices" stallfree row prices every step from those very tables by
DynoSim's rule (DynoSimPricer), so what still differs is scheduling and routing; the "own
prices" rows are stallfree as users run it (``stallfree simulate``, its own step prices), for
speed and to show what DynoSim's pricing rule changes. ``--steps`` first checks single steps:
DynoSim's times for one prompt, one decode and a batch of decodes against stallfree's own
prices of the same step. Wall time and peak RSS come from ``/usr/bin/time`` around each
process; with mypyc installed (``.[dev]``) and ``--compiled``, a row runs the compiled build.

    .venv/bin/python benchmarks/peers/dynosim_side_by_side.py --steps
    .venv/bin/python benchmarks/peers/dynosim_side_by_side.py --cases conversation-16-rr,sessions-1-rr
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compiled

from common.cli import stallfree_argv
from common.host import loadavg, log, machine
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice, CostPick
from stallfree.interop.dynosim import engine_args, write_mooncake, write_profile
from stallfree.sim.deployment import Deployment
from stallfree.workload import Sessions, TraceLengths, UniformLengths, Workload, generate, poisson

DYNAMO = ("ai-dynamo==1.4.2", "ai-dynamo-runtime==1.4.2")
MODEL, HARDWARE = "llama-3.1-8b", "h100-sxm"
BUDGET, MAX_NUM_SEQS, BLOCK_SIZE = 2048, 256, 16
TRACES = Path("/work/shared/traces/mooncake")  # the full traces, where present; else the slices
CASES = {  # name: (workload, workers, router)
    "poisson-1-rr": ("poisson", 1, "round-robin"),
    "poisson-16-rr": ("poisson16", 16, "round-robin"),
    "poisson-16-cache": ("poisson16", 16, "cache-aware"),
    "conversation-16-rr": ("conversation", 16, "round-robin"),
    "conversation-16-cache": ("conversation", 16, "cache-aware"),
    "synthetic-16-rr": ("synthetic", 16, "round-robin"),
    "synthetic-16-cache": ("synthetic", 16, "cache-aware"),
    "sessions-1-rr": ("sessions", 1, "round-robin"),
    "sessions-16-rr": ("sessions16", 16, "round-robin"),
    "sessions-16-cache": ("sessions16", 16, "cache-aware"),
}
# (our summary key, DynoSim report key): the metrics set side by side
METRICS = (
    ("median_ttft_ms", "median_ttft_ms"),
    ("p90_ttft_ms", "p90_ttft_ms"),
    ("p99_ttft_ms", "p99_ttft_ms"),
    ("median_tpot_ms", "median_tpot_ms"),
    ("p99_tpot_ms", "p99_tpot_ms"),
    ("median_itl_ms", "median_itl_ms"),
    ("p99_itl_ms", "p99_itl_ms"),
    ("prefix_cache_hit_rate", "prefix_cache_reused_ratio"),
)


@dataclass(frozen=True, slots=True)
class Run:
    """One simulator's run of one case: its metrics (our keys), wall seconds, peak RSS (MB)."""

    label: str
    metrics: dict[str, float]
    wall_s: float
    rss_mb: float


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--same-prices-child":
        same_prices_child(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--steps", action="store_true", help="check single steps' prices first")
    parser.add_argument("--compiled", action="store_true", help="add a row on the compiled build (mypyc)")
    parser.add_argument(
        "--num-blocks",
        type=int,
        default=29_059,
        help="KV blocks a worker (default: what stallfree sizes for an H100)",
    )
    parser.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="both sides without prefix caching",
    )
    parser.add_argument("--repeat", type=int, default=1, help="time every process N times, keep the fastest")
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "dynosim-venv")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "dynosim-side-by-side")
    args = parser.parse_args()
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.exit(2, f"error: unknown case {unknown[0]!r}; choose from {', '.join(CASES)}\n")
    if args.repeat < 1:
        parser.exit(2, "error: --repeat must be >= 1\n")
    REPEAT[0] = args.repeat
    args.workdir.mkdir(parents=True, exist_ok=True)
    python = ensure_dynosim(args.venv)
    print(f"machine: {machine()}; load {loadavg()}")
    deployment = Deployment(
        costs=CostChoice(kind="measured", model=MODEL, hardware=HARDWARE, gpu_tables="vidur"),
        serving=serving_config(args.num_blocks, args.prefix_caching),
    )
    npz = args.workdir / f"perf_data_{args.num_blocks}.npz"
    if not npz.exists():
        log("writing stallfree's prices as DynoSim's tables")
        write_profile(deployment, npz)
    eargs = engine_args(deployment, npz.resolve())
    print(f"engine args: {json.dumps(eargs)}")
    if args.steps:
        check_steps(python, deployment, eargs, args.workdir)
    compiled_env = None
    if args.compiled:
        built = args.workdir / "compiled" / "src"  # a build from an earlier run is reused
        compiled_env = compiled.environ(built if built.exists() else compiled.build_copy(built.parent))
    for name in names:
        workload, workers, router = CASES[name]
        trace = write_case(workload, args.workdir)
        runs = run_case(
            python, trace, workers, router, (deployment.serving, eargs), npz, args.workdir, compiled_env
        )
        report(name, trace, runs)
    print(f"\nload at the end {loadavg()}; wall times: the fastest of {args.repeat} run(s) of each process")


def serving_config(num_blocks: int, prefix_caching: bool) -> ServingConfig:
    """One replica as both sides run it; no watermark (DynoSim's vLLM mocker admits while blocks
    are free, as vLLM V1 does)."""
    return ServingConfig(
        max_num_batched_tokens=BUDGET,
        max_num_seqs=MAX_NUM_SEQS,
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        watermark=0.0,
        enable_prefix_caching=prefix_caching,
    )


def ensure_dynosim(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating DynoSim's venv at {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *DYNAMO], check=True)
    return python


def write_case(workload: str, workdir: Path) -> Path:
    """The case's requests as one Mooncake JSON-lines file (written once)."""
    path = workdir / f"{workload}.jsonl"
    if path.exists():
        return path
    if workload in ("conversation", "synthetic"):
        full = TRACES / f"{workload}_trace.jsonl"
        if full.exists():
            return full
        from stallfree.interop.dynosim import plain_trace

        return plain_trace(f"mooncake-{workload}", workdir)
    fleet = 16 if workload.endswith("16") else 1
    if workload.startswith("poisson"):
        # arXiv lengths capped at 16K tokens, ~60% of one H100's prefill at 2 QPS per worker
        w = Workload(poisson(2.0 * fleet), TraceLengths("arxiv"), max_total_tokens=16_384)
        requests = generate(w, 2000 * fleet, seed=0)
    else:
        # 5-turn chats: a 1,024-token system prompt shared by all, 200-800-token messages and
        # answers, 10 s between turns, 0.4 sessions a second per worker
        sessions = Sessions(turns=5, system_prompt_tokens=1024, think_time_s=10.0)
        lengths = UniformLengths(200, 800, 200, 800)
        w = Workload(poisson(0.4 * fleet), lengths, sessions=sessions)
        requests = generate(w, 2000 * fleet, seed=0)
    write_mooncake(requests, path)
    return path


REPEAT = [1]  # --repeat: every timed process runs this many times, the fastest kept


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run ``cmd`` ``REPEAT[0]`` times (its outputs are the same each time); the fastest run's
    wall seconds, the largest peak RSS (MB), and stdout."""
    runs = [_timed_once(cmd, cwd, env) for _ in range(REPEAT[0])]
    return min(r[0] for r in runs), max(r[1] for r in runs), runs[-1][2]


def _timed_once(cmd: list[str], cwd: Path, env: dict[str, str] | None) -> tuple[float, float, str]:
    stats = cwd / "time.txt"
    done = subprocess.run(
        ["nice", "/usr/bin/time", "-f", "%e %M", "-o", str(stats), *cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed:\n{done.stderr[-2000:]}")
    wall_s, rss_kb = stats.read_text().split()[-2:]
    return float(wall_s), float(rss_kb) / 1024, done.stdout


def run_dynosim(
    python: Path, trace: Path, workers: int, router: str, eargs: dict[str, Any], workdir: Path
) -> tuple[float, float, dict[str, Any]]:
    out = workdir / f"dynosim-{trace.stem}-{workers}-{router}.json"
    cmd = [str(python), "-m", "dynamo.replay", str(trace), "--trace-format", "mooncake"]
    cmd += ["--trace-block-size", "512", "--num-workers", str(workers), "--replay-mode", "offline"]
    cmd += ["--router-mode", "kv_router" if router == "cache-aware" else "round_robin"]
    cmd += ["--extra-engine-args", json.dumps(eargs), "--report-json", str(out)]
    wall_s, rss_mb, _ = timed(cmd, workdir)
    return wall_s, rss_mb, json.loads(out.read_text())


def dynosim_metrics(report: dict[str, Any]) -> dict[str, float]:
    """DynoSim's report in our keys (None where it has no such figure)."""
    out = {ours: float(report[theirs]) for ours, theirs in METRICS if theirs in report}
    out["completed"] = float(report["completed_requests"])
    out["duration_s"] = float(report["duration_ms"]) / 1000
    return out


def simulate_args(trace: Path, workers: int, router: str, serving: ServingConfig) -> list[str]:
    args = ["simulate", "--trace", str(trace), "--model", MODEL, "--hardware", HARDWARE]
    args += [
        "--cost-model",
        "measured",
        "--gpu-tables",
        "vidur",
        "--token-budget",
        str(BUDGET),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
    ]
    args += ["--block-size", str(BLOCK_SIZE), "--num-blocks", str(serving.num_blocks), "--kv-watermark", "0"]
    if not serving.enable_prefix_caching:
        args.append("--no-enable-prefix-caching")
    return [*args, "--replicas", str(workers), "--router", router, "--json"]


def stallfree_metrics(stdout: str) -> dict[str, float]:
    summary = json.loads(stdout)["policies"]["chunked"]
    out = {ours: float(summary[ours]) for ours, _ in METRICS if summary.get(ours) is not None}
    out["completed"] = float(summary["completed"])
    out["duration_s"] = float(summary["duration"])
    out["preemptions"] = float(summary["num_preemptions"])
    return out


def run_case(
    python: Path,
    trace: Path,
    workers: int,
    router: str,
    sides: tuple[ServingConfig, dict[str, Any]],
    npz: Path,
    workdir: Path,
    compiled_env: dict[str, str] | None,
) -> list[Run]:
    serving, eargs = sides
    log(f"{trace.name}: {workers} worker(s), {router}")
    wall_s, rss_mb, dyn = run_dynosim(python, trace, workers, router, eargs, workdir)
    runs = [Run("DynoSim 1.4.2", dynosim_metrics(dyn), wall_s, rss_mb)]
    sim = simulate_args(trace, workers, router, serving)
    me = str(Path(__file__).resolve())
    wall_s, rss_mb, out = timed([sys.executable, me, "--same-prices-child", str(npz), *sim], workdir)
    runs.append(Run("stallfree, same prices", stallfree_metrics(out), wall_s, rss_mb))
    pure = {**os.environ, "STALLFREE_PURE": "1"}
    wall_s, rss_mb, out = timed([*stallfree_argv(), *sim], workdir, pure)
    runs.append(Run("stallfree, own prices (pure)", stallfree_metrics(out), wall_s, rss_mb))
    if compiled_env is not None:
        wall_s, rss_mb, out = timed([*stallfree_argv(), *sim], workdir, compiled_env)
        runs.append(Run("stallfree, own prices (compiled)", stallfree_metrics(out), wall_s, rss_mb))
    return runs


def same_prices_child(npz: str, argv: list[str]) -> None:
    """``stallfree ARGV`` with every replica's steps priced from DynoSim's tables by DynoSim's
    rule: the deployment's pick keeps its model and KV sizing, its pricer is swapped."""
    import dataclasses

    import stallfree.sim.api as api
    from stallfree.cli import main as cli_main
    from stallfree.interop.dynosim_tables import DynoSimPricer, DynoSimTables

    pricer = DynoSimPricer(DynoSimTables.load(npz), BLOCK_SIZE)
    from stallfree.costs.choice import pick_once

    def same_prices(choice: CostChoice) -> CostPick:
        return dataclasses.replace(pick_once(choice), pricer=pricer)

    # the simulator's one seam for a replica's pricer (a CostChoice names tables, not objects)
    setattr(api, "pick_once", same_prices)  # noqa: B010
    sys.exit(cli_main(argv))


def report(name: str, trace: Path, runs: list[Run]) -> None:
    keys = [k for k, _ in METRICS]
    print(f"\n### {name} ({trace.name})\n")
    print("| simulator | wall (s) | peak RSS (MB) | completed | " + " | ".join(keys) + " | preemptions |")
    print("|---|---:|---:|---:|" + "---:|" * (len(keys) + 1))
    base = runs[0]
    for run in runs:
        cells = []
        for k in keys:
            value = run.metrics.get(k)
            if value is None:
                cells.append("n/a")
                continue
            text = f"{value:.3f}" if k == "prefix_cache_hit_rate" else f"{value:.1f}"
            ref = base.metrics.get(k)
            if run is not base and ref:
                text += f" ({(value - ref) / ref:+.1%})"
            cells.append(text)
        pre = run.metrics.get("preemptions")
        print(
            f"| {run.label} | {run.wall_s:.1f} | {run.rss_mb:.0f} | {run.metrics['completed']:,.0f} | "
            + " | ".join(cells)
            + f" | {'n/a' if pre is None else f'{pre:,.0f}'} |"
        )
    for run in runs[1:]:
        print(
            f"{run.label}: {base.wall_s / run.wall_s:.2f}x DynoSim's speed, {run.rss_mb / base.rss_mb:.2f}x its RSS"
        )


def check_steps(python: Path, deployment: Deployment, eargs: dict[str, Any], workdir: Path) -> None:
    """Single steps: DynoSim's time for steps of a known shape (from a one-case replay's
    timestamps) beside the same steps priced from its tables by its rule (DynoSimPricer: the
    format read as DynoSim reads it) and by stallfree's own cost model, with the errors."""
    from stallfree.core.plan import ScheduledChunk, StepPlan, synthetic_plan
    from stallfree.costs.choice import pick_once
    from stallfree.interop.dynosim_tables import DynoSimPricer, DynoSimTables

    own = pick_once(deployment.costs).pricer
    rule = DynoSimPricer(DynoSimTables.load(eargs["planner_profile_data"]), BLOCK_SIZE)
    print(
        "\nsingle steps: DynoSim (on stallfree's tables) vs the tables read by DynoSim's rule and vs stallfree's own price"
    )
    print("| step(s) | DynoSim (ms) | tables, DynoSim's rule (ms) | error | stallfree's own (ms) | error |")
    print("|---|---:|---:|---:|---:|---:|")
    shapes = [(1, 512), (1, 2000), (1, 6000), (8, 200), (64, 30), (128, 15)]  # (requests at once, prompt)
    for count, prompt in shapes:
        trace = workdir / f"step-{count}x{prompt}.jsonl"
        rows = [
            {
                "timestamp": 0,
                "input_length": prompt,
                "output_length": 3,
                "hash_ids": [i * 100 + b for b in range(-(-prompt // 512))],
            }
            for i in range(count)
        ]
        trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = workdir / f"step-{count}x{prompt}.report.jsonl"
        cmd = [str(python), "-m", "dynamo.replay", str(trace), "--trace-format", "mooncake"]
        cmd += ["--trace-block-size", "512", "--num-workers", "1", "--replay-mode", "offline"]
        cmd += ["--extra-engine-args", json.dumps(eargs), "--report-json", str(workdir / "step.json")]
        timed([*cmd, "--report-jsonl", str(out)], workdir)
        rec = json.loads(out.read_text().splitlines()[0])
        # the prompts' steps: chunks of the budget, the last one emitting the first tokens
        prompt_steps, done = [], 0
        while done < prompt:
            n = min(BUDGET // count, prompt - done)
            prompt_steps.append(
                StepPlan(tuple(ScheduledChunk(f"p{i}", done, n, prompt) for i in range(count)))
            )
            done += n
        decode = synthetic_plan(count, prompt)
        label = f"{count} prompt(s) of {prompt:,} tokens ({len(prompt_steps)} step(s)), to first tokens"
        for text, theirs, plans in (
            (label, rec["ttft_ms"], prompt_steps),
            (f"{count} decode(s) at {prompt + 1:,} tokens", rec["ttst_ms"], [decode]),
        ):
            tables = sum(rule.step_time_s(p) for p in plans) * 1000
            ours = sum(own.step_time_s(p) for p in plans) * 1000
            print(
                f"| {text} | {theirs:.3f} | {tables:.3f} | {(theirs - tables) / tables:+.2%} "
                f"| {ours:.3f} | {(theirs - ours) / ours:+.1%} |"
            )


if __name__ == "__main__":
    main()
