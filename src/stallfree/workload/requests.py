"""A workload (arrivals x lengths) sampled into requests: see :mod:`stallfree.workload`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from stallfree.core.request import PromptBlocks, Request
from stallfree.workload.arrivals import Arrivals, RateProfile, ReplayArrivals
from stallfree.workload.lengths import Lengths, TraceLengths, cap_lengths
from stallfree.workload.sessions import Sessions, session_turns
from stallfree.workload.traces import load_trace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Workload:
    """Arrivals x lengths, with optional caps on the lengths (applied by :func:`cap_lengths`).

    With ``sessions``, arrivals start multi-turn sessions and lengths are each turn's new message
    and answer (:mod:`stallfree.workload.sessions`); caps apply to the whole prompts."""

    arrivals: Arrivals
    lengths: Lengths
    max_prompt_tokens: int | None = None
    max_total_tokens: int | None = None
    sessions: Sessions | None = None

    def __post_init__(self) -> None:
        if self.max_prompt_tokens is not None and self.max_prompt_tokens <= 0:
            raise ValueError(f"max_prompt_tokens must be positive, got {self.max_prompt_tokens}")
        if self.max_total_tokens is not None and self.max_total_tokens < 2:
            raise ValueError(
                f"max_total_tokens must be >= 2 (one prompt and one output token), got {self.max_total_tokens}"
            )

    def max_num_requests(self) -> int | None:
        """How many requests the workload can give, when a trace read in order limits it."""
        limits = []
        if isinstance(self.arrivals, ReplayArrivals):
            turns = 1 if self.sessions is None else self.sessions.turns
            limits.append(self.arrivals.num_rows() * turns)
        if isinstance(self.lengths, TraceLengths) and self.lengths.sampling != "with-replacement":
            limits.append(len(load_trace(self.lengths.trace)))
        return min(limits) if limits else None


@dataclass(frozen=True, slots=True, eq=False)
class WorkloadArrays:
    """A sampled workload as columns; row ``i`` is request ``str(i)``. ``prompt_blocks`` (one per
    row, or None): what each prompt is, for the prefix cache (a trace's block hashes).
    ``session`` (or None): the conversation each row belongs to (multi-turn sessions).
    ``priority`` (or None: all 0): each row's scheduling priority, and ``traffic_class`` (or
    None): each row's class (a replayed bench result's)."""

    arrival_time_s: FloatArray
    num_prompt_tokens: IntArray
    max_tokens: IntArray
    prompt_blocks: tuple[PromptBlocks, ...] | None = None
    session: IntArray | None = None
    priority: IntArray | None = None
    traffic_class: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.arrival_time_s)

    def iter_requests(self, chunk_size: int = 4096) -> Iterator[Request]:
        """Requests one by one; only ``chunk_size`` Python objects exist at a time."""
        for start in range(0, len(self), chunk_size):
            stop = start + chunk_size
            rows = zip(
                self.arrival_time_s[start:stop].tolist(),
                self.num_prompt_tokens[start:stop].tolist(),
                self.max_tokens[start:stop].tolist(),
                strict=True,
            )
            blocks = self.prompt_blocks
            sessions = None if self.session is None else self.session[start:stop].tolist()
            priorities = None if self.priority is None else self.priority[start:stop].tolist()
            classes = self.traffic_class
            for offset, (arrival_s, num_prompt_tokens, max_tokens) in enumerate(rows):
                yield Request(
                    request_id=str(start + offset),
                    num_prompt_tokens=num_prompt_tokens,
                    max_tokens=max_tokens,
                    arrival_time_s=arrival_s,
                    prompt_blocks=None if blocks is None else blocks[start + offset],
                    session_id=None if sessions is None else f"session-{sessions[offset]}",
                    priority=0 if priorities is None else priorities[offset],
                    traffic_class=None if classes is None else classes[start + offset],
                )


def sample(workload: Workload, num_requests: int | None = None, seed: int = 0) -> WorkloadArrays:
    """Draw ``num_requests`` rows (None: every row a trace read in order allows, or the requests
    one period of a rate profile brings on average)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
    limit = workload.max_num_requests()
    if num_requests is None and limit is None and isinstance(workload.arrivals, RateProfile):
        num_requests = max(1, round(workload.arrivals.expected_requests()))  # one period of the profile
    if num_requests is None:
        if limit is None:
            raise ValueError("num_requests is required unless the workload reads a trace in order")
        num_requests = limit
    if num_requests <= 0:
        raise ValueError(f"num_requests must be positive, got {num_requests}")
    if limit is not None and num_requests > limit:
        raise ValueError(f"the workload's trace has {limit} rows; asked for {num_requests} requests")
    if workload.sessions is not None:
        starts_s, messages, answers = sample_sessions(workload, num_requests, seed)
        turns = session_turns(workload.sessions, starts_s, messages, answers)
        prompts, outputs = cap_lengths(
            turns.num_prompt_tokens, turns.max_tokens, workload.max_prompt_tokens, workload.max_total_tokens
        )
        return WorkloadArrays(turns.arrival_time_s, prompts, outputs, turns.prompt_blocks, turns.session)
    times_s = workload.arrivals.times_s(num_requests, _LazyRng.stream(seed, 0))
    length_rng = _LazyRng.stream(seed, 1)
    blocks = None
    if isinstance(workload.lengths, TraceLengths):
        trace = load_trace(workload.lengths.trace)
        rows = workload.lengths.rows(num_requests, length_rng)
        prompts, outputs = trace.num_prompt_tokens[rows], trace.num_output_tokens[rows]
        if trace.hash_ids is not None:
            ids, per_id = trace.hash_ids, trace.hash_block_tokens
            blocks = tuple(
                PromptBlocks(ids[row], per_id, min(int(trace.num_prompt_tokens[row]), len(ids[row]) * per_id))
                for row in rows.tolist()
            )
    else:
        prompts, outputs = workload.lengths.sample(num_requests, length_rng)
    prompts, outputs = cap_lengths(prompts, outputs, workload.max_prompt_tokens, workload.max_total_tokens)
    return WorkloadArrays(
        arrival_time_s=times_s, num_prompt_tokens=prompts, max_tokens=outputs, prompt_blocks=blocks
    )


