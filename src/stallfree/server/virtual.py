"""A virtual replica: the server's engine replaced by the scheduler and a cost model on the wall clock.

:class:`VirtualEngine` has the engine's interface as the server's engine thread drives it
(``add_request``, ``abort_request``, ``has_unfinished_requests``, ``step``, ``scheduler``,
``tokenizer``, ``max_model_len``), but its executor runs no model: it prices the plan as
:func:`~stallfree.sim.api.simulate` would (the deployment's cost model: roofline, a profile, GPU
tables; drafts accepted at the deployment's rate) and returns when that time has passed, so every
token leaves when the simulated GPU would send it. Queues, chunking, KV exhaustion, preemption and
prefix caching are the real scheduler's. A step starts when the one before it ends, or when work
arrives to an idle replica; deadlines are absolute, so a late wake-up is not carried into the
next step (:attr:`VirtualEngine.tracking` measures how late steps end).

The answer's text is the prompt's own tokens again, cycled (a virtual replica has no model); a
request always generates ``max_tokens`` (stop strings and EOS are a model's, not the scheduler's).
Tokens are counted by a real tokenizer where one is given, else by :class:`EstimateTokenizer`.
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from stallfree.core import SamplingParams, run_step
from stallfree.core.outputs import IDLE, EngineStep, RequestOutput, StepOutputs
from stallfree.core.plan import StepPlan, StepResult
from stallfree.core.step import prompt_token_ids as prompt_token_ids_of
from stallfree.core.step import queue_prompt
from stallfree.costs.choice import pick_once
from stallfree.sim.api import replica_kv_memory
from stallfree.sim.deployment import Deployment
from stallfree.sim.speculative import DraftVerifier, draft_pricer

_PIECE_CHARS = 4  # an estimated token: a word's leading space and up to 4 more characters
_MAX_PIECES = 1 << 20  # distinct pieces remembered (beyond: pieces share ids by hash)
# A piece: the whitespace before a word and up to _PIECE_CHARS of its characters, or trailing whitespace
# (re's \s is str.isspace()).
_PIECE = re.compile(rf"\s*\S{{1,{_PIECE_CHARS}}}|\s+")


class ServedTokenizer(Protocol):
    """What the server asks of a tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]: ...


class EstimateTokenizer:
    """Tokens as an estimate, for a replica without its model's tokenizer: a piece is the
    whitespace before it and up to :data:`_PIECE_CHARS` characters of one word (about 1.3 tokens a
    word of English, as BPE tokenizers give). Each distinct piece gets an id on first sight, so a text
    decodes back to itself and a prompt that repeats an earlier one's text repeats its ids (its
    prefix-cache blocks). Chat messages are ``<|role|>`` pieces before each message's text.
    Thread-safe: handlers encode on the event loop while the engine thread decodes."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []
        self._lock = threading.Lock()

    @staticmethod
    def pieces(text: str) -> list[str]:
        # One regex pass (~5x a character loop): a handler encodes on the event loop, and a long
        # prompt's encoding holds every stream's next token back for as long as it takes.
        return _PIECE.findall(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        pieces = self.pieces(text)
        with self._lock:
            known = self._ids
            return [known[piece] if piece in known else self._id(piece) for piece in pieces]

    def _id(self, piece: str) -> int:
        known = self._ids.get(piece)
        if known is not None:
            return known
        if len(self._pieces) >= _MAX_PIECES:
            return hash(piece) % _MAX_PIECES
        self._ids[piece] = len(self._pieces)
        self._pieces.append(piece)
        return self._ids[piece]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        with self._lock:
            pieces = self._pieces
            return "".join(pieces[i] if 0 <= i < len(pieces) else "" for i in token_ids)

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        text = "".join(f"<|{m.get('role', 'user')}|>\n{m.get('content') or ''}\n" for m in messages)
        return self.encode(text + ("<|assistant|>\n" if add_generation_prompt else ""))


class _Virtual:
    """A request's echo state: its prompt ids and the tokens it has been given."""

    __slots__ = ("generated", "params", "prompt", "prompt_ids", "text")

    def __init__(self, prompt: str | None, prompt_ids: list[int], params: SamplingParams) -> None:
        self.prompt, self.prompt_ids, self.params = prompt, prompt_ids, params
        self.generated: list[int] = []
        self.text = ""

    def next_ids(self, count: int) -> list[int]:
        ids, start = self.prompt_ids, len(self.generated)
        return [ids[(start + i) % len(ids)] for i in range(count)]


