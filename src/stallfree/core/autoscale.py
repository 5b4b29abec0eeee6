"""Autoscalers: how many replicas a fleet wants, from what a real autoscaler can see.

Pure policies, like routers: each scrape (every ``scrape_s`` of the fleet's clock) hands the
policy the metrics of the replicas that were ready then (vLLM's gauges: requests running and
waiting, KV-cache usage) and how many replicas the fleet has (starting ones included, as
Kubernetes counts a Deployment's replicas); it answers the count it wants. No clock of its own,
no I/O. Joining, starting up and draining are the fleet's (:mod:`stallfree.sim.autoscaled`).

- ``hpa``: the Kubernetes Horizontal Pod Autoscaler's rule as KEDA drives it on a Prometheus
  metric with an ``AverageValue`` target (the Kubernetes docs' algorithm and defaults): usage
  ratio = the metric summed over the ready replicas / (target x current replicas); within the
  tolerance (0.1) nothing changes, else desired = ceil(sum / target). Scaling down takes the
  highest recommendation of the stabilization window (300 s), scaling up the lowest of its own
  (0 s: the newest); one decision adds at most max(100% of the current replicas, 4) and removes
  at most 100% (the default ``behavior`` policies, applied per decision); the answer is clamped
  to [min, max].
- ``sla``: a forecast, as Dynamo's SLA planner plans: every ``interval_s`` the request rate the
  router saw over the last ``window`` intervals (a moving average) is the next interval's, and the
  fleet is that rate over one replica's capacity at the SLOs (``stallfree tune`` finds it),
  rounded up, within [min, max]; between intervals it holds.
- ``dynamo-load``: NVIDIA Dynamo Planner's load-based rule for an aggregated fleet, as ai-dynamo
  1.4.2 runs it with a non-``sla`` ``optimization_target`` (``dynamo/planner/core/load_scaling.py``,
  ``_agg_easy_decision``; its defaults from ``config/defaults.py`` and ``config/planner_config.py``):
  every ``interval_s`` (``load_adjustment_interval_seconds``, 5 s) each ready replica's KV load is
  its decoding requests' KV tokens plus its waiting requests' prompt tokens over its KV capacity in
  tokens (the forward-pass metrics' ``sum_decode_kv_tokens`` and queued ``sum_prefill_tokens`` over
  ``max_kv_tokens``). One replica above the up threshold adds one replica; every replica below the
  down threshold removes one (never below one); else, or while a replica is still starting (the
  planner's "scaling in progress"), it holds. Clamped to [min, max] (Dynamo's ``min_endpoint`` and
  ``max_gpu_budget`` over the GPUs of a replica).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from stallfree.core.scheduler import Scheduler

AUTOSCALE_METRICS = {
    "waiting": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "kv": "vllm:kv_cache_usage_perc",
}


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    """One ready replica's gauges at a scrape (vLLM's: requests running and waiting, KV usage 0-1),
    and what Dynamo's forward-pass metrics add: the KV tokens of its decoding requests, the prompt
    tokens of its waiting ones (a preempted request counts none: vLLM V1 resets its computed tokens,
    which is what the metrics count for it) and its KV capacity in tokens (0: not known)."""

    num_running: int
    num_waiting: int
    kv_usage: float
    num_decode_kv_tokens: int = 0
    num_queued_prompt_tokens: int = 0
    max_kv_tokens: int = 0

    @classmethod
    def of(cls, scheduler: Scheduler) -> ReplicaMetrics:
        """A replica's figures as its scheduler holds them after its last step."""
        blocks = scheduler.block_manager
        num_blocks = blocks.num_blocks or 0
        return cls(
            scheduler.num_running,
            scheduler.num_waiting,
            blocks.num_used_blocks / num_blocks if num_blocks else 0.0,
            sum(seq.num_computed_tokens for seq in scheduler.running if seq.num_output_tokens > 0),
            sum(seq.num_prompt_tokens for seq in scheduler.state.waiting if seq.num_output_tokens == 0),
            num_blocks * blocks.block_size,
        )

    def value(self, metric: str) -> float:
        if metric == "waiting":
            return float(self.num_waiting)
        if metric == "running":
            return float(self.num_running)
        return self.kv_usage


