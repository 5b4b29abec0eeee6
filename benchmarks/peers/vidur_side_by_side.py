"""stallfree vs Vidur on the same requests: wall time, peak RSS and TTFT / TPOT percentiles.

The workload is sampled once by stallfree (the arXiv trace's lengths, Poisson arrivals at
``--qps``, seed 0, prompt + output capped at 4,096 tokens because Vidur's predictors stop
there) and written as a trace that Vidur replays (its ``trace_replay`` generator) and stallfree
replays (``--trace``): both simulators see the same arrival times and lengths. Scheduling is
Sarathi-style on both: a 512-token budget per step (Vidur's ``chunk_size``), at most 128
running requests, Llama-3-8B on one A100 (Vidur's ``a100`` profiles; stallfree's
``a100-80gb`` roofline, also derated to 70 % of peak compute and bandwidth, which is what
``roofline_vs_vidur.py`` measured the real linear layers reach).

Vidur (PyPI ``vidur`` 0.0.26) is installed into its own venv (``--venv``, created when missing)
and run offline as ``PROFILING/README.md`` describes: the operator profiles from
``PROFILING`` (pass ``../shared/vidur-profiling``) plus an attention profile *modelled* by
``PROFILING/tools/make_synth_attention.py`` (so Vidur's numbers here are "Vidur with modelled
attention"), predictors trained on the small grid. A first, short Vidur run trains and caches
the predictors; the timed run is warm. Wall time and peak RSS come from ``/usr/bin/time``
around each whole process. With mypyc installed (``.[dev]``), a last row runs the measured model
on the optional compiled build (``make compiled``), built into a copy under ``--workdir``.

    .venv/bin/python benchmarks/peers/vidur_side_by_side.py ../shared/vidur-profiling
    .venv/bin/python benchmarks/peers/vidur_side_by_side.py ../shared/vidur-profiling --num-requests 1000
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from stallfree.workload import TraceLengths, Workload, poisson, sample

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import compiled

MAX_TOKENS = 4096
BUDGET = 512
MAX_NUM_SEQS = 128
PERCENTILES = (50, 90, 99)
RF = "random_forrest_execution_time_predictor_config"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profiling", type=Path, help="Vidur's profiling folder (../shared/vidur-profiling)")
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--qps", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "vidur-venv")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "vidur-side-by-side")
    parser.add_argument(
        "--stallfree-only",
        action="store_true",
        help="skip Vidur (no install, no run): stallfree's rows only, to set against recorded Vidur numbers",
    )
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    trace = args.workdir / f"arxiv_qps{args.qps:g}_{args.num_requests}.csv"
    write_trace(trace, args.num_requests, args.qps, args.seed)
    rows: list[tuple[str, float, float, dict[str, float]]] = []
    if not args.stallfree_only:
        python = ensure_vidur(args.venv)
        prepare_vidur_cache(python, args.profiling.resolve(), args.workdir)
        warmup = args.workdir / "warmup.csv"
        write_trace(warmup, 20, args.qps, args.seed)
        run_vidur(python, warmup, args.workdir, "warmup")  # trains and caches the predictors
        vidur_wall_s, vidur_rss_mb, vidur_out = run_vidur(python, trace, args.workdir, "timed")
        rows.append(("Vidur (modelled attention)", vidur_wall_s, vidur_rss_mb, vidur_metrics(vidur_out)))
    derated = args.workdir / "a100-80gb-70pct.json"
    derated.write_text(
        json.dumps(
            {
                "name": "a100-80gb-70pct",
                "peak_flops_per_s": 0.7 * 312e12,
                "mem_bandwidth_bytes_per_s": 0.7 * 2.039e12,
                "mem_capacity_bytes": 80 * 2**30,
                "interconnect_bandwidth_bytes_per_s": 300e9,
            }
        )
    )
    for label, hardware, cost_model in (
        ("stallfree (roofline)", "a100-80gb", "full"),
        ("stallfree (roofline at 70 %)", str(derated), "full"),
        ("stallfree (measured: Vidur's A100 tables)", "a100-80gb", "measured"),
    ):
        wall_s, rss_mb, out = run_stallfree(trace, hardware, args.workdir, cost_model)
        rows.append((label, wall_s, rss_mb, stallfree_metrics(out)))
    if (Path(sys.executable).parent / "mypyc").exists():  # the optional compiled build (make compiled)
        compiled_src = compiled.build_copy(args.workdir / "compiled")
        env = compiled.environ(compiled_src)
        wall_s, rss_mb, out = run_stallfree(trace, "a100-80gb", args.workdir, "measured", env)
        rows.append(
            ("stallfree (measured, compiled: `make compiled`)", wall_s, rss_mb, stallfree_metrics(out))
        )
    report(rows, args)


def ensure_vidur(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "vidur==0.0.26"], check=True)
    return python


def prepare_vidur_cache(python: Path, profiling: Path, workdir: Path) -> None:
    if (workdir / ".vidur_cache").exists():
        return
    attention = workdir / "attention.csv"
    tools = profiling / "tools"
    subprocess.run(
        [str(python), str(tools / "make_synth_attention.py"), str(attention), "4096", "32", "8"], check=True
    )
    subprocess.run(
        ["bash", str(tools / "make_hf_cache.sh"), str(profiling), str(attention), str(workdir)], check=True
    )


def write_trace(path: Path, num_requests: int, qps: float, seed: int) -> None:
    """The workload in Vidur's trace-replay columns (one date; times in seconds)."""
    workload = Workload(poisson(qps), TraceLengths("arxiv"), max_total_tokens=MAX_TOKENS)
    arrays = sample(workload, num_requests, seed)
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        rows = zip(
            arrays.arrival_time_s.tolist(),
            arrays.num_prompt_tokens.tolist(),
            arrays.max_tokens.tolist(),
            strict=True,
        )
        for time_s, prompt, output in rows:
            writer.writerow(["2023-08-21", repr(time_s), prompt, output])


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run ``cmd``; return wall seconds, peak RSS (MB) and stdout."""
    stats = cwd / "time.txt"
    done = subprocess.run(
        ["/usr/bin/time", "-f", "%e %M", "-o", str(stats), *cmd],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    wall_s, rss_kb = stats.read_text().split()[-2:]
    return float(wall_s), float(rss_kb) / 1024, done.stdout


def run_vidur(python: Path, trace: Path, workdir: Path, name: str) -> tuple[float, float, Path]:
    out = workdir / f"out-{name}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    flags = {
        "replica_config_device": "a100",
        "replica_config_network_device": "a100_pairwise_nvlink",
        "replica_config_model_name": "meta-llama/Llama-3-8B",
        "replica_config_tensor_parallel_size": 1,
        "replica_config_num_pipeline_stages": 1,
        "cluster_config_num_replicas": 1,
        "replica_scheduler_config_type": "sarathi",
        "sarathi_scheduler_config_chunk_size": BUDGET,
        "sarathi_scheduler_config_batch_size_cap": MAX_NUM_SEQS,
        "request_generator_config_type": "trace_replay",
        "trace_request_generator_config_trace_file": trace,
        "trace_request_generator_config_max_tokens": MAX_TOKENS,
        "trace_request_generator_config_prefill_scale_factor": 1,
        "trace_request_generator_config_decode_scale_factor": 1,
        "trace_request_generator_config_time_scale_factor": 1,
        "execution_time_predictor_config_type": "random_forrest",
        f"{RF}_model_profiling_dataset": "local/llama-3-8b-a100",
        f"{RF}_network_profiling_dataset": "local/a100-pairwise-nvlink",
        f"{RF}_prediction_max_tokens_per_request": MAX_TOKENS,
        f"{RF}_kv_cache_prediction_granularity": 64,
        f"{RF}_num_estimators": 250,
        f"{RF}_max_depth": 16,
        f"{RF}_min_samples_split": 2,
        f"{RF}_k_fold_cv_splits": 2,
        "metrics_config_output_dir": out,
    }
    cmd = [str(python), "-m", "vidur.main", "--no-metrics_config_store_plots"]
    for key, value in flags.items():
        cmd += [f"--{key}", str(value)]
    wall_s, rss_mb, _ = timed(cmd, workdir, env)
    return wall_s, rss_mb, out


def run_stallfree(
    trace: Path, hardware: str, workdir: Path, cost_model: str = "full", env: dict[str, str] | None = None
) -> tuple[float, float, Path]:
    """stallfree reads the same rows: its trace reader wants its own column names."""
    ours = trace.with_name(trace.stem + "-stallfree.csv")
    with trace.open() as src, ours.open("w", newline="") as dst:
        writer = csv.writer(dst)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        for row in csv.DictReader(src):
            writer.writerow([row["Time"], row["PromptTokenCount"], row["CompletionTokenCount"]])
    out = workdir / f"stallfree-{Path(hardware).stem}-{cost_model}.csv"
    stallfree = str(Path(sys.executable).parent / "stallfree")
    cmd = [stallfree, "simulate", "--trace", str(ours), "--hardware", hardware, "--cost-model", cost_model]
    cmd += [
        "--token-budget",
        str(BUDGET),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--requests-out",
        str(out),
        "--json",
    ]
    wall_s, rss_mb, _ = timed(cmd, workdir, env)
    return wall_s, rss_mb, out


def vidur_metrics(out: Path) -> dict[str, float]:
    """TTFT = prefill_e2e_time; TPOT = decode_time_execution_plus_preemption_normalized (seconds)."""
    path = max(out.glob("*/request_metrics.csv"), key=lambda p: p.stat().st_mtime)
    with path.open() as f:
        rows = list(csv.DictReader(f))
    ttft = [float(r["prefill_e2e_time"]) for r in rows]
    tpot = [float(r["decode_time_execution_plus_preemption_normalized"]) for r in rows]
    return summarize(ttft, tpot, len(rows))


def stallfree_metrics(records: Path) -> dict[str, float]:
    with records.open() as f:
        rows = [r for r in csv.DictReader(f) if r["finish_reason"] == "length"]
    ttft = [float(r["first_token_s"]) - float(r["arrival_s"]) for r in rows]
    # Vidur's per-request TPOT divides by all decode tokens; vLLM's (ours) by all but the first.
    tpot = [
        (float(r["finish_s"]) - float(r["first_token_s"])) / (int(r["num_output_tokens"]) - 1)
        for r in rows
        if int(r["num_output_tokens"]) > 1
    ]
    return summarize(ttft, tpot, len(rows))


def summarize(ttft_s: list[float], tpot_s: list[float], completed: int) -> dict[str, float]:
    out: dict[str, float] = {"completed": completed}
    for name, values in (("ttft", ttft_s), ("tpot", tpot_s)):
        for p in PERCENTILES:
            out[f"p{p}_{name}_ms"] = float(np.percentile(values, p)) * 1000
    return out


def report(rows: list[tuple[str, float, float, dict[str, float]]], args: argparse.Namespace) -> None:
    print(
        f"{args.num_requests:,} arXiv requests at QPS {args.qps:g} (seed {args.seed}), Llama-3-8B, 1 x A100, "
        f"budget {BUDGET}, max {MAX_NUM_SEQS} seqs\n"
    )
    keys = [f"p{p}_{m}_ms" for m in ("ttft", "tpot") for p in PERCENTILES]
    print("| simulator | wall (s) | peak RSS (MB) | completed | " + " | ".join(keys) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(keys))
    for label, wall_s, rss_mb, m in rows:
        cells = " | ".join(f"{m[k]:.1f}" for k in keys)
        print(f"| {label} | {wall_s:.2f} | {rss_mb:.0f} | {m['completed']:,.0f} | {cells} |")
    if args.stallfree_only:  # no Vidur row to compare with
        return
    vidur_wall = rows[0][1]
    print()
    for label, wall_s, _, m in rows[1:]:
        ratios = ", ".join(f"{k.removesuffix('_ms')} {m[k] / rows[0][3][k]:.2f}x" for k in keys)
        print(f"{label}: {vidur_wall / wall_s:.1f}x faster than Vidur; vs Vidur: {ratios}")


if __name__ == "__main__":
    main()