class VirtualEngine:
    """The engine's interface over ``deployment``'s first replica, on the wall clock (see the
    module's docstring). ``time_scale`` runs the clock that many times faster (tests)."""

    uses_torch = False

    def __init__(
        self,
        deployment: Deployment,
        tokenizer: ServedTokenizer | None = None,
        *,
        time_scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        if deployment.disaggregate is not None or deployment.fleet:
            raise ValueError("a virtual replica is one aggregated replica: no pools or replica groups")
        if not time_scale > 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.deployment = deployment
        self.serving = serving = deployment.serving
        self.pick = pick = pick_once(deployment.costs)
        self.kv = replica_kv_memory(pick, serving, deployment.gpu_memory_utilization)
        context = pick.model.max_position_embeddings
        self.max_model_len = serving.model_len(context)
        self.scheduler = serving.make_scheduler(
            context, self.kv.num_blocks, predictor=pick.pricer.step_time_s
        )
        self.tokenizer: ServedTokenizer = tokenizer or EstimateTokenizer()
        spec = deployment.speculation
        self.drafts = (
            None
            if spec is None
            else DraftVerifier(
                spec.acceptance, serving.num_speculative_tokens, seed, draft_pricer(spec.draft, pick)
            )
        )
        self.time_scale = time_scale
        self.tracking = TrackingError()
        self._requests: dict[str, _Virtual] = {}
        self._ids = itertools.count()
        self._start_s = time.perf_counter()
        self._free_at_s = 0.0  # when the last step ends (perf_counter)
        self._busy = False  # work was left when it ended: the next step follows it at once

    # -- requests ---------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str | None = None,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        priority: int = 0,
    ) -> str:
        """Queue a prompt (text or token ids); return its id. ValueError if it can never run.
        ``priority``: lower first under the ``priority`` scheduling policy (vLLM's)."""
        params = sampling_params or SamplingParams()
        ids = prompt_token_ids_of(prompt, prompt_token_ids, self.tokenizer.encode)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._requests:
            raise ValueError(f"request id {rid!r} is already in use")
        queue_prompt(self.scheduler, rid, ids, params, time.perf_counter() - self._start_s, priority)
        self._requests[rid] = _Virtual(prompt, ids, params)
        return rid

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort_request(request_id)
        self._requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # -- the step ---------------------------------------------------------------------------

    def step(self) -> StepOutputs:
        """Run one step, taking its priced time; the outputs of the requests that got tokens."""
        out = run_step(self.scheduler, self._execute)
        self._busy = out is not None and self.scheduler.has_unfinished_requests()
        if out is None:
            return IDLE
        plan, result, events = out
        finished = dict(events.finished)
        outputs = []
        for rid in events.new_token_request_ids:
            state = self._requests[rid]
            new_ids = state.next_ids(1 + events.num_accepted_drafts.get(rid, 0))
            state.generated += new_ids
            new_text = self.tokenizer.decode(new_ids)
            state.text += new_text
            reason = finished.get(rid)
            outputs.append(
                RequestOutput(
                    rid,
                    state.prompt,
                    tuple(state.prompt_ids),
                    state.text,
                    tuple(state.generated),
                    reason is not None,
                    None if reason is None else reason.value,
                    new_text,
                    tuple(new_ids),
                )
            )
            if reason is not None:
                del self._requests[rid]
        return StepOutputs(tuple(outputs), EngineStep(plan, result, events))

    def _execute(self, plan: StepPlan) -> StepResult:
        duration_s = self.pick.pricer.step_time_s(plan)
        if self.drafts is not None:
            duration_s += self.drafts.drafting_s(plan)
        # A busy replica's step starts when the one before it ended, however late the engine
        # thread comes back (its own moments between steps, or a stolen core, are not the GPU's);
        # an idle one's when work came.
        start_s = self._free_at_s if self._busy else max(time.perf_counter(), self._free_at_s)
        end_s = self._free_at_s = start_s + duration_s / self.time_scale
        _sleep_until(end_s)
        self.tracking.add(time.perf_counter() - end_s)
        if self.drafts is None:
            return StepResult(duration_s)
        return self.drafts.result(plan, duration_s)

    def describe(self) -> str:
        """One line: what prices the steps and how the KV cache was sized."""
        pick = self.pick
        how = pick.why if pick.why != "asked" else f"the {pick.kind} {pick.source}"  # a kind named
        return (
            f"virtual replica: {pick.model.name} on {pick.tp} x {pick.hardware.name}, steps "
            f"priced by {how}; {self.kv.num_blocks:,} KV blocks of {self.serving.block_size} tokens"
            + (f"; clock x{self.time_scale:g}" if self.time_scale != 1 else "")
        )


LATE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)  # step lateness histogram


class TrackingError:
    """How late steps ended against their priced end (seconds; never negative in practice): a count,
    the sum and the worst, and a histogram over :data:`LATE_BUCKETS_S` (``bucket_counts[i]``: steps
    late by at most bound ``i`` and more than bound ``i - 1``; the last, beyond every bound), which
    the replica's ``/metrics`` shows as ``stallfree:virtual_step_late_seconds``. Written by the
    engine thread only; a scrape reads it as it stands."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.max_late_s = 0.0
        self.total_late_s = 0.0
        self.bucket_counts = [0] * (len(LATE_BUCKETS_S) + 1)

    def add(self, late_s: float) -> None:
        self.num_steps += 1
        self.total_late_s += late_s
        self.max_late_s = max(self.max_late_s, late_s)
        self.bucket_counts[bisect.bisect_left(LATE_BUCKETS_S, late_s)] += 1

    @property
    def mean_late_s(self) -> float:
        return self.total_late_s / self.num_steps if self.num_steps else 0.0


def _sleep_until(deadline_s: float) -> None:
    """Sleep to ``deadline_s`` (perf_counter): coarse sleeps, then the last ~0.2 ms in a spin-free
    sequence of short sleeps, so a step ends within a timer tick of its price."""
    while True:
        left_s = deadline_s - time.perf_counter()
        if left_s <= 0:
            return
        time.sleep(left_s - 0.0002 if left_s > 0.001 else left_s / 2)
