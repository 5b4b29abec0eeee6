"""What the scheduler decides for one step, and what the executor reports back.

Invariants of a :class:`StepPlan` (checked by :meth:`StepPlan.validate`):
each request appears at most once; every chunk runs at least one token;
a chunk never runs past the tokens whose ids are known (draft tokens aside: a decode may
verify guesses after its last known token); the plan's ``num_tokens`` is the sum of its chunks.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

_EMPTY_BLOCKS: Mapping[str, tuple[int, ...]] = MappingProxyType({})
_NO_TOKENS: Mapping[str, int] = MappingProxyType({})


class ScheduledChunk:
    """``num_tokens`` tokens of one request, starting after ``num_computed_tokens``::

        |<- num_computed_tokens ->|<- num_tokens ->|<- not yet run ->|
        |   in the KV cache       |   this chunk   |                 |
        |<----------------- num_known_tokens ----------------------->|
        |<----- context_len (cached after the step) --->|

    ``num_known_tokens`` is how many of the request's tokens have ids (prompt + generated so
    far). A chunk that reaches it (:attr:`emits_token`: nothing left to run) produces logits
    and so a new token: the last prompt chunk, every decode, every recompute's end.
    ``after_cache_hit``: the request's first chunk, its computed tokens all found in the prefix
    cache at admission (a server may take longer over that step than over a later chunk).

    ``num_draft_tokens`` (speculative decoding): the last ``num_draft_tokens`` of the chunk are
    guesses that follow the last known token, run to be verified; ``num_tokens`` counts them
    (they take the step's budget and KV slots). The step keeps as many as the executor accepts
    and gives one more token after them.

    Two flags are worked out once, as the chunk is made (every step reads them several times):
    ``emits_token``, the chunk reaches the last known token, so its logits give the request a new
    token; ``is_decode``, one token that extends an already-computed sequence (no drafts).

    Immutable as a frozen dataclass would be (the attributes are ``Final``: mypy refuses an
    assignment) and equal by value, but a plain class: every simulated step builds one per running
    request, and a frozen dataclass takes ~0.8 µs to build, this ~0.2 µs (~0.03 µs compiled).
    """

    __slots__ = (
        "after_cache_hit",
        "emits_token",
        "is_decode",
        "num_computed_tokens",
        "num_draft_tokens",
        "num_known_tokens",
        "num_tokens",
        "request_id",
    )

    def __init__(
        self,
        request_id: str,
        num_computed_tokens: int,
        num_tokens: int,
        num_known_tokens: int,
        after_cache_hit: bool = False,
        num_draft_tokens: int = 0,
    ) -> None:
        self.request_id: Final = request_id
        self.num_computed_tokens: Final = num_computed_tokens
        self.num_tokens: Final = num_tokens
        self.num_known_tokens: Final = num_known_tokens
        self.after_cache_hit: Final = after_cache_hit
        self.num_draft_tokens: Final = num_draft_tokens
        self.emits_token: Final = num_computed_tokens + num_tokens - num_draft_tokens == num_known_tokens
        self.is_decode: Final = (
            num_tokens == 1 and num_known_tokens - num_computed_tokens == 1 and num_computed_tokens > 0
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScheduledChunk) and _chunk_fields(self) == _chunk_fields(other)

    def __hash__(self) -> int:
        return hash(_chunk_fields(self))

    def __repr__(self) -> str:
        return (
            f"ScheduledChunk(request_id={self.request_id!r}, num_computed_tokens={self.num_computed_tokens}, "
            f"num_tokens={self.num_tokens}, num_known_tokens={self.num_known_tokens}, "
            f"after_cache_hit={self.after_cache_hit}, num_draft_tokens={self.num_draft_tokens})"
        )

    @property
    def context_len(self) -> int:
        """Tokens in the KV cache once this chunk has run (drafts included, before verification)."""
        return self.num_computed_tokens + self.num_tokens

    @property
    def is_decoding(self) -> bool:
        """Extends an already-computed sequence by its last known token (with or without drafts)."""
        return self.num_known_tokens - self.num_computed_tokens == 1 and self.num_computed_tokens > 0


class StepPlan:
    """One step: the chunks to run, plus the KV-block bookkeeping executors mirror.

    ``new_block_ids`` maps a request to the blocks appended to its block table
    this step; ``freed_request_ids`` lists requests whose blocks were released
    (finished last step, aborted, or preempted now) so executors drop their
    tables; ``preempted_request_ids`` is the subset preempted by this plan.
    ``trimmed_block_tables`` maps a request to how many of its blocks it keeps, the rest released
    since the last plan (the slots of draft tokens the last step rejected). Executors cut their
    tables to it first, then drop the freed ones, then append the new blocks.

    Immutable (``Final`` attributes) and a plain class, as :class:`ScheduledChunk` is and for the
    same reason; equal by value (not hashable: its mappings are not).
    """

    __slots__ = (
        "chunks",
        "freed_request_ids",
        "new_block_ids",
        "preempted_request_ids",
        "trimmed_block_tables",
    )

    def __init__(
        self,
        chunks: tuple[ScheduledChunk, ...],
        new_block_ids: Mapping[str, tuple[int, ...]] = _EMPTY_BLOCKS,
        preempted_request_ids: tuple[str, ...] = (),
        freed_request_ids: tuple[str, ...] = (),
        trimmed_block_tables: Mapping[str, int] = _NO_TOKENS,
    ) -> None:
        self.chunks: Final = chunks
        self.new_block_ids: Final = new_block_ids
        self.preempted_request_ids: Final = preempted_request_ids
        self.freed_request_ids: Final = freed_request_ids
        self.trimmed_block_tables: Final = trimmed_block_tables

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepPlan) and _plan_fields(self) == _plan_fields(other)

    def __repr__(self) -> str:
        return (
            f"StepPlan(chunks={self.chunks!r}, new_block_ids={dict(self.new_block_ids)!r}, "
            f"preempted_request_ids={self.preempted_request_ids!r}, freed_request_ids={self.freed_request_ids!r}, "
            f"trimmed_block_tables={dict(self.trimmed_block_tables)!r})"
        )

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def num_decode_tokens(self) -> int:
        """Tokens of decoding requests: one each, plus the drafts they verify."""
        return sum(c.num_tokens for c in self.chunks if c.is_decoding)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if not c.is_decoding)

    @property
    def num_draft_tokens(self) -> int:
        return sum(c.num_draft_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    def validate(self) -> None:
        """Raise ``ValueError`` if the plan breaks an invariant of the module docstring."""
        seen: set[str] = set()
        for c in self.chunks:
            if c.request_id in seen:
                raise ValueError(f"request {c.request_id} scheduled twice in one step")
            seen.add(c.request_id)
            if c.num_tokens <= 0:
                raise ValueError(f"request {c.request_id}: chunk of {c.num_tokens} tokens")
            if c.context_len - c.num_draft_tokens > c.num_known_tokens:
                raise ValueError(f"request {c.request_id}: chunk runs past its known tokens")
            if c.num_draft_tokens and not (0 < c.num_draft_tokens < c.num_tokens and c.emits_token):
                raise ValueError(f"request {c.request_id}: drafts must follow a chunk's last known token")


def _chunk_fields(c: ScheduledChunk) -> tuple[str, int, int, int, bool, int]:
    return (
        c.request_id,
        c.num_computed_tokens,
        c.num_tokens,
        c.num_known_tokens,
        c.after_cache_hit,
        c.num_draft_tokens,
    )


def _plan_fields(p: StepPlan) -> tuple[object, ...]:
    return (p.chunks, p.new_block_ids, p.preempted_request_ids, p.freed_request_ids, p.trimmed_block_tables)


class StepResult:
    """What an executor did with a plan.

    ``duration_s`` is simulated (cost model) or measured (wall clock).
    ``sampled_token_ids`` has one entry per sampling chunk when the executor
    samples real tokens (empty for the simulator): a chunk's last token, after any accepted
    drafts. ``stopped_request_ids`` are requests the executor ended on EOS / stop tokens / stop
    strings.

    Speculative decoding: ``num_accepted_drafts`` says how many of a chunk's draft tokens the
    executor accepted (the engine by verifying them, the simulator by an acceptance model; a
    chunk not listed accepted none), ``accepted_draft_ids`` their ids where the executor knows
    them (the engine: so generated blocks are keyed for the prefix cache), and
    ``num_proposed_drafts`` how many drafts each request has for its next step.

    Immutable (``Final`` attributes), a plain class as :class:`StepPlan` is: one is made every step.
    """

    __slots__ = (
        "accepted_draft_ids",
        "duration_s",
        "num_accepted_drafts",
        "num_proposed_drafts",
        "sampled_token_ids",
        "stopped_request_ids",
    )

    def __init__(
        self,
        duration_s: float,
        sampled_token_ids: Mapping[str, int] = _NO_TOKENS,
        stopped_request_ids: frozenset[str] = frozenset(),
        num_accepted_drafts: Mapping[str, int] = _NO_TOKENS,
        accepted_draft_ids: Mapping[str, tuple[int, ...]] = _EMPTY_BLOCKS,
        num_proposed_drafts: Mapping[str, int] = _NO_TOKENS,
    ) -> None:
        self.duration_s: Final = duration_s
        self.sampled_token_ids: Final = sampled_token_ids
        self.stopped_request_ids: Final = stopped_request_ids
        self.num_accepted_drafts: Final = num_accepted_drafts
        self.accepted_draft_ids: Final = accepted_draft_ids
        self.num_proposed_drafts: Final = num_proposed_drafts


def synthetic_plan(
    num_decodes: int, decode_context: int, chunk_tokens: int = 0, chunk_context: int = 0
) -> StepPlan:
    """A step no scheduler made, for pricing and profiling: ``num_decodes`` decodes at
    ``decode_context`` cached tokens each, plus (if ``chunk_tokens``) one prompt chunk after
    ``chunk_context`` computed tokens that reaches its last token (so it samples).

    Request ids are ``decode-0``, ``decode-1``, ... and ``chunk``.
    """
    if num_decodes < 0 or decode_context < 0 or chunk_tokens < 0 or chunk_context < 0:
        raise ValueError("synthetic_plan: counts must be >= 0")
    if num_decodes == 0 and chunk_tokens == 0:
        raise ValueError("synthetic_plan: a step needs a decode or a chunk")
    chunks = [
        ScheduledChunk(f"decode-{i}", decode_context, 1, decode_context + 1) for i in range(num_decodes)
    ]
    if chunk_tokens:
        chunks.append(ScheduledChunk("chunk", chunk_context, chunk_tokens, chunk_context + chunk_tokens))
    return StepPlan(tuple(chunks))
