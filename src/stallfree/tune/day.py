"""``tune`` for a day: the autoscaling rule and bounds that keep the SLOs at the fewest GPU-hours.

Every candidate (a KEDA rule's target, a floor) runs the whole day (:func:`~stallfree.sim.simulate`
with the deployment's ``autoscale``); the SLOs are judged on the day's summary as a capacity
search judges a trial's. Beside them, the fixed fleet sized for the peak: the fewest replicas that
meet the same SLOs through the same day (a binary search up to the ceiling). The headline is the
GPU-hours the best rule saves against it; the answer is printed as the real configuration: KEDA's
``ScaledObject`` for a KEDA rule, Dynamo Planner's config (ai-dynamo 1.4.2) for a ``dynamo-load`` one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from stallfree.core.autoscale import AUTOSCALE_METRICS, DynamoLoadRule, HpaRule
from stallfree.sim import Deployment, simulate
from stallfree.sim.deployment import AUTOSCALERS, Autoscale
from stallfree.tune.slo import Slos
from stallfree.workload import Workload, WorkloadArrays, sample


@dataclass(frozen=True, slots=True)
class DayTuneConfig:
    """``base``: the replica (and router); ``rules`` (``keda:waiting=8``, ...) and ``floors`` are the
    candidates, each between its floor and ``max_replicas``; the day is ``workload``'s requests."""

    base: Deployment
    workload: Workload
    num_requests: int | None
    seed: int
    slos: Slos
    rules: tuple[str, ...]
    floors: tuple[int, ...]
    max_replicas: int
    startup_s: float = 120.0
    scrape_s: float = 15.0

    def candidates(self) -> list[Deployment]:
        return [
            dataclasses.replace(
                self.base,
                replicas=floor,
                autoscale=Autoscale(rule, floor, self.max_replicas, self.startup_s, self.scrape_s),
            )
            for rule in self.rules
            for floor in self.floors
        ]


def _day(job: tuple[WorkloadArrays, Deployment]) -> dict[str, Any]:
    """One day through one deployment: its summary (a worker's task)."""
    requests, deployment = job
    return simulate(requests, deployment).summary


