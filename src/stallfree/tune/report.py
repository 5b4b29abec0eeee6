"""The human-readable report of ``stallfree tune``, from its JSON object (see
:meth:`stallfree.tune.capacity.TuneResult.to_json` plus the CLI's ``ridge_tokens``,
``slo_notes``, ``wall_s`` and ``backend``)."""

from __future__ import annotations

from typing import Any

from stallfree.metrics import format_metric
from stallfree.sim.report import on_gpus
from stallfree.tune.slo import SLO_FLAGS, Slo


def duration(seconds: float) -> str:
    minutes, secs = divmod(seconds, 60)
    return f"{int(minutes)}m{secs:04.1f}s" if minutes else f"{secs:.1f}s"


def _qps(qps: float) -> str:
    return f"{qps:,.0f}" if qps >= 100 else f"{qps:.3g}"


def format_tune(out: dict[str, Any]) -> str:
    """The human-readable report of a tune JSON object."""
    wl = out["workload"]
    slo_text = ", ".join(
        f"{SLO_FLAGS[name].label} <= {limit:g} {SLO_FLAGS[name].unit}"
        + (f" [{out['slo_notes'][name]}]" if name in out["slo_notes"] else "")
        for name, limit in out["slos"].items()
    )
    gaps = min(
        (t["metrics"]["total_output_tokens"] - t["metrics"]["completed"] for t in out["trials"]), default=0
    )
    drafts_header = f"{'drafts':>7}" if "speculative" in out else ""  # draft lengths searched: their column
    lines = [
        f"{out['model']} on {on_gpus(out)} (cost model {out['cost_model']}"
        + (f" ({out['cost_model_note']})" if out.get("cost_model_note") else "")
        + f"; ridge ~{out['ridge_tokens']:,.0f} tokens)",
        f"workload: {wl['lengths']} lengths, {wl['arrival']} arrivals; each trial {wl['num_requests']:,} requests, "
        f"seed {wl['seed']} (P99 TBT over >= {gaps:,} gaps); prefix caching "
        f"{'on' if out.get('prefix_caching', True) else 'off'}",
        f"SLOs: {slo_text}",
        f"capacity = highest QPS meeting every SLO, binary search to within {out['precision']:.0%}; "
        f"{len(out['trials'])} trials in {duration(out['wall_s'])} on {out['backend']['workers']} "
        f"{out['backend']['name']} worker(s)",
        *(
            [
                f"INTERRUPTED: {out['interrupted']['searches_finished']} of {out['interrupted']['searches']} "
                "(policy, budget) searches had finished; only those are shown"
            ]
            if "interrupted" in out
            else []
        ),
        *_speculative_header(out),
        "",
        f"  {'policy':<16}{'budget':>8}{drafts_header}{'max seqs':>10}{'capacity (QPS)':>16}{'trials':>8}",
    ]
    for policy, entry in out["policies"].items():
        for point in entry["curve"]:
            drafts = point.get("num_speculative_tokens")
            drafts_cell = f"{'' if drafts is None else drafts:>7}" if drafts_header else ""
            best = point["token_budget"] == entry["best_budget"]
            best = best and drafts == entry.get("best_speculative_tokens")
            mark = " *" if best else ""
            cap = ("at least " if point["hit_qps_max"] else "") + _qps(point["capacity_qps"])
            lines.append(
                f"  {policy:<16}{point['token_budget']:>8,}{drafts_cell}"
                f"{point['max_num_seqs']:>10}{cap:>16}{point['num_trials']:>8}{mark}"
            )
    lines += _unfinished_lines(out)
    finished = " of the budgets finished" if "interrupted" in out else ""
    lines += _full_step_notes(out)
    lines += ["", f"best budget per policy{finished} (* above):"]
    for policy, entry in out["policies"].items():
        if entry["best_budget"] is not None:
            drafts = entry.get("best_speculative_tokens")
            with_drafts = f", {drafts} drafts" if drafts is not None else ""
            lines.append(
                f"  {policy:<16}budget {entry['best_budget']:,}{with_drafts}: {_qps(entry['capacity_qps'])} QPS"
            )
            continue
        if "interrupted" in out and not entry["curve"]:
            lines.append(f"  {policy:<16}no budget finished before the interrupt")
            continue
        lines.append(f"  {policy:<16}no budget meets the SLOs at any QPS tried")
        closest = entry.get("closest")
        if closest:
            lines.append(f"  {'':<16}closest: {_describe_trial(closest, out['slos'])}")
    caps = {p: e["capacity_qps"] for p, e in out["policies"].items()}
    if caps.get("chunked") and caps.get("prefill-first"):
        lines.append(
            f"  chunked holds {caps['chunked'] / caps['prefill-first']:.2f}x the capacity of prefill-first"
        )
    commands = out["policies"].get("chunked", {}).get("commands")
    if commands:
        lines += ["", "launch flags (chunked, best budget):", *(f"  {line}" for line in commands.values())]
    lines += _time_budget_lines(out)
    for path in out.get("figures", []):
        if path.endswith(".png"):
            lines.append(f"figure: {path}")
    return "\n".join(lines)


