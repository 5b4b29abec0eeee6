"""The text table of ``stallfree simulate``: policies as columns, vLLM's metrics as rows.

It formats what :func:`~stallfree.sim.simulate` returned (summaries) under a header that says what
ran (the scenario dict the command line builds); a metric with no sample prints "-".
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from stallfree.metrics import format_metric
from stallfree.metrics.io import class_lines
from stallfree.workload import AllAtOnce, GammaArrivals, ReplayArrivals, Workload
from stallfree.workload.arrivals import RateProfile

if TYPE_CHECKING:
    from stallfree.sim.api import SimulationResult


def on_gpus(header: dict[str, Any]) -> str:
    """``"4 x h200-sxm"`` of a report's header, and where a MoE model's experts are split whole
    over them, says so."""
    split = ", experts split whole over them (EP)" if header.get("expert_parallel") else ""
    return f"{header['tp']} x {header['hardware']}{split}"


def _kv_line(sc: dict[str, Any]) -> str:
    if sc.get("num_blocks"):
        return f"KV cache: {sc['num_blocks']:,} blocks of {sc['block_size']} tokens (--num-blocks)"
    if sc.get("profile"):
        return f"KV cache: blocks of {sc['block_size']} tokens as the profiled engine allocates them (max seqs full contexts)"
    return (
        f"KV cache: blocks of {sc['block_size']} tokens at utilisation {sc['gpu_memory_utilization']:g}, "
        "after the weights and the largest step's activations"
    )


def _tiers_line(sc: dict[str, Any]) -> str:
    """The KV tiers below each replica's GPU cache (docs/kv-tiers.md)."""
    parts = []
    if sc.get("kv_host_gb"):
        parts.append(f"a host tier of {sc['kv_host_gb']:,g} GB a replica ({sc['kv_host_link']})")
    if sc.get("kv_shared_gb"):
        parts.append(f"a shared store of {sc['kv_shared_gb']:,g} GB ({sc['kv_shared_link']})")
    return "KV tiers: " + " and ".join(parts) + "; every block a GPU caches written through, LRU"


def describe_workload(workload: Workload) -> str:
    """The arrivals and lengths in a few words (the table's third line)."""
    arrivals, lengths = workload.arrivals, workload.lengths
    if isinstance(arrivals, GammaArrivals):
        when = (
            f"poisson at {arrivals.qps:g} QPS"
            if arrivals.burstiness == 1
            else (f"gamma at {arrivals.qps:g} QPS, burstiness {arrivals.burstiness:g}")
        )
    elif isinstance(arrivals, AllAtOnce):
        when = "all at once"
    elif isinstance(arrivals, ReplayArrivals):
        when = f"arrivals replayed from {arrivals.trace}"
    elif isinstance(arrivals, RateProfile):
        mean = arrivals.expected_requests() / arrivals.period_s
        when = (
            f"poisson at a rate profile's {min(arrivals.qps):g}-{max(arrivals.qps):g} QPS (mean {mean:.3g}) "
            f"over {arrivals.period_s / 3600:g} h"
        )
    else:  # pragma: no cover - a new arrival process
        when = repr(arrivals)
    kind = type(lengths).__name__.removesuffix("Lengths").lower()
    drawn = f"{kind}({', '.join(str(v) for v in dataclasses.astuple(lengths))})"
    sessions = workload.sessions
    if sessions is None:
        return f"{when}; lengths {drawn}"
    return (
        f"sessions of {sessions.turns} turns starting {when.replace(' QPS', '/s')}; each turn's message "
        f"and answer {drawn}; system prompt {sessions.system_prompt_tokens} tokens; a turn "
        f"{sessions.think_time_s:g} s after the previous one arrived"
    )


_DRAFT_COSTS = {
    "ngram": "drafts cost nothing (n-gram)",
    "eagle": "drafted by an EAGLE head, a decoder layer's share of a decode step a pass",
}


def _speculative_line(sc: dict[str, Any]) -> str:
    rates = sc["acceptance_rates"]
    shown = ", ".join(f"{r:.0%}" for r in rates[: sc["num_speculative_tokens"]])
    return (
        f"speculative decoding (chunked): {sc['num_speculative_tokens']} draft tokens a decode, "
        f"{sc['speculative_rule']}'s rule, accepted by position {shown}"
        + (f", drafts in {sc['draft_rate']:.0%} of decode steps" if sc.get("draft_rate", 1) < 1 else "")
        + "; "
        + _DRAFT_COSTS.get(
            sc.get("draft") or "ngram", f"drafted by {sc.get('draft', '')[6:]}, its decode step a pass"
        )
    )


_ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, summary key, format)
    ("completed", "completed", "{:,}"),
    ("rejected", "rejected", "{:,}"),
    ("duration (s)", "duration", "{:,.1f}"),
    ("requests/s", "request_throughput", "{:.3f}"),
    ("output tokens/s", "output_throughput", "{:,.1f}"),
    ("goodput (req/s)", "request_goodput", "{:.3f}"),
    ("TTFT mean (ms)", "mean_ttft_ms", "{:,.1f}"),
    ("TTFT p99 (ms)", "p99_ttft_ms", "{:,.1f}"),
    ("TPOT mean (ms)", "mean_tpot_ms", "{:,.2f}"),
    ("TPOT p99 (ms)", "p99_tpot_ms", "{:,.2f}"),
    ("ITL median (ms)", "median_itl_ms", "{:,.2f}"),
    ("ITL p99 (ms)", "p99_itl_ms", "{:,.2f}"),
    ("ITL max (ms)", "max_itl_ms", "{:,.1f}"),
    ("E2EL p99 (ms)", "p99_e2el_ms", "{:,.0f}"),
    ("sched. delay mean (ms)", "mean_scheduling_delay_ms", "{:,.1f}"),
    ("sched. delay p99 (ms)", "p99_scheduling_delay_ms", "{:,.1f}"),
    ("preemptions", "num_preemptions", "{:,}"),
    ("prefix cache hits", "prefix_cache_hit_rate", "{:.1%}"),
    ("  from the GPU", "kv_gpu_hit_rate", "{:.1%}"),
    ("  from the host tier", "kv_host_hit_rate", "{:.1%}"),
    ("  from the shared store", "kv_shared_hit_rate", "{:.1%}"),
    ("  KV load wait mean (ms)", "mean_kv_load_wait_ms", "{:,.1f}"),
    ("  requests with a hit", "prefix_cache_hit_requests", "{:.1%}"),
    ("  TTFT p50 ms, >1/2 hit", "median_ttft_ms_mostly_cached", "{:,.1f}"),
    ("  TTFT p50 ms, the rest", "median_ttft_ms_mostly_computed", "{:,.1f}"),
    ("draft tokens accepted", "spec_decode_draft_acceptance_rate", "{:.1%}"),
    ("  tokens per verify step", "spec_decode_mean_acceptance_length", "{:.2f}"),
    ("  draft tokens wasted", "spec_decode_wasted_draft_tokens", "{:,}"),
    ("KV blocks", "num_kv_blocks", "{:,}"),
    ("steps", "num_steps", "{:,}"),
    ("step max (ms)", "max_step_ms", "{:,.1f}"),
    ("steps over budget", "num_steps_over_budget", "{:,}"),
    ("  first prompt guarded", "num_guarded_steps", "{:,}"),
    ("  decodes alone over", "num_decode_overruns", "{:,}"),
    ("replicas' load max/mean", "load_imbalance", "{:.2f}"),
    ("simulation wall (s)", "sim_wall_s", "{:.2f}"),
)


_OPTIONAL_ROWS = {
    "request_goodput",
    "prefix_cache_hit_rate",
    "kv_gpu_hit_rate",
    "kv_host_hit_rate",
    "kv_shared_hit_rate",
    "mean_kv_load_wait_ms",
    "prefix_cache_hit_requests",
    "median_ttft_ms_mostly_cached",
    "median_ttft_ms_mostly_computed",
    "num_steps_over_budget",
    "num_guarded_steps",
    "num_decode_overruns",
    "load_imbalance",
    "spec_decode_draft_acceptance_rate",
    "spec_decode_mean_acceptance_length",
    "spec_decode_wasted_draft_tokens",
}


def format_table(scenario: dict[str, Any], summaries: list[dict[str, Any]], outputs: list[str]) -> str:
    """Policies as columns, metrics as rows; a metric with no sample is "-"."""
    sc = scenario
    budget = f"chunk {sc['chunk_tokens']}" if sc["chunk_tokens"] else f"token budget {sc['token_budget']}"
    if sc.get("step_budget_ms"):
        budget = f"step budget {sc['step_budget_ms']:g} ms (cap: {budget})"
    lines = [
        f"{sc['model']} on {on_gpus(sc)} (cost model: {sc['cost_model']}"
        + (f" ({sc['cost_model_note']})" if sc.get("cost_model_note") else "")
        + (f" + {sc['step_overhead_ms']:g} ms a step" if sc["step_overhead_ms"] else "")
        + (", steps varied as the profiled machine's" if sc.get("step_noise") else "")
        + f"); chunked {budget}, "
        f"max {sc['max_num_seqs']} seqs, prefix caching {'on' if sc.get('enable_prefix_caching') else 'off'}"
        + (f", scheduling {sc['scheduling_policy']}" if sc.get("scheduling_policy") else ""),
        *([_speculative_line(sc)] if sc.get("num_speculative_tokens") else []),
        _kv_line(sc),
        *([_tiers_line(sc)] if sc.get("kv_host_gb") or sc.get("kv_shared_gb") else []),
        f"{sc['num_requests']:,} requests: {sc['workload']}, seed {sc['seed']}",
        *(_fleet_lines(sc) if sc.get("replicas", 1) > 1 or sc.get("route_delay_ms") else []),
        "",
        f"  {'':<24}" + "".join(f"{s['policy']:>16}" for s in summaries),
    ]
    for label, key, fmt in _ROWS:
        if key in _OPTIONAL_ROWS and all(s.get(key) is None for s in summaries):
            continue
        cells = [format_metric(s.get(key), fmt) for s in summaries]
        lines.append(f"  {label:<24}" + "".join(f"{c:>16}" for c in cells))
    for s in summaries:
        for reason, count in s["rejected_reasons"].items():
            example = ", e.g." if count > 1 else ""
            lines.append(f"  {s['policy']}: rejected {count:,}{example}: {reason}")
        if not s["completed"]:
            lines.append(
                f"  {s['policy']}: no request completed, so it has no latencies (-); see the rejections above"
                if s["rejected"]
                else f"  {s['policy']}: no request completed, so it has no latencies (-)"
            )
    for s in summaries:
        classes = s.get("classes")
        title = f"{s['policy']}, per class"
        lines += _replica_lines(s) + (class_lines(title, classes) if classes else []) + _disagg_lines(s)
    if outputs:
        lines += ["", "  wrote: " + ", ".join(outputs)]
    return "\n".join(lines)