def tune_day(
    config: DayTuneConfig, workers: int = 1, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run every candidate and the fixed fleet's search; the result as JSON."""
    requests = sample(config.workload, config.num_requests, config.seed)
    hours = float(requests.arrival_time_s[-1] - requests.arrival_time_s[0]) / 3600
    with ProcessPoolExecutor(max_workers=workers) as pool:

        def run(deployments: Sequence[Deployment]) -> list[dict[str, Any]]:
            return list(pool.map(_day, [(requests, d) for d in deployments]))

        rows = []
        for deployment, summary in zip(config.candidates(), run(config.candidates()), strict=True):
            scale = summary["autoscale"]
            assert deployment.autoscale is not None
            rows.append(
                {
                    "rule": deployment.autoscale.rule,
                    "min_replicas": deployment.autoscale.min_replicas,
                    "max_replicas": deployment.autoscale.max_replicas,
                    "gpu_hours": scale["gpu_hours"],
                    "peak_replicas": summary["num_replicas_max"],
                    "replicas_started": scale["num_replicas_started"],
                    "met": config.slos.is_met(summary),
                    "binds": list(config.slos.violations(summary)),
                    **{s.flag.metric: summary.get(s.flag.metric) for s in config.slos.slos},
                    "deployment": deployment.to_dict(),
                }
            )
            if progress is not None:
                progress(
                    f"{rows[-1]['rule']} from {rows[-1]['min_replicas']}: {rows[-1]['gpu_hours']:,.1f} GPU-hours"
                )
        fixed = _fewest_fixed(config, run)
    met = [r for r in rows if r["met"]]
    best = min(met, key=lambda r: r["gpu_hours"]) if met else None
    fixed_hours = None if fixed is None else fixed[1]
    return {
        "mode": "day",
        "hours": hours,
        "num_requests": len(requests),
        "slos": config.slos.as_dict(),
        "candidates": rows,
        "best": best,
        "fixed": None if fixed is None else {"replicas": fixed[0], "gpu_hours": fixed_hours},
        "saved": None if best is None or not fixed_hours else 1 - best["gpu_hours"] / fixed_hours,
        **real_config(best, str(config.base.costs.model), config.base.costs.tp),
    }


def real_config(best: dict[str, Any] | None, model: str, tp: int) -> dict[str, str | None]:
    """The best rule as what runs it: ``scaled_object`` (KEDA) or ``planner_config`` (Dynamo
    Planner); None where it is not that kind (the ``sla`` rule has neither)."""
    kind = None if best is None else str(best["rule"]).partition(":")[0]
    return {
        "scaled_object": scaled_object(best, model) if best is not None and kind in ("hpa", "keda") else None,
        "planner_config": planner_config(best, model, tp)
        if best is not None and kind == "dynamo-load"
        else None,
    }


def _fewest_fixed(
    config: DayTuneConfig, run: Callable[[Sequence[Deployment]], list[dict[str, Any]]]
) -> tuple[int, float] | None:
    """The fewest fixed replicas meeting the SLOs through the day and their GPU-hours (to the
    day's last token, as an autoscaled fleet's are counted); None: not even the ceiling."""
    fleet = dataclasses.replace(config.base, autoscale=None)
    met: dict[int, dict[str, Any]] = {}

    def meets(n: int) -> bool:
        summary = run([dataclasses.replace(fleet, replicas=n)])[0]
        if config.slos.is_met(summary):
            met[n] = summary
            return True
        return False

    low, high = 1, config.max_replicas
    if not meets(high):
        return None
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if meets(mid) else (mid + 1, high)
    return high, high * config.base.costs.tp * met[high]["duration"] / 3600


def scaled_object(row: dict[str, Any], model: str) -> str:
    """KEDA's ``ScaledObject`` for a candidate: its Prometheus trigger on the vLLM gauge."""
    rule = HpaRule.parse(row["rule"].partition(":")[2])
    scale = row["deployment"]["autoscale"]
    return (
        "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata:\n  name: vllm\nspec:\n"
        "  scaleTargetRef:\n    name: vllm            # the Deployment serving the model\n"
        f"  pollingInterval: {scale['scrape_s']:g}\n  cooldownPeriod: 300\n"
        f"  minReplicaCount: {scale['min_replicas']}\n  maxReplicaCount: {scale['max_replicas']}\n"
        "  triggers:\n    - type: prometheus\n      metricType: AverageValue\n      metadata:\n"
        "        serverAddress: http://prometheus:9090\n"
        f'        query: sum({AUTOSCALE_METRICS[rule.metric]}{{model_name="{model}"}})\n'
        f'        threshold: "{rule.target:g}"\n'
    )


def planner_config(row: dict[str, Any], model: str, tp: int) -> str:
    """Dynamo Planner's config (``python -m dynamo.planner --config FILE``, ai-dynamo 1.4.2) for a
    ``dynamo-load`` candidate: an aggregated fleet, load-based scaling only, its floor as
    ``min_endpoint`` and its ceiling as a GPU budget."""
    rule = DynamoLoadRule.parse(str(row["rule"]).partition(":")[2])
    scale = row["deployment"]["autoscale"]
    gpus = f"{scale['max_replicas']} replicas of {tp} GPU" + ("s" if tp > 1 else "")
    thresholds = (
        f"decode_scale_up_kv_rate: {rule.up_percent:g}\ndecode_scale_down_kv_rate: {rule.down_percent:g}\n"
        if rule.target == "load"
        else ""
    )
    return (
        f"mode: agg\nbackend: vllm\nmodel_name: {model}\noptimization_target: {rule.target}\n"
        "enable_load_scaling: true\nenable_throughput_scaling: false\n"
        f"load_adjustment_interval_seconds: {rule.interval_s:g}\n{thresholds}"
        f"min_endpoint: {scale['min_replicas']}\ndecode_engine_num_gpu: {tp}\n"
        f"max_gpu_budget: {scale['max_replicas'] * tp}   # {gpus}\n"
    )


def format_day_tune(out: dict[str, Any]) -> str:
    width = max([22, *(len(r["rule"]) + 2 for r in out["candidates"])])
    lines = [
        f"a day of {out['num_requests']:,} requests over {out['hours']:,.2f} h; SLOs "
        + ", ".join(f"{k} <= {v:g}" for k, v in out["slos"].items()),
        "",
        f"  {'rule':<{width}}{'replicas':>10}{'GPU-hours':>11}{'peak':>6}{'started':>9}  SLOs",
    ]
    for r in out["candidates"]:
        verdict = "met" if r["met"] else "missed: " + ", ".join(r["binds"])
        lines.append(
            f"  {r['rule']:<{width}}{str(r['min_replicas']) + '-' + str(r['max_replicas']):>10}{r['gpu_hours']:>11,.2f}"
            f"{r['peak_replicas']:>6}{r['replicas_started']:>9}  {verdict}"
        )
    fixed = out["fixed"]
    lines.append("")
    lines.append(
        f"  fixed fleet for the peak: {fixed['replicas']} replicas, {fixed['gpu_hours']:,.2f} GPU-hours"
        if fixed
        else "  no fixed fleet up to the ceiling meets the SLOs through the day"
    )
    best = out["best"]
    if best is None:
        lines.append("  no autoscaling candidate meets the SLOs through the day")
        return "\n".join(lines)
    saved = out["saved"]
    versus = (
        ""
        if saved is None
        else f"; {abs(saved):.0%} {'fewer' if saved >= 0 else 'more'} than the fixed fleet's"
    )
    lines += [
        f"  best: {best['rule']} between {best['min_replicas']} and {best['max_replicas']} replicas, "
        f"{best['gpu_hours']:,.2f} GPU-hours{versus}",
        "",
    ]
    if out["scaled_object"] is not None:
        lines.append("KEDA (the HPA's default behaviour, as simulated):")
        lines += ["  " + line for line in out["scaled_object"].splitlines()]
    elif out["planner_config"] is not None:
        lines.append("Dynamo Planner, ai-dynamo 1.4.2 (python -m dynamo.planner --config planner.yaml):")
        lines += ["  " + line for line in out["planner_config"].splitlines()]
    else:
        lines.append(
            "the sla rule is the idea of Dynamo's SLA planner, not its code: no configuration to print"
        )
    return "\n".join(lines)


def split_rules(text: str) -> tuple[str, ...]:
    """``keda:waiting=4,dynamo-load:up=80,down=30``: a part that names no autoscaler continues the
    rule before it."""
    rules: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if ":" in part or part in AUTOSCALERS or not rules:
            rules.append(part)
        else:
            rules[-1] += "," + part
    return tuple(rules)


def check_rules(rules: Sequence[str]) -> None:
    """Each rule parses (one clear ValueError)."""
    for rule in rules:
        Autoscale(rule)
    if not rules:
        raise ValueError(
            f"give a rule, e.g. keda:waiting=8 (metrics: {', '.join(AUTOSCALE_METRICS)}) or dynamo-load:latency"
        )