def _speculative_header(out: dict[str, Any]) -> list[str]:
    spec = out.get("speculative")
    if not spec:
        return []
    rates = ", ".join(f"{r:.0%}" for r in spec["acceptance_rates"])
    return [
        f"drafts: chunked also tried with {', '.join(map(str, spec['draft_lengths']))} draft tokens a decode "
        f"({spec['rule']}'s rule; accepted by position {rates}; "
        + (
            "n-gram drafts, free to make)"
            if spec.get("draft", "ngram") == "ngram"
            else f"drafted by {spec['draft']})"
        )
    ]


def _unfinished_lines(out: dict[str, Any]) -> list[str]:
    """An interrupted tune's searches cut short, with how far each had got: capacity at least the
    highest QPS that passed, below the lowest that missed."""
    unfinished = out.get("interrupted", {}).get("unfinished", [])
    if not unfinished:
        return []
    started = [search for search in unfinished if search["num_trials"]]
    lines = ["", "searches cut short, capacity as far as their trials tell:"]
    for search in started:
        step_ms = search["step_budget_ms"]
        budget = f"{step_ms:g} ms" if step_ms is not None else f"{search['token_budget']:,}"
        passed, failed = search["passed_qps"], search["failed_qps"]
        if passed is not None and failed is not None:
            bounds = f"{_qps(passed)} to {_qps(failed)} QPS (passed, missed)"
        elif passed is not None:
            bounds = f"at least {_qps(passed)} QPS (passed; none missed yet)"
        else:
            bounds = f"below {_qps(failed)} QPS (missed; none passed yet)"
        trials = f"{search['num_trials']} trial{'s' if search['num_trials'] != 1 else ''}"
        lines.append(f"  {search['policy']:<16}{budget:>8}  {bounds}, {trials}")
    if len(started) < len(unfinished):
        lines.append(f"  {len(unfinished) - len(started)} more had no trial finished")
    return lines


def _full_step_notes(out: dict[str, Any]) -> list[str]:
    """Why a large chunked budget holds so little: one step full of prompt tokens is itself a
    gap longer than the P99 TBT SLO, so the SLO holds only while full steps stay under 1% of
    the gaps, at a QPS far below what the budget could carry."""
    limit = out["slos"].get("tbt_p99_ms")
    steps = out.get("full_step_ms", {})
    entry = out["policies"].get("chunked")
    if limit is None or entry is None:
        return []
    over = [p for p in entry["curve"] if steps.get(str(p["token_budget"]), 0.0) > limit]
    if not over:
        return []
    budgets = ", ".join(f"{p['token_budget']:,} ({steps[str(p['token_budget'])]:.0f} ms)" for p in over)
    return [
        "",
        f"  chunked budgets whose full step exceeds the P99 TBT SLO of {limit:g} ms: {budgets}.",
        "  A step holding that many prompt tokens is itself a gap over the SLO for every stream, so these",
        "  budgets meet it only at a QPS low enough that such steps stay under 1% of the gaps.",
    ]