class _LazyRng:
    """Stream ``index`` of ``SeedSequence(seed).spawn(2)`` as a numpy Generator, made on first use:
    a trace replayed in order draws nothing, and then numpy.random (~7 MB) is never imported."""

    def __init__(self, seed: int, index: int) -> None:
        self._seed, self._index = seed, index
        self._rng: np.random.Generator | None = None

    @classmethod
    def stream(cls, seed: int, index: int) -> np.random.Generator:
        return cast("np.random.Generator", cls(seed, index))

    def __getattr__(self, name: str) -> Any:
        if self._rng is None:
            self._rng = np.random.default_rng(np.random.SeedSequence(self._seed).spawn(2)[self._index])
        return getattr(self._rng, name)


def sample_sessions(
    workload: Workload, num_requests: int, seed: int = 0
) -> tuple[FloatArray, IntArray, IntArray]:
    """A sessions workload's draws: session start times, then each turn's message and answer
    lengths, session by session (what :func:`sample` lays out, and ``bench`` sends)."""
    if workload.sessions is None:
        raise ValueError("not a sessions workload")
    arrival_seed, length_seed = np.random.SeedSequence(seed).spawn(2)
    num_sessions = workload.sessions.num_sessions(num_requests)
    starts_s = workload.arrivals.times_s(num_sessions, np.random.default_rng(arrival_seed))
    messages, answers = workload.lengths.sample(num_requests, np.random.default_rng(length_seed))
    return starts_s, messages, answers


def iter_requests(workload: Workload, num_requests: int | None = None, seed: int = 0) -> Iterator[Request]:
    """Like :func:`generate` without holding every Request at once (the arrays are still built)."""
    return sample(workload, num_requests, seed).iter_requests()


def generate(workload: Workload, num_requests: int | None = None, seed: int = 0) -> list[Request]:
    """The requests of a workload, ordered by arrival; same arguments, same list."""
    return list(iter_requests(workload, num_requests, seed))
