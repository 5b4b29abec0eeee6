"""``stallfree tune --classes``: the capacity of a traffic mix in which every class keeps its own SLOs.

A mix (:class:`~stallfree.workload.classes.TrafficClasses`) is scaled as a whole: scale ``s``
runs every class at ``s`` times its rate. For each scheduling policy (``fcfs``, ``priority``) and
token budget a :class:`~stallfree.tune.search.CapacitySearch` finds the highest scale whose
seeded simulation meets every class's SLOs (each judged on that class's requests alone); the
capacity is that scale times the mix's total rate. The best candidate is the one of highest
capacity (ties: the first listed), with its launch line. Trials run one after another, in process.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from stallfree.sim.api import simulate
from stallfree.sim.deployment import Deployment
from stallfree.tune.search import CapacitySearch, SearchConfig
from stallfree.tune.slo import SLO_FLAGS, Slo, Slos
from stallfree.workload.classes import TrafficClasses


@dataclass(frozen=True, slots=True)
class ClassesTuneConfig:
    """What to search: ``slos`` maps a class name to the SLOs its requests must meet (classes not
    named have none); every (scheduling policy, budget) pair is a candidate."""

    classes: TrafficClasses
    base: Deployment
    slos: dict[str, Slos]
    scheduling_policies: tuple[str, ...] = ("fcfs", "priority")
    budgets: tuple[int, ...] = (512,)
    num_requests: int = 1000
    seed: int = 0
    precision: float = 0.05

    def __post_init__(self) -> None:
        if not self.slos:
            raise ValueError("give at least one class SLO (--class-slo CLASS:NAME=LIMIT)")
        for name in self.slos:
            self.classes.by_name(name)  # an unknown class is an error
        if not self.scheduling_policies or not self.budgets:
            raise ValueError("give at least one scheduling policy and one budget")


def parse_class_slo(text: str) -> tuple[str, Slo]:
    """``chat:tpot-p99-ms=50`` -> ("chat", Slo("tpot_p99_ms", 50)); ValueError says what is wrong."""
    name, sep, rest = text.partition(":")
    key, eq, value = rest.partition("=")
    if not (sep and eq and name and key):
        raise ValueError(f"bad class SLO {text!r}; expected CLASS:NAME=LIMIT such as chat:tpot-p99-ms=50")
    slo_name = key.strip().replace("-", "_")
    if slo_name not in SLO_FLAGS:
        names = ", ".join(n.replace("_", "-") for n in SLO_FLAGS)
        raise ValueError(f"unknown SLO {key!r} in {text!r}; choose from {names}")
    try:
        limit = float(value)
    except ValueError:
        raise ValueError(f"SLO limit in {text!r} must be a number") from None
    return name, Slo(slo_name, limit)


def tune_classes(config: ClassesTuneConfig) -> dict[str, Any]:
    """Each candidate's capacity, the best, and each candidate's trials (scale, passed, worst SLO)."""
    total = config.classes.qps
    candidates: list[dict[str, Any]] = []
    for policy in config.scheduling_policies:
        for budget in config.budgets:
            serving = replace(config.base.serving, scheduling_policy=policy, max_num_batched_tokens=budget)
            deployment = replace(config.base, serving=serving)
            search = CapacitySearch(SearchConfig(1.0, config.precision, 0.01, 1000.0))
            trials = []
            while (scale := search.next_qps()) is not None:
                passed, worst = _trial(config, deployment, scale)
                search.record(scale, passed)
                trials.append({"scale": scale, "qps": scale * total, "passed": passed, "worst": worst})
            candidates.append(
                {
                    "scheduling_policy": policy,
                    "token_budget": budget,
                    "capacity_qps": search.capacity_qps * total,
                    "scale": search.capacity_qps,
                    "trials": trials,
                    "launch": _launch(policy, budget),
                }
            )
    best = max(candidates, key=lambda c: c["capacity_qps"])
    return {
        "classes": {c.name: {"qps": c.qps, "priority": c.priority} for c in config.classes.classes},
        "slos": {name: {s.name: s.limit for s in slos.slos} for name, slos in config.slos.items()},
        "num_requests": config.num_requests,
        "candidates": candidates,
        "best": best if best["capacity_qps"] > 0 else None,
    }


def _launch(policy: str, budget: int) -> str:
    """The server command that schedules as ``policy`` at ``budget`` (SGLang's for its own rule)."""
    if policy == "sglang-priority":
        return (
            "python -m sglang.launch_server --model-path MODEL --enable-priority-scheduling "
            f"--schedule-low-priority-values-first --chunked-prefill-size {budget}"
        )
    return f"vllm serve MODEL --scheduling-policy {policy} --max-num-batched-tokens {budget}"


def _trial(config: ClassesTuneConfig, deployment: Deployment, scale: float) -> tuple[bool, str]:
    """Whether the mix at ``scale`` meets every class's SLOs, and the worst SLO's line."""
    result = simulate(
        config.classes.scaled(scale), deployment, num_requests=config.num_requests, seed=config.seed
    )
    per_class = result.summary["classes"]
    worst_ratio, worst = 0.0, ""
    for name, slos in config.slos.items():
        for slo in slos.slos:
            ratio = slo.ratio(per_class[name])
            if ratio >= worst_ratio:
                worst_ratio, worst = ratio, f"{name}: {slo.describe(per_class[name])}"
    return worst_ratio <= 1.0, worst


def format_classes_tune(out: dict[str, Any]) -> str:
    """The candidates' capacities and the best's flags."""
    mix = ", ".join(f"{n} {c['qps']:g} req/s (priority {c['priority']})" for n, c in out["classes"].items())
    slos = "; ".join(
        f"{n}: " + ", ".join(f"{k.replace('_', '-')} {v:g}" for k, v in s.items())
        for n, s in out["slos"].items()
    )
    lines = [
        f"mix: {mix}; SLOs: {slos}; {out['num_requests']:,} requests a trial",
        "",
        f"  {'scheduling':<12}{'budget':>8}{'capacity (req/s)':>18}{'x the mix':>11}   the nearest miss above it",
    ]
    for c in out["candidates"]:
        misses = [t for t in c["trials"] if not t["passed"]]
        miss = min(misses, key=lambda t: t["scale"])["worst"] if misses else "-"
        lines.append(
            f"  {c['scheduling_policy']:<12}{c['token_budget']:>8}{c['capacity_qps']:>18,.3f}{c['scale']:>11.3g}   {miss}"
        )
    best = out["best"]
    lines.append("")
    if best is None:
        lines.append("no candidate meets every class's SLOs, even at 1% of the mix's rate")
    else:
        lines.append(
            f"best: {best['scheduling_policy']}, budget {best['token_budget']}: {best['capacity_qps']:,.3f} req/s; "
            f"{best['launch']}"
        )
    return "\n".join(lines)