def _describe_trial(trial: dict[str, Any], slos: dict[str, float]) -> str:
    parts = [Slo(name, limit).describe(trial["metrics"]) for name, limit in slos.items()]
    return f"budget {trial['token_budget']:,} at {_qps(trial['qps'])} QPS: " + "; ".join(parts)


def _time_budget_lines(out: dict[str, Any]) -> list[str]:
    """The time-budgeted candidates (``--step-budgets-ms``): capacity per target, against the best
    fixed budget, and the closest vLLM / SGLang flags with what they cannot express."""
    tb = out.get("time_budget")
    if not tb:
        return []
    lines = ["", "chunked, chunks sized by time (--step-budget-ms; token cap in brackets):"]
    for point in tb["curve"]:
        mark = " *" if point["step_budget_ms"] == tb["best_step_budget_ms"] else ""
        cap = ("at least " if point["hit_qps_max"] else "") + _qps(point["capacity_qps"])
        lines.append(
            f"  {point['step_budget_ms']:>8g} ms [{point['token_cap']:,}]{cap:>16}{point['num_trials']:>8}{mark}"
        )
    best, fixed = tb["capacity_qps"], tb["best_fixed_capacity_qps"]
    if tb["best_step_budget_ms"] is None:
        lines.append("  no step-time target meets the SLOs at any QPS tried")
        return lines
    versus = f" ({best / fixed:.2f}x the best fixed budget's {_qps(fixed)} QPS)" if fixed else ""
    lines.append(f"  best: {tb['best_step_budget_ms']:g} ms: {_qps(best)} QPS{versus}")
    commands = tb.get("commands")
    if commands:
        lines += [
            f"  closest fixed flags (budget {tb['closest_fixed_budget']:,}: its first chunk fits "
            f"{tb['best_step_budget_ms']:g} ms, a long prompt's later ones do not):",
            f"    {commands['vllm']}",
            f"    {commands['sglang']}",
            f"    {commands['stallfree']}",
            f"  what they cannot express: {commands['cannot_express']}",
        ]
    return lines