@dataclass(frozen=True, slots=True)
class HpaRule:
    """A per-replica ``target`` of one metric (:data:`AUTOSCALE_METRICS`), and the HPA's knobs."""

    metric: str
    target: float
    tolerance: float = 0.1
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    scale_up_percent: float = 100.0
    scale_up_pods: int = 4
    scale_down_percent: float = 100.0

    def __post_init__(self) -> None:
        if self.metric not in AUTOSCALE_METRICS:
            raise ValueError(
                f"unknown autoscaling metric {self.metric!r}; choose from {', '.join(AUTOSCALE_METRICS)}"
            )
        if not (math.isfinite(self.target) and self.target > 0):
            raise ValueError(f"the autoscaling target must be positive, got {self.target}")
        if self.metric == "kv" and self.target > 1:
            raise ValueError(f"a KV-usage target is a share of the cache (0-1], got {self.target}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"the tolerance must be in [0, 1), got {self.tolerance}")
        if min(self.scale_up_window_s, self.scale_down_window_s) < 0:
            raise ValueError("stabilization windows must be >= 0 s")

    @classmethod
    def parse(cls, text: str) -> HpaRule:
        """``waiting=8`` (a metric and its per-replica target)."""
        metric, sep, target = text.partition("=")
        try:
            value = float(target)
        except ValueError:
            value = float("nan")
        if not sep or value != value:
            raise ValueError(f"give the rule as METRIC=TARGET (e.g. waiting=8), got {text!r}")
        return cls(metric.strip(), value)


def _bounds(min_replicas: int, max_replicas: int) -> tuple[int, int]:
    if not 1 <= min_replicas <= max_replicas:
        raise ValueError(f"need 1 <= min replicas <= max replicas, got {min_replicas} and {max_replicas}")
    return min_replicas, max_replicas


class Autoscaler(Protocol):
    """Wants a replica count at each scrape, from the ready replicas' gauges and the number of
    requests the router has seen so far (``num_arrivals``)."""

    min_replicas: int
    max_replicas: int

    def desired(
        self, now_s: float, current: int, ready: Sequence[ReplicaMetrics], num_arrivals: int
    ) -> int: ...


class HpaAutoscaler:
    """The HPA's decisions over a run (see the module's docstring); one per fleet."""

    name = "hpa"

    def __init__(self, rule: HpaRule, min_replicas: int, max_replicas: int) -> None:
        self.rule = rule
        self.min_replicas, self.max_replicas = _bounds(min_replicas, max_replicas)
        self._history: deque[tuple[float, int]] = deque()  # (time, recommendation)

    def desired(
        self, now_s: float, current: int, ready: Sequence[ReplicaMetrics], num_arrivals: int = 0
    ) -> int:
        """The replicas wanted at ``now_s`` with ``current`` replicas, ``ready`` of them scraped."""
        rule = self.rule
        total = sum(m.value(rule.metric) for m in ready)
        if not ready:
            recommendation = current  # nothing scraped (all starting): hold
        else:
            ratio = total / (rule.target * current)
            recommendation = current if abs(ratio - 1) <= rule.tolerance else math.ceil(total / rule.target)
        self._history.append((now_s, recommendation))
        keep_s = max(rule.scale_up_window_s, rule.scale_down_window_s)
        while self._history and self._history[0][0] < now_s - keep_s:
            self._history.popleft()
        if recommendation > current:  # scale up: the lowest recommendation of the up window
            wanted = min(r for t, r in self._history if t >= now_s - rule.scale_up_window_s)
            most = max(math.ceil(current * (1 + rule.scale_up_percent / 100)), current + rule.scale_up_pods)
            wanted = max(current, min(wanted, most))
        elif recommendation < current:  # scale down: the highest of the down window
            wanted = max(r for t, r in self._history if t >= now_s - rule.scale_down_window_s)
            fewest = math.floor(current * (1 - rule.scale_down_percent / 100))
            wanted = min(current, max(wanted, fewest))
        else:
            wanted = current
        return max(self.min_replicas, min(self.max_replicas, wanted))


@dataclass(frozen=True, slots=True)
class SlaRule:
    """One replica's capacity at the SLOs (requests/s), how often to plan and how many past
    intervals the forecast averages."""

    capacity_qps: float
    interval_s: float = 180.0
    window: int = 3

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity_qps) and self.capacity_qps > 0):
            raise ValueError(f"a replica's capacity must be positive requests/s, got {self.capacity_qps}")
        if not self.interval_s > 0 or self.window < 1:
            raise ValueError("the SLA rule needs a positive interval and a window of at least one interval")

    @classmethod
    def parse(cls, text: str) -> SlaRule:
        """``qps=4.2`` or ``qps=4.2,interval=300,window=5``."""
        fields: dict[str, float] = {}
        for part in text.split(","):
            name, sep, value = part.partition("=")
            try:
                fields[name.strip()] = float(value)
            except ValueError:
                sep = ""
            if not sep or name.strip() not in ("qps", "interval", "window"):
                raise ValueError(f"give the SLA rule as qps=CAPACITY[,interval=S][,window=N], got {text!r}")
        if "qps" not in fields:
            raise ValueError("the SLA rule needs qps=: one replica's capacity at the SLOs (stallfree tune)")
        return cls(fields["qps"], fields.get("interval", 180.0), int(fields.get("window", 3)))


