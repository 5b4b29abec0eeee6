"""Step prices in DynoSim's profile-data format, both ways.

DynoSim (NVIDIA Dynamo's mocker engines, ``ai-dynamo`` 1.4.2) reads timing tables from a
"mocker-format" NPZ file (``--planner-profile-data`` / ``planner_profile_data``): five arrays,

- ``prefill_isl`` (1-D) and ``prefill_ttft_ms``: the prompt part of a pass by how many new prompt
  tokens it runs, interpolated linearly (extrapolated past the ends);
- ``decode_active_kv_tokens`` (1-D), ``decode_context_length`` (1-D) and ``decode_itl`` (2-D, one
  row per KV count): the token-emitting part of a pass, interpolated bilinearly (extrapolated),
  at least 1 ms.

Its vLLM mocker prices one pass (one step) as the sum of two lookups (checked on single steps
against the installed 1.4.2 in ``benchmarks/peers/dynosim_side_by_side.py`` and docs/dynosim.md):

    prefill_ms(n * (mean prompt length - mean computed prefix))   over the n chunks of prompt
  + decode_ms(KV blocks in use x block size, mean known tokens)  over the requests that emit

:func:`tables_from_pricer` writes any stallfree cost model's prices in that format: a prompt
chunk of ``n`` tokens from an empty cache, and ``kv / context`` decodes at ``context`` known
tokens. :class:`DynoSimPricer` is the other way: it prices a stallfree plan from such tables by
DynoSim's rule, so a stallfree run and a DynoSim run see the very same price for every step and
what still differs between them is how they schedule. Invariant: element ``j`` of
:meth:`DynoSimPricer.steady_durations` equals :meth:`DynoSimPricer.step_time_s` of the plan
shifted by ``j`` steps.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from stallfree.core.plan import ScheduledChunk, StepPlan, synthetic_plan
from stallfree.core.step import StepCostModel

FloatArray = npt.NDArray[np.float64]
KEYS = ("prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens", "decode_context_length", "decode_itl")
MIN_DECODE_MS = 1.0  # the mocker's floor on a token-emitting pass
SHORT_RUN_STEPS = 32  # steady runs up to this long are priced step by step, without numpy


@dataclass(frozen=True, slots=True, eq=False)
class DynoSimTables:
    """The five arrays of a mocker-format NPZ; axes strictly increasing, times in ms."""

    prefill_isl: FloatArray
    prefill_ttft_ms: FloatArray
    decode_active_kv_tokens: FloatArray
    decode_context_length: FloatArray
    decode_itl: FloatArray
    _isl_list: list[float] = field(init=False, repr=False)
    _ttft_list: list[float] = field(init=False, repr=False)
    _kv_list: list[float] = field(init=False, repr=False)
    _ctx_list: list[float] = field(init=False, repr=False)
    _itl_rows: list[list[float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("prefill_isl", "decode_active_kv_tokens", "decode_context_length"):
            axis = getattr(self, name)
            if axis.ndim != 1 or len(axis) < 2 or not np.all(np.diff(axis) > 0):
                raise ValueError(f"{name}: needs at least 2 strictly increasing values")
        if self.prefill_ttft_ms.shape != self.prefill_isl.shape:
            raise ValueError("prefill_ttft_ms: one time per prefill_isl value")
        shape = (len(self.decode_active_kv_tokens), len(self.decode_context_length))
        if self.decode_itl.shape != shape:
            raise ValueError(f"decode_itl: shape {self.decode_itl.shape}, expected {shape}")
        # plain lists for the scalar lookups (a step priced at a time: numpy's cost a call dominates)
        object.__setattr__(self, "_isl_list", self.prefill_isl.tolist())
        object.__setattr__(self, "_ttft_list", self.prefill_ttft_ms.tolist())
        object.__setattr__(self, "_kv_list", self.decode_active_kv_tokens.tolist())
        object.__setattr__(self, "_ctx_list", self.decode_context_length.tolist())
        object.__setattr__(self, "_itl_rows", self.decode_itl.tolist())

    @classmethod
    def load(cls, path: str | Path) -> DynoSimTables:
        try:
            with np.load(path) as data:
                missing = [k for k in KEYS if k not in data]
                if missing:
                    raise ValueError(f"{path}: not a mocker-format NPZ (missing {', '.join(missing)})")
                arrays = {k: np.asarray(data[k], dtype=np.float64) for k in KEYS}
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        return cls(**arrays)

    def save(self, path: str | Path) -> None:
        np.savez(path, **{k: getattr(self, k) for k in KEYS})

    def prefill_ms(self, num_tokens: int) -> float:
        """The prompt part of a pass running ``num_tokens`` new prompt tokens (0 for none)."""
        if num_tokens <= 0:
            return 0.0
        x, y = self._isl_list, self._ttft_list
        i = min(max(bisect.bisect_right(x, num_tokens) - 1, 0), len(x) - 2)
        return max(0.0, y[i] + (y[i + 1] - y[i]) * ((num_tokens - x[i]) / (x[i + 1] - x[i])))

    def decode_ms_at(self, active_kv_tokens: float, context_len: float) -> float:
        """:meth:`decode_ms` of one pass, without numpy (the same arithmetic, in floats)."""
        kv_axis, ctx_axis = self._kv_list, self._ctx_list
        i = min(max(bisect.bisect_right(kv_axis, active_kv_tokens) - 1, 0), len(kv_axis) - 2)
        j = min(max(bisect.bisect_right(ctx_axis, context_len) - 1, 0), len(ctx_axis) - 2)
        tx = (active_kv_tokens - kv_axis[i]) / (kv_axis[i + 1] - kv_axis[i])
        ty = (context_len - ctx_axis[j]) / (ctx_axis[j + 1] - ctx_axis[j])
        g0, g1 = self._itl_rows[i], self._itl_rows[i + 1]
        low = g0[j] * (1 - ty) + g0[j + 1] * ty
        high = g1[j] * (1 - ty) + g1[j + 1] * ty
        return max(low * (1 - tx) + high * tx, MIN_DECODE_MS)

    def decode_ms(self, active_kv_tokens: FloatArray, context_len: FloatArray) -> FloatArray:
        """The emitting part of passes, elementwise (bilinear, extrapolated, floored at 1 ms)."""
        kv_axis, ctx_axis, grid = self.decode_active_kv_tokens, self.decode_context_length, self.decode_itl
        i = np.clip(np.searchsorted(kv_axis, active_kv_tokens, side="right") - 1, 0, len(kv_axis) - 2)
        j = np.clip(np.searchsorted(ctx_axis, context_len, side="right") - 1, 0, len(ctx_axis) - 2)
        tx = (active_kv_tokens - kv_axis[i]) / (kv_axis[i + 1] - kv_axis[i])
        ty = (context_len - ctx_axis[j]) / (ctx_axis[j + 1] - ctx_axis[j])
        low = grid[i, j] * (1 - ty) + grid[i, j + 1] * ty
        high = grid[i + 1, j] * (1 - ty) + grid[i + 1, j + 1] * ty
        out: FloatArray = np.maximum(low * (1 - tx) + high * tx, MIN_DECODE_MS)
        return out


def _axis(largest: float, num_points: int, first: float) -> FloatArray:
    """``first`` to ``largest``: dense where prices bend (small counts), sparse above."""
    return np.unique(np.round(np.geomspace(first, largest, num_points)))


def tables_from_pricer(
    pricer: StepCostModel,
    *,
    max_prefill_tokens: int,
    max_num_seqs: int,
    max_context_len: int,
    max_kv_tokens: int,
    num_points: int = 64,
) -> DynoSimTables:
    """``pricer``'s prices as DynoSim's tables: ``prefill_ttft_ms[k]``, one prompt chunk of
    ``prefill_isl[k]`` tokens from an empty cache that does not yet emit (the emitting part is the
    decode table's); ``decode_itl[a, c]``, ``b = kv / context`` decodes (at least 1, at most
    ``max_num_seqs``, a fraction priced between its two neighbours) each at ``context`` known tokens."""
    if min(max_prefill_tokens, max_num_seqs, max_context_len, max_kv_tokens) < 2:
        raise ValueError("tables need a prompt, sequences, a context and KV of at least 2 tokens")
    isl = np.concatenate(([0.0], _axis(max_prefill_tokens, num_points, 1)))
    prefill = np.array([_prompt_s(pricer, int(n)) * 1000 for n in isl])
    ctx_axis = _axis(max_context_len, num_points, 2)
    kv_axis = np.concatenate(([0.0], _axis(max_kv_tokens, num_points, 2)))
    itl = np.empty((len(kv_axis), len(ctx_axis)))
    for c, ctx in enumerate(ctx_axis):
        priced: dict[int, float] = {}
        for a, kv in enumerate(kv_axis):
            seqs = min(max(kv / ctx, 1.0), float(max_num_seqs))
            low = int(seqs)
            high = min(low + 1, max_num_seqs)
            for b in (low, high):
                if b not in priced:
                    priced[b] = pricer.step_time_s(synthetic_plan(b, int(ctx) - 1)) * 1000
            itl[a, c] = priced[low] + (priced[high] - priced[low]) * (seqs - low)
    return DynoSimTables(isl, prefill, kv_axis, ctx_axis, itl)


def _prompt_s(pricer: StepCostModel, num_tokens: int) -> float:
    if num_tokens == 0:
        return 0.0
    chunk = ScheduledChunk("prompt", 0, num_tokens, num_tokens + 1)  # stops short: emits nothing
    return pricer.step_time_s(StepPlan((chunk,)))


class DynoSimPricer:
    """A stallfree cost model that prices a plan as DynoSim's vLLM mocker prices its pass.

    Prompt part: the chunks that are not decodes, as ``n * (sum of prompt ends // n - sum of
    computed prefixes // n)`` tokens. Emitting part, when a chunk emits: the KV blocks of every
    scheduled request (``ceil(context / block_size)`` each; DynoSim counts blocks in use, a prefix
    shared by several requests once) times ``block_size``, at the mean known tokens of the
    emitting chunks (integer division, as the mocker's)."""

    def __init__(self, tables: DynoSimTables, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.tables = tables
        self.block_size = block_size

    def _prompt_tokens(self, chunks: tuple[ScheduledChunk, ...]) -> int:
        ends = starts = count = 0
        for c in chunks:
            if not c.is_decoding:
                ends += c.num_computed_tokens + c.num_tokens
                starts += c.num_computed_tokens
                count += 1
        return 0 if count == 0 else count * (ends // count - starts // count)

    def step_time_s(self, plan: StepPlan) -> float:
        chunks = plan.chunks
        prefill_ms = self.tables.prefill_ms(self._prompt_tokens(chunks))
        bs = self.block_size
        blocks = known = emitting = 0
        for c in chunks:
            blocks += -(-c.context_len // bs)
            if c.emits_token:
                known += c.num_known_tokens
                emitting += 1
        if not emitting:
            return prefill_ms / 1000
        return (prefill_ms + self.tables.decode_ms_at(blocks * bs, known // emitting)) / 1000

    def steady_durations(self, plan: StepPlan, num_steps: int) -> FloatArray:
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        chunks = plan.chunks
        if num_steps <= SHORT_RUN_STEPS or not chunks:  # numpy's cost a call outweighs its speed
            return np.array([self.step_time_s(StepPlan(_shifted(chunks, j))) for j in range(num_steps)])
        # A shifted plan: every chunk's computed and known tokens j further on; its prompt part
        # is priced step by step (the sums' integer divisions need not shift together).
        steps = np.arange(num_steps, dtype=np.int64)
        prefill = np.array(
            [self.tables.prefill_ms(self._prompt_tokens(_shifted(chunks, int(j)))) for j in steps]
            if any(not c.is_decoding for c in chunks)
            else np.zeros(num_steps)
        )
        emitting = [c for c in chunks if c.emits_token]
        if not emitting:
            return prefill / 1000
        bs = self.block_size
        contexts = np.array([c.context_len for c in chunks], dtype=np.int64)
        blocks = -((contexts[:, None] + steps[None, :]) // -bs)  # ceil, one row per chunk
        kv = blocks.sum(axis=0).astype(np.float64) * bs
        known = sum(c.num_known_tokens for c in emitting)
        mean_known = ((known + len(emitting) * steps) // len(emitting)).astype(np.float64)
        out: FloatArray = (prefill + self.tables.decode_ms(kv, mean_known)) / 1000
        return out

    def decode_step_s(self, num_seqs: int, context_len: int) -> float:
        return self.step_time_s(synthetic_plan(num_seqs, context_len))

    def prefill_time_s(self, num_tokens: int) -> float:
        return self.step_time_s(synthetic_plan(0, 0, num_tokens))

    def ridge_tokens(self) -> float:
        """Tokens where a prompt chunk's part costs as much as a 16-stream decode part (the prompt
        part alone grows; a scenario's yardstick only)."""
        decode_ms = float(self.tables.decode_ms(np.array([16.0 * 512]), np.array([512.0]))[0])
        isl, ms = self.tables.prefill_isl, self.tables.prefill_ttft_ms
        above = np.nonzero(ms >= decode_ms)[0]
        return float(isl[above[0]]) if len(above) else float(isl[-1])


def _shifted(chunks: tuple[ScheduledChunk, ...], j: int) -> tuple[ScheduledChunk, ...]:
    if j == 0:
        return chunks
    return tuple(
        ScheduledChunk(c.request_id, c.num_computed_tokens + j, c.num_tokens, c.num_known_tokens + j)
        for c in chunks
    )