def format_fleet(out: dict[str, Any]) -> str:
    """The human-readable report of a fleet tune (``tune --qps Q --router ...``)."""
    wl = out["workload"]
    slo_text = ", ".join(
        f"{SLO_FLAGS[name].label} <= {limit:g} {SLO_FLAGS[name].unit}"
        + (f" [{out['slo_notes'][name]}]" if name in out.get("slo_notes", {}) else "")
        for name, limit in out["slos"].items()
    )
    arrivals = "the trace's arrivals replayed" if wl["arrival"] == "trace" else f"{wl['arrival']} arrivals"
    delay = f", {out['route_delay_ms']:g} ms from router to replica" if out["route_delay_ms"] else ""
    lines = [
        f"{out['model']}, each replica on {on_gpus(out)} (cost model {out['cost_model']})",
        f"workload: {wl['lengths']} lengths, {arrivals} at {_qps(out['qps'])} QPS; each trial "
        f"{wl['num_requests']:,} requests, seed {wl['seed']}; prefix caching "
        f"{'on' if out['prefix_caching'] else 'off'}{delay}",
        f"SLOs: {slo_text}",
        f"fewest replicas meeting every SLO (up to {out['max_replicas']}), doubling then bisection; "
        f"{len(out['trials'])} trials in {duration(out['wall_s'])} on {out['backend']['workers']} "
        f"{out['backend']['name']} worker(s)",
        *(["INTERRUPTED: only the searches that finished are shown"] if out.get("partial") else []),
        "",
    ]
    curves = [p for e in out["routers"].values() for p in e["curve"]]
    host_col, shared_col = (any(p.get(k) for p in curves) for k in ("kv_host_gb", "kv_shared_gb"))  # if any
    usd_col = out.get("prices") is not None
    lines.append(
        f"  {'router':<18}{'budget':>8}"
        + (f"{'host KV GB':>11}" if host_col else "")
        + (f"{'shared KV GB':>13}" if shared_col else "")
        + f"{'replicas':>10}{'GPUs':>7}"
        + (f"{'$/hour':>9}" if usd_col else "")
        + f"{'trials':>8}"
    )
    for router, entry in out["routers"].items():
        best = entry["best"]
        picked = best and (best["token_budget"], best["kv_host_gb"], best["kv_shared_gb"], best["replicas"])
        for point in entry["curve"]:
            n = point["replicas"]
            host, shared = point.get("kv_host_gb", 0.0), point.get("kv_shared_gb", 0.0)
            mark = " *" if picked == (point["token_budget"], host, shared, n) else ""
            shown = (
                f"{n}"
                if n is not None
                else ("unfinished" if not point["finished"] else f">{out['max_replicas']}")
            )
            gpus = f"{n * out['tp']}" if n is not None else "-"
            usd = f"{point['usd_per_hour']:,.2f}" if "usd_per_hour" in point else "-"
            lines.append(
                f"  {router:<18}{point['token_budget']:>8,}"
                + (f"{host:>11,g}" if host_col else "")
                + (f"{shared:>13,g}" if shared_col else "")
                + f"{shown:>10}{gpus:>7}"
                + (f"{usd:>9}" if usd_col else "")
                + f"{point['num_trials']:>8}{mark}"
            )
    lines += ["", "best per router (* above):"]
    for router, entry in out["routers"].items():
        lines += _fleet_best(out, router, entry)
    best = out["best"]
    if best is not None:
        commands = best["commands"]
        lines += [
            "",
            f"launch ({best['replicas']} replicas, {best['router']}, budget {best['token_budget']:,}):",
            f"  vLLM, on each replica's host:  {commands['vllm']['replica']}",
            f"  in front:  {commands['vllm']['router']}",
            f"  SGLang, on each replica's host:  {commands['sglang']['replica']}",
            f"  in front:  {commands['sglang']['router']}",
        ]
    return "\n".join(lines)


def _fleet_best(out: dict[str, Any], router: str, entry: dict[str, Any]) -> list[str]:
    """A router's best fleet, or its closest miss."""
    best = entry["best"]
    if best is None:
        lines = [f"  {router:<18}no budget meets the SLOs with up to {out['max_replicas']} replicas"]
        closest = entry.get("closest")
        if closest:
            parts = "; ".join(Slo(n, limit).describe(closest["metrics"]) for n, limit in out["slos"].items())
            lines.append(
                f"  {'':<18}closest: {closest.get('replicas', 1)} replicas at budget {closest['token_budget']:,}: {parts}"
            )
        return lines
    m = best["metrics"]
    hits = m.get("prefix_cache_hit_rate")
    return [
        f"  {router:<18}{best['replicas']} replicas ({best['gpus']} GPUs, {out['qps'] / best['gpus']:,.3g} req/s a GPU) "
        f"at budget {best['token_budget']:,}: P99 TTFT {m['p99_ttft_ms']:,.0f} ms, P99 TPOT {m['p99_tpot_ms']:.1f} ms"
        + (f", prefix-cache hits {100 * hits:.1f}%" if hits is not None else "")
        + (f" with {best['kv_host_gb']:,g} GB of host KV a replica" if best.get("kv_host_gb") else "")
        + (f", a shared store of {best['kv_shared_gb']:,g} GB" if best.get("kv_shared_gb") else "")
        + (
            f", ${best['usd_per_hour']:,.2f} an hour ({out['qps'] * 3600 / best['usd_per_hour']:,.0f} requests a dollar)"
            if best.get("usd_per_hour")
            else ""
        )
        + f", load max/mean {m.get('load_imbalance') or 1.0:.2f}"
    ]


