"""Per-step Chrome trace (JSON) of simulated runs, for Perfetto or ``chrome://tracing``.

One process per policy. Each scheduled plan is one slice on the "steps" track, spanning all the
steps it ran in a row (a steady run), named by what one step carries; counters follow the KV
blocks in use and the running / waiting queues. Times are microseconds on the simulated clock.
Events are written one by one, so a long run never builds the whole trace in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from stallfree.sim.traffic import StepTrace

_US = 1e6


def write_chrome_trace(runs: Iterable[tuple[str, StepTrace]], path: str | os.PathLike[str]) -> int:
    """Write ``(policy, trace)`` pairs to ``path``; returns the number of events written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with target.open("w", encoding="utf-8") as out:
        out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        for pid, (policy, trace) in enumerate(runs, start=1):
            for event in _events(pid, policy, trace):
                out.write(("" if count == 0 else ",\n") + json.dumps(event, separators=(",", ":")))
                count += 1
        out.write("\n]}\n")
    return count


def _events(pid: int, policy: str, trace: StepTrace) -> Iterator[dict[str, Any]]:
    yield {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": policy}}
    yield {"ph": "M", "pid": pid, "tid": 1, "name": "thread_name", "args": {"name": "steps"}}
    rows = zip(
        trace.start_s,
        trace.end_s,
        trace.num_steps,
        trace.num_decode_tokens,
        trace.num_prefill_tokens,
        trace.num_running,
        trace.num_waiting,
        trace.kv_blocks_used,
        strict=True,
    )
    for start_s, end_s, steps, decode, prefill, running, waiting, blocks in rows:
        ts = start_s * _US
        name = " + ".join(
            part
            for part in (f"{decode} decode" if decode else "", f"{prefill} prompt" if prefill else "")
            if part
        )
        yield {
            "ph": "X",
            "pid": pid,
            "tid": 1,
            "ts": ts,
            "dur": (end_s - start_s) * _US,
            "name": name if steps == 1 else f"{name} x {steps} steps",
            "args": {"steps": steps, "decode_tokens_per_step": decode, "prompt_tokens_per_step": prefill},
        }
        end_ts = end_s * _US
        yield {"ph": "C", "pid": pid, "ts": end_ts, "name": "KV blocks used", "args": {"blocks": blocks}}
        yield {
            "ph": "C",
            "pid": pid,
            "ts": end_ts,
            "name": "requests",
            "args": {"running": running, "waiting": waiting},
        }