class SlaAutoscaler:
    """The forecast rule (see the module's docstring); one per fleet."""

    name = "sla"

    def __init__(self, rule: SlaRule, min_replicas: int, max_replicas: int) -> None:
        self.rule = rule
        self.min_replicas, self.max_replicas = _bounds(min_replicas, max_replicas)
        self._rates: deque[float] = deque(maxlen=rule.window)
        self._last: tuple[float, int] | None = None  # (time, arrivals) at the last plan
        self._wanted: int | None = None

    def desired(self, now_s: float, current: int, ready: Sequence[ReplicaMetrics], num_arrivals: int) -> int:
        if self._last is None:
            self._last = (now_s, num_arrivals)
        then_s, then_arrivals = self._last
        if now_s - then_s >= self.rule.interval_s:
            self._rates.append((num_arrivals - then_arrivals) / (now_s - then_s))
            self._last = (now_s, num_arrivals)
            forecast = sum(self._rates) / len(self._rates)
            self._wanted = math.ceil(forecast / self.rule.capacity_qps)
        wanted = current if self._wanted is None else self._wanted
        return max(self.min_replicas, min(self.max_replicas, wanted))


# Dynamo Planner 1.4.2's static thresholds on the KV load for an aggregated fleet, by
# optimization_target (load_scaling.py's _DECODE_*): (scale up above, scale down below).
DYNAMO_TARGETS = {"throughput": (1.0, 0.6), "latency": (0.4, 0.1)}


