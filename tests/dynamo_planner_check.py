"""Run under DynoSim's venv (ai-dynamo 1.4.2): Dynamo Planner's own load-based decision for an
aggregated deployment (``PlannerScalingState.advance_load``) beside stallfree's ``dynamo-load`` rule,
on random ticks with loads at and around every threshold, replicas starting, and both bounds.
Prints JSON: the number of ticks, how many scaled up / held / down, and those that differ.

``python tests/dynamo_planner_check.py [TICKS]`` (tests/test_autoscale_dynamo.py runs it)."""

from __future__ import annotations

import importlib.util
import json
import logging
import random
import sys
import types
from pathlib import Path
from typing import Any

# The planner imports its SLA target's regression and forecasting libraries at module level; the
# load rule with static thresholds uses none of them, and DynoSim's venv lacks some: stand-ins.
for _name in ("sklearn", "sklearn.linear_model", "pmdarima", "prophet", "filterpy", "filterpy.kalman"):
    try:
        __import__(_name)
    except ImportError:
        _stub = types.ModuleType(_name)
        _stub.LinearRegression = _stub.KalmanFilter = _stub.Prophet = object  # type: ignore[attr-defined]
        sys.modules[_name] = _stub

from dynamo.common.forward_pass_metrics import (  # noqa: E402
    ForwardPassMetrics,
    QueuedRequestMetrics,
    ScheduledRequestMetrics,
)
from dynamo.planner.config.planner_config import PlannerConfig  # noqa: E402
from dynamo.planner.core.state_machine import PlannerScalingState  # noqa: E402
from dynamo.planner.core.types import (  # noqa: E402
    EngineCapabilities,
    FpmObservations,
    WorkerCapabilities,
    WorkerCounts,
)

# stallfree's core is stdlib only: load the one module without the package (and its dependencies)
_spec = importlib.util.spec_from_file_location(
    "stallfree_autoscale", Path(__file__).resolve().parent.parent / "src/stallfree/core/autoscale.py"
)
assert _spec is not None and _spec.loader is not None
autoscale: Any = importlib.util.module_from_spec(_spec)
sys.modules["stallfree_autoscale"] = autoscale
_spec.loader.exec_module(autoscale)


def one_tick(rng: random.Random) -> tuple[int, int, int, dict[str, Any]]:
    """A random tick: (current, Dynamo's answer, stallfree's answer, the case)."""
    target = rng.choice(["throughput", "latency", "load"])
    up = down = None
    if target == "load":
        down = rng.choice([0, 5, 10, 30, 50])
        up = rng.choice([u for u in (10, 40, 60, 80, 100) if u > down])
    tp, low = rng.choice([1, 2, 4]), rng.randint(1, 3)
    high = rng.randint(low, 6)
    fields: dict[str, Any] = {"mode": "agg", "optimization_target": target, "min_endpoint": low}
    fields.update(max_gpu_budget=high * tp, decode_engine_num_gpu=tp)
    if target == "load":
        fields.update(decode_scale_up_kv_rate=up, decode_scale_down_kv_rate=down)
    max_kv = rng.choice([1_000, 16_000])
    caps = WorkerCapabilities(decode=EngineCapabilities(num_gpu=tp, max_kv_tokens=max_kv))
    state = PlannerScalingState(PlannerConfig.model_validate(fields), caps)
    current = rng.randint(low, high)
    ready = current if rng.random() < 0.9 else current - 1  # a replica still starting
    state.observe_worker_counts(WorkerCounts(ready_num_decode=ready, expected_num_decode=current))
    marks = [0.0, 0.1, 0.4, 0.6, 1.0] + (
        [up / 100, down / 100] if up is not None and down is not None else []
    )
    fpms, metrics = {}, []
    for worker in range(ready):
        total = round((rng.choice(marks) if rng.random() < 0.3 else rng.random() * 1.3) * max_kv)
        decoding = rng.randint(0, total)
        fpms[(f"w{worker}", 0)] = ForwardPassMetrics(
            worker_id=f"w{worker}",
            scheduled_requests=ScheduledRequestMetrics(sum_decode_kv_tokens=decoding),
            queued_requests=QueuedRequestMetrics(sum_prefill_tokens=total - decoding),
        )
        metrics.append(autoscale.ReplicaMetrics(0, 0, 0.0, decoding, total - decoding, max_kv))
    decision = state.advance_load(FpmObservations(decode=fpms or None))
    theirs = current if decision is None or decision.num_decode is None else decision.num_decode
    rule = autoscale.DynamoLoadRule(target, up, down)
    ours = autoscale.DynamoLoadAutoscaler(rule, low, high).desired(0.0, current, metrics)
    loads = [round((m.num_decode_kv_tokens + m.num_queued_prompt_tokens) / max_kv, 4) for m in metrics]
    return current, theirs, ours, {**fields, "current": current, "ready": ready, "loads": loads}


def main() -> None:
    logging.disable(logging.CRITICAL)
    rng = random.Random(0)
    ticks = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    moves = {"up": 0, "hold": 0, "down": 0}
    differ = []
    for _ in range(ticks):
        current, theirs, ours, case = one_tick(rng)
        moves["up" if theirs > current else "down" if theirs < current else "hold"] += 1
        if theirs != ours:
            differ.append({**case, "dynamo": theirs, "stallfree": ours})
    print(json.dumps({"ticks": ticks, "moves": moves, "differ": differ[:10], "num_differ": len(differ)}))


if __name__ == "__main__":
    main()