def format_modes(out: dict[str, Any]) -> str:
    """The human-readable report of ``tune --gpus N --mode agg,disagg``: every layout ranked by
    goodput per GPU, what gave out first above each one's capacity, and the winner's launch lines."""
    wl = out["workload"]
    slo_text = ", ".join(
        f"{SLO_FLAGS[name].label} <= {limit:g} {SLO_FLAGS[name].unit}"
        + (f" [{out['slo_notes'][name]}]" if name in out.get("slo_notes", {}) else "")
        for name, limit in out["slos"].items()
    )
    lines = [
        f"{out['model']} on {out['gpus']} x {out['hardware']} (cost model {out['cost_model']}); "
        f"{' and '.join(out['modes'])} layouts, TP {', '.join(map(str, out['tp_sizes']))}, "
        f"KV between pools over {out['kv_link']}, {out['router']} routing",
        f"workload: {wl['lengths']} lengths, {wl['arrival']} arrivals; each trial {wl['num_requests']:,} "
        f"requests, seed {wl['seed']}",
        f"SLOs: {slo_text}",
        f"capacity = the highest QPS meeting every SLO (doubling then bisection); {len(out['trials'])} trials "
        f"in {duration(out['wall_s'])} on {out['backend']['workers']} {out['backend']['name']} worker(s)",
        *(["INTERRUPTED: only the searches that finished are ranked"] if out.get("partial") else []),
        "",
        f"  {'layout':<18}{'budget':>8}{'QPS':>9}{'QPS/GPU':>9}{'TTFT p99':>10}{'TPOT p99':>10}  above capacity, first missed",
    ]
    for row in out["layouts"]:
        at = row["at_capacity"] or {}
        qps = "-" if row["capacity_qps"] is None else _qps(row["capacity_qps"])
        per = "-" if row["qps_per_gpu"] is None else f"{row['qps_per_gpu']:.3g}"
        busy = ""
        if row["mode"] == "disagg" and at:
            busy = f"; busy P {at['prefill_busy']:.0%} D {at['decode_busy']:.0%} link {at['link_busy']:.1%}"
        binds = ", ".join(SLO_FLAGS[n].label for n in row["binds"]) or (
            "-" if row["finished"] else "unfinished"
        )
        lines.append(
            f"  {row['layout']:<18}{row['token_budget']:>8,}{qps:>9}{per:>9}"
            f"{format_metric(at.get('p99_ttft_ms'), '{:,.0f}'):>10}{format_metric(at.get('p99_tpot_ms'), '{:.1f}'):>10}"
            f"  {binds}{busy}"
        )
    best = out["best"]
    if best is None:
        lines += ["", "no layout meets the SLOs at any QPS tried"]
        return "\n".join(lines)
    lines += [
        "",
        f"best: {best['mode']} {best['layout']} at budget {best['token_budget']:,}: {_qps(best['capacity_qps'])} QPS, {best['qps_per_gpu']:.3g} a GPU",
    ]
    other = best.get("runner_up")
    if other is not None:
        ratio = best["qps_per_gpu"] / other["qps_per_gpu"]
        lines.append(
            f"  {ratio:.2f}x the best {other['mode']} layout ({other['layout']}, budget {other['token_budget']:,}: "
            f"{_qps(other['capacity_qps'])} QPS), which above its capacity misses "
            f"{', '.join(SLO_FLAGS[n].label for n in other['binds']) or 'nothing tried'} first"
        )
    for framework, commands in best["commands"].items():
        lines.append(f"  {framework}:")
        lines += [f"    {role}: {line}" for role, line in commands.items()]
    return "\n".join(lines)
