"""Read a ``stallfree bench --save-result`` file back: its exact requests and what was measured.

The file (vLLM's result keys) carries per-request arrays: ``arrival_times`` (seconds from the
run's start; ours), ``input_lens``, ``output_lens``, ``ttfts`` (null for a failed request) and
``itls`` (the gaps between streamed chunks). :func:`load_bench_result` rebuilds the requests as
:class:`~stallfree.workload.WorkloadArrays` (so ``stallfree simulate --replay`` runs the very
same arrivals and lengths) and the measured records and ITLs (so ``stallfree validate`` scores
the served run with the same metrics code as a simulated one). A multi-turn run's
``session_ids`` / ``turn_ids`` rebuild what each prompt repeats, for the prefix cache; a classes run's
``priorities`` and ``traffic_classes`` ride in the rows, and its ``classes`` are scored again from
the records (:attr:`BenchResult.classes`, :attr:`BenchResult.class_of`). Files without
``arrival_times`` (other tools, older stallfree) are refused with a clear error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.core.request import PromptBlocks
from stallfree.metrics import ItlAccumulator, RequestRecord, record_from_token_times
from stallfree.workload.classes import RecordedClass
from stallfree.workload.requests import WorkloadArrays
from stallfree.workload.sessions import measured_conversation


@dataclass(frozen=True, slots=True)
class BenchResult:
    arrays: WorkloadArrays
    records: list[RequestRecord]
    itl: ItlAccumulator
    duration_s: float
    data: dict[str, Any]
    classes: tuple[RecordedClass, ...] = ()
    class_of: dict[str, str] = field(default_factory=dict)  # a record's request id -> its class
    class_itl: dict[str, ItlAccumulator] = field(default_factory=dict)

    @property
    def sampling_mode(self) -> str:
        """How the run's requests sampled, as the measured cost model names it: ``greedy`` at
        temperature 0, ``top-p`` with top_p under 1, else ``temperature`` (an OpenAI server's
        default temperature is 1)."""
        params = self.data.get("sampling") or {}
        if float(params.get("temperature", 1.0)) == 0.0:
            return "greedy"
        return "top-p" if float(params.get("top_p", 1.0)) < 1.0 else "temperature"


def load_bench_result(path: str | Path) -> BenchResult:
    source = Path(path)
    try:
        data = json.loads(source.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not JSON ({exc})") from None
    if not isinstance(data, dict) or "input_lens" not in data or "output_lens" not in data:
        raise ValueError(f"{source}: not a bench result (no per-request input_lens / output_lens)")
    if "arrival_times" not in data:
        raise ValueError(
            f"{source}: the result has no per-request arrival_times; save it with this stallfree's "
            "`stallfree bench --save-result`"
        )
    arrivals = [float(t) for t in data["arrival_times"]]
    inputs = [int(n) for n in data["input_lens"]]
    outputs = [int(n) for n in data["output_lens"]]
    ttfts = data.get("ttfts") or [None] * len(inputs)
    itls = data.get("itls") or [[] for _ in inputs]
    if not len(arrivals) == len(inputs) == len(outputs) == len(ttfts) == len(itls):
        raise ValueError(f"{source}: per-request arrays of different lengths")
    order = np.argsort(np.array(arrivals), kind="stable")
    named = data.get("traffic_classes")
    if named is not None and len(named) != len(inputs):
        raise ValueError(f"{source}: per-request arrays of different lengths")
    itl = ItlAccumulator()
    class_itl: dict[str, ItlAccumulator] = {}
    records = []
    for i in order.tolist():
        times: list[float] = []
        if ttfts[i] is not None:
            times = [arrivals[i] + float(ttfts[i])]
            for gap in itls[i]:
                times.append(times[-1] + float(gap))
        records.append(
            record_from_token_times(
                request_id=str(i),
                arrival_s=arrivals[i],
                token_times_s=times,
                num_prompt_tokens=inputs[i],
                num_output_tokens=outputs[i] if times else 0,
                itl=itl,
                finish_reason="length" if times else "failed",
            )
        )
        if named is not None and records[-1].is_completed:
            class_itl.setdefault(str(named[i]), ItlAccumulator()).add_many(np.diff(times))
    arrays = WorkloadArrays(
        arrival_time_s=np.array([arrivals[i] for i in order], dtype=np.float64),
        num_prompt_tokens=np.array([max(1, inputs[i]) for i in order], dtype=np.int64),
        max_tokens=np.array([max(1, outputs[i]) for i in order], dtype=np.int64),
        prompt_blocks=_session_blocks(data, inputs, outputs, order.tolist()),
        session=np.array([int(data["session_ids"][i]) for i in order], dtype=np.int64)
        if "session_ids" in data
        else None,
        priority=np.array([int(data["priorities"][i]) for i in order], dtype=np.int64)
        if "priorities" in data
        else None,
        traffic_class=None if named is None else tuple(str(named[i]) for i in order),
    )
    duration = float(data.get("duration", max((r.finish_s for r in records), default=0.0)))
    if named is None:
        return BenchResult(arrays, records, itl, duration, data)
    try:
        classes = tuple(
            RecordedClass.read(name, saved) for name, saved in (data.get("classes") or {}).items()
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{source}: a class without its priority, rate or SLOs ({exc!r})") from None
    class_of = {str(i): str(name) for i, name in enumerate(named)}
    return BenchResult(arrays, records, itl, duration, data, classes, class_of, class_itl)


def _session_blocks(
    data: dict[str, Any], inputs: list[int], outputs: list[int], order: list[int]
) -> tuple[PromptBlocks, ...] | None:
    """A multi-turn run's prompts as the prefix cache sees them (each turn repeats its session's
    conversation so far), from the counted lengths; None for a run without sessions."""
    if "session_ids" not in data:
        return None
    sessions, turns = data["session_ids"], data["turn_ids"]
    system = int(data["sessions"]["system_prompt_tokens"])
    by_session: dict[int, list[int]] = {}
    for i in sorted(range(len(inputs)), key=lambda i: turns[i]):
        by_session.setdefault(int(sessions[i]), []).append(i)
    blocks: dict[int, PromptBlocks] = {}
    for session, rows in by_session.items():
        conversation = measured_conversation(
            system, session, [max(1, inputs[i]) for i in rows], [max(1, outputs[i]) for i in rows]
        )
        blocks.update((i, b) for i, (_, b) in zip(rows, conversation, strict=True))
    return tuple(blocks[i] for i in order)