def _fleet_lines(sc: dict[str, Any]) -> list[str]:
    delay = f", {sc['route_delay_ms']:g} ms from router to replica" if sc.get("route_delay_ms") else ""
    gpus = sc.get("gpus", sc["replicas"] * sc["tp"])
    mix = f" ({sc['fleet']}: the header's hardware is the first's)" if sc.get("fleet") else ""
    return [f"{sc['replicas']} replicas{mix} behind a {sc['router']} router{delay}, {gpus:,} GPUs in all"]


def _replica_lines(summary: dict[str, Any]) -> list[str]:
    """Each replica of a fleet's run: its requests, prefix-cache hits, busy time and P99 TTFT."""
    each = summary.get("replicas")
    if not each:
        return []
    lines = [
        "",
        f"  {summary['policy']}, per replica:",
        f"  {'':<12}{'on':>16}{'requests':>10}{'cache hits':>12}{'busy (s)':>11}{'TTFT p99 (ms)':>15}",
    ]
    for i, r in enumerate(each):
        hits = format_metric(
            None if r["prefix_cache_hit_rate"] is None else 100 * r["prefix_cache_hit_rate"], "{:.1f}%"
        )
        ttft = format_metric(r.get("p99_ttft_ms"), "{:,.1f}")
        lines.append(
            f"  {'replica ' + str(i):<12}{str(r['tp']) + ' x ' + r['hardware']:>16}{r['completed'] + r['rejected']:>10,}{hits:>12}{r['busy_s']:>11,.1f}{ttft:>15}"
        )
    return lines


def _disagg_lines(summary: dict[str, Any]) -> list[str]:
    """A disaggregated run's pools, KV link and each request's way through them."""
    d = summary.get("disaggregation")
    if not d:
        return []

    def pool(name: str) -> str:
        p = d[name]
        budget = f", token budget {p['token_budget']:,}" if name == "prefill" else ""
        plural = "s" if p["replicas"] > 1 else ""
        return f"{p['replicas']} {name} replica{plural} ({p['tp']} GPU{'s' if p['tp'] > 1 else ''} each{budget}) busy {p['busy']:.0%}"

    def stage(name: str) -> str:
        return " / ".join(format_metric(d.get(f"{q}_{name}_ms"), "{:,.1f}") for q in ("median", "p90", "p99"))

    return [
        "",
        f"  {summary['policy']}: {pool('prefill')}, {pool('decode')}; {d['gpus']:,} GPUs",
        f"  KV over {d['kv_link']} ({d['kv_link_bytes_per_s'] / 1e9:,.0f} GB/s a GPU): {d['num_kv_transfers']:,} "
        f"transfers, {d['kv_bytes'] / 1e9:,.1f} GB, the links busy {d['link_busy']:.1%} of the time",
        f"  a request's way (ms, p50 / p90 / p99): arrival to prefill done {stage('prefill')}; "
        f"KV transfer {stage('kv_transfer')}; wait for a decode slot {stage('decode_queue')}",
    ]


def summarize_interruption(
    results: list[SimulationResult], policies: list[str], num_requests: int
) -> dict[str, Any]:
    """What an interrupted run kept: the policy cut short (None if the stop fell between two),
    how many of its requests had finished, and the policies not run."""
    cut = results[-1] if results and results[-1].partial else None
    return {
        "policy": cut.policy if cut is not None else None,
        "requests_finished": len(cut.records) if cut is not None else None,
        "requests": num_requests,
        "simulated_s": cut.summary["duration"] if cut is not None else None,
        "policies_not_run": policies[len(results) :],
    }


def interrupted_text(stopped: dict[str, Any]) -> str:
    parts = []
    if stopped["policy"] is not None:
        parts.append(
            f"{stopped['policy']} stopped after {stopped['simulated_s']:,.1f} s simulated, "
            f"{stopped['requests_finished']:,} of {stopped['requests']:,} requests finished "
            "(its summary covers those; ITL every gap simulated)"
        )
    if stopped["policies_not_run"]:
        parts.append(f"not run: {', '.join(stopped['policies_not_run'])}")
    return "; ".join(parts)