@dataclass(frozen=True, slots=True)
class DynamoLoadRule:
    """Dynamo Planner's ``optimization_target`` (``throughput``, ``latency`` or ``load``), the ``load``
    target's thresholds in percent of the KV capacity (``decode_scale_up_kv_rate`` and
    ``decode_scale_down_kv_rate``) and the planner's tick (``load_adjustment_interval_seconds``)."""

    target: str = "throughput"
    up_percent: float | None = None
    down_percent: float | None = None
    interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.target == "sla":
            raise ValueError(
                "Dynamo's sla target (its perf-model regressions) is not simulated: use throughput, latency or load"
            )
        if self.target not in (*DYNAMO_TARGETS, "load"):
            raise ValueError(f"unknown Dynamo target {self.target!r}; choose from throughput, latency, load")
        given = (self.up_percent, self.down_percent)
        if self.target != "load" and given != (None, None):
            raise ValueError(f"up= and down= are the load target's; {self.target} has fixed thresholds")
        if self.target == "load":
            if self.up_percent is None or self.down_percent is None:
                raise ValueError("the load target needs up=PERCENT and down=PERCENT of the KV capacity")
            if not 0 <= self.down_percent < self.up_percent <= 100:
                raise ValueError(
                    f"need 0 <= down < up <= 100 (percent), got up={self.up_percent:g} down={self.down_percent:g}"
                )
        if not (self.interval_s >= 1 and float(self.interval_s).is_integer()):
            raise ValueError(f"the planner's interval is whole seconds >= 1, got {self.interval_s:g}")

    @classmethod
    def parse(cls, text: str) -> DynamoLoadRule:
        """``""`` (throughput), ``latency``, ``up=80,down=30`` (load), each with ``[,interval=S]``."""
        usage = (
            "give the Dynamo rule as [throughput|latency][,interval=S] or up=PERCENT,down=PERCENT"
            f"[,interval=S], got {text!r}"
        )
        words: list[str] = []
        fields: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            name, sep, value = part.partition("=")
            if not sep:
                words.append(part)
                continue
            if name.strip() not in ("up", "down", "interval"):
                raise ValueError(usage)
            try:
                fields[name.strip()] = float(value)
            except ValueError:
                raise ValueError(usage) from None
        if len(words) > 1:
            raise ValueError(usage)
        target = words[0] if words else ("load" if "up" in fields or "down" in fields else "throughput")
        return cls(target, fields.get("up"), fields.get("down"), fields.get("interval", 5.0))

    def thresholds(self) -> tuple[float, float]:
        """(scale up, scale down) as shares of the KV capacity."""
        if self.up_percent is not None and self.down_percent is not None:
            return self.up_percent / 100, self.down_percent / 100
        return DYNAMO_TARGETS[self.target]


class DynamoLoadAutoscaler:
    """Dynamo Planner's load-based rule (see the module's docstring); one per fleet."""

    name = "dynamo-load"

    def __init__(self, rule: DynamoLoadRule, min_replicas: int, max_replicas: int) -> None:
        self.rule = rule
        self.min_replicas, self.max_replicas = _bounds(min_replicas, max_replicas)
        self._tick_s: float | None = None  # the planner's last tick

    def desired(
        self, now_s: float, current: int, ready: Sequence[ReplicaMetrics], num_arrivals: int = 0
    ) -> int:
        wanted = current
        # 1e-9: scrape times are sums of the period, a tick due at exactly the interval is due
        if self._tick_s is None or now_s - self._tick_s >= self.rule.interval_s - 1e-9:
            self._tick_s = now_s
            wanted = self._decide(current, ready)
        return max(self.min_replicas, min(self.max_replicas, wanted))

    def _decide(self, current: int, ready: Sequence[ReplicaMetrics]) -> int:
        """One tick: hold while a replica starts or a capacity is unknown; else one step."""
        if not ready or len(ready) != current or any(m.max_kv_tokens <= 0 for m in ready):
            return current
        loads = [(m.num_decode_kv_tokens + m.num_queued_prompt_tokens) / m.max_kv_tokens for m in ready]
        up, down = self.rule.thresholds()
        if self.rule.target == "load":  # the user's thresholds are inclusive, the static ones strict
            if any(load >= up for load in loads):
                return current + 1
            return current - 1 if current > 1 and all(load <= down for load in loads) else current
        if any(load > up for load in loads):
            return current + 1
        return current - 1 if current > 1 and all(load < down for load in loads) else current
