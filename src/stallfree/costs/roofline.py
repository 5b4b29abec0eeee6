"""Roofline cost model: how long a :class:`StepPlan` takes on a model/hardware/TP setup.

Owns :class:`CostModelConfig`, :class:`StepCost` and :class:`CostModel`. Imports specs and
``core.plan`` only (numpy for the vectorised decode path), never torch.

Step time = max(compute, memory) + all-reduce time + ``overhead_s``, per GPU, with two kinds:

``weights-only`` (alias ``seed``) the seed explainer's arithmetic, exactly: FLOPs = 2 x ``num_params`` x tokens,
          bytes = all weights once per step. No attention, no KV cache, no communication.
``full``  linear FLOPs = 2 x ``num_non_embedding_params`` x tokens, plus the LM head
          (2 x vocab x hidden) for each chunk that samples; attention FLOPs of every chunk
          over its earlier context and, causally, over itself (QK^T and AV: 4 x heads x
          head_dim per query-key pair per layer); bytes = non-embedding weights + the LM head
          when the step samples (the embedding is a row gather, not a stream) + the KV cache
          read for every chunk's earlier context + the KV written for its new tokens. Tensor
          parallelism splits FLOPs and bytes over ``tp`` GPUs (KV heads are replicated when
          ``num_kv_heads < tp``) and adds two ring all-reduces per layer of the step's
          activations (tokens x hidden x dtype bytes).

A mixture-of-experts model multiplies each token by its own experts only (FLOPs from the active
parameters) and a step reads the shared weights plus the experts its tokens route to (the
expected number of distinct experts of uniform routing, :meth:`ModelSpec.decoder_weight_bytes`):
decode at small batches reads a few experts, so its ridge lies far above a dense model's of the
same size. ``weights-only`` keeps the seed's arithmetic: active FLOPs, every weight read.

A model with sliding-window layers (Mistral, gpt-oss; Llama 4's chunked local attention taken
as a window of its chunk) counts those layers' query-key pairs and KV reads within the window
(:func:`window_keys`); DeepSeek's MLA caches and reads its compressed latent a token
(:meth:`ModelSpec.kv_bytes_per_token`) and multiplies its query/key and value heads
(:attr:`ModelSpec.attention_flops_per_key`).

A plan's cost depends on four sums over its chunks (tokens, sampling chunks, query-key pairs,
earlier-context tokens), so every entry point reduces to :meth:`CostModel._duration`; an
empty plan costs nothing. Invariant: :meth:`steady_durations` equals :meth:`step_time_s` on the
equivalent plans, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from stallfree.core.plan import StepPlan, synthetic_plan
from stallfree.specs.hardware import HardwareSpec
from stallfree.specs.model import ModelSpec

CostModelKind = Literal["weights-only", "full"]
COST_MODEL_KINDS: tuple[CostModelKind, ...] = ("weights-only", "full")
COST_MODEL_ALIASES: dict[str, CostModelKind] = {"seed": "weights-only"}


def cost_model_kind(name: str) -> str:
    """``name`` with aliases resolved (``seed`` -> ``weights-only``); other names pass unchanged."""
    return COST_MODEL_ALIASES.get(name, name)


class PlanSums(NamedTuple):
    """What a plan's cost depends on, summed over its chunks (every cost model reads these).

    ``num_keys``: query-key pairs (token i of a chunk attends to the chunk's earlier context and
    to i + 1 of its own tokens); ``num_context``: earlier-context tokens; ``num_shift_keys``: the
    pairs one more step of a steady run adds (each chunk of n tokens shifted by n adds n * n).
    """

    num_tokens: int
    num_samples: int
    num_keys: int
    num_context: int
    num_shift_keys: int


def window_keys(before: npt.ArrayLike, n: int, window: int) -> npt.NDArray[np.int64]:
    """Query-key pairs of a chunk of ``n`` tokens after ``before`` earlier ones when each token
    attends to the last ``window`` tokens only (its own included): sum over positions p of
    min(p + 1, window). Element-wise over ``before``."""
    k = np.asarray(before, dtype=np.int64)
    low, high = k + 1, k + n  # p + 1 over the chunk
    top = np.minimum(high, window)
    ramp = np.where(top >= low, (low + top) * (top - low + 1) // 2, 0)
    keys: npt.NDArray[np.int64] = ramp + np.maximum(high - np.maximum(k, window), 0) * window
    return keys


def plan_sums(plan: StepPlan) -> PlanSums:
    num_tokens = num_samples = num_keys = num_context = num_shift_keys = 0
    for chunk in plan.chunks:
        n, before = chunk.num_tokens, chunk.num_computed_tokens
        num_tokens += n
        num_context += before
        num_keys += n * before + n * (n + 1) // 2
        num_shift_keys += n * n
        if chunk.emits_token:
            num_samples += 1
    return PlanSums(num_tokens, num_samples, num_keys, num_context, num_shift_keys)


def check_expert_parallel(model: ModelSpec, tp: int) -> None:
    """One-line ``ValueError`` where ``model``'s experts cannot split whole over ``tp`` GPUs."""
    if not model.is_moe:
        raise ValueError(f"expert parallelism splits a mixture of experts; {model.name} is dense")
    if model.moe_num_experts % tp:
        raise ValueError(
            f"{model.name}'s {model.moe_num_experts} experts do not split evenly over tp={tp} GPUs"
        )


@dataclass(frozen=True, slots=True)
class CostModelConfig:
    """What the roofline is computed for. ``dtype_bytes`` applies to weights, KV and activations.

    ``tp`` must divide ``num_attention_heads``; it must also divide ``num_kv_heads``, or, when
    there are fewer KV heads than GPUs, be a multiple of them (each KV head is then replicated
    on ``tp / num_kv_heads`` GPUs, as vLLM does). ``expert_parallel``: a MoE model's experts split
    over the ``tp`` GPUs whole (vLLM's ``--enable-expert-parallel``, SGLang's ``--ep-size``) rather
    than each sliced over them; a step then waits for the GPU its tokens route the most experts
    to (:meth:`~stallfree.specs.model.ModelSpec.busiest_experts`).
    """

    model: ModelSpec
    hardware: HardwareSpec
    tp: int = 1
    dtype_bytes: int = 2
    kind: CostModelKind = "weights-only"
    overhead_s: float = 0.0
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", cost_model_kind(self.kind))  # frozen: normalise the alias
        heads, kv_heads = self.model.num_attention_heads, self.model.num_kv_heads
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp must be a positive integer, got {self.tp!r}")
        if heads % self.tp:
            raise ValueError(f"tp={self.tp} does not divide {self.model.name}'s {heads} attention heads")
        if (kv_heads % self.tp if kv_heads >= self.tp else self.tp % kv_heads) != 0:
            raise ValueError(
                f"tp={self.tp} neither divides nor is a multiple of {self.model.name}'s {kv_heads} KV heads"
            )
        if self.expert_parallel:
            check_expert_parallel(self.model, self.tp)
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes!r}")
        if self.kind not in COST_MODEL_KINDS:
            raise ValueError(
                f"cost model kind must be one of {', '.join(COST_MODEL_KINDS)}, got {self.kind!r}"
            )
        if not (math.isfinite(self.overhead_s) and self.overhead_s >= 0):
            raise ValueError(f"overhead_s must be >= 0, got {self.overhead_s!r}")


@dataclass(frozen=True, slots=True)
class StepCost:
    """One step's roofline. ``flops`` and ``bytes_moved`` are totals over all ``tp`` GPUs."""

    flops: float
    bytes_moved: float
    compute_s: float
    memory_s: float
    comm_s: float
    duration_s: float


_EMPTY_STEP = StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class CostModel:
    """Step durations for one :class:`CostModelConfig`; stateless after construction."""

    def __init__(self, config: CostModelConfig) -> None:
        self.config = config
        model, hw, tp, dtype_bytes = config.model, config.hardware, config.tp, config.dtype_bytes
        self._peak_flops_per_s = hw.peak_flops_per_s * tp
        self._bandwidth_bytes_per_s = hw.mem_bandwidth_bytes_per_s * tp
        self._overhead_s = config.overhead_s
        self._weights_only = config.kind == "weights-only"
        self._model, self._dtype_bytes = model, dtype_bytes
        self._moe = model.is_moe and config.kind != "weights-only"
        self._window, self._window_share = 0, 0.0
        self._weight_bytes_cache: dict[int, float] = {}
        self._expert_gpus = tp if config.expert_parallel else 1
        if self._weights_only:
            self._flops_per_token = 2.0 * model.num_active_params
            self._flops_per_sample = 0.0
            self._flops_per_key = 0.0
            self._weight_bytes = float(model.weight_bytes(dtype_bytes))
            self._lm_head_bytes = 0.0
            self._kv_bytes_per_token = 0.0
            self._comm_s_per_token = 0.0
            self._comm_s_per_step = 0.0
            return
        self._flops_per_token = 2.0 * model.num_active_non_embedding_params
        self._flops_per_sample = 2.0 * model.lm_head_params
        self._flops_per_key = model.attention_flops_per_key  # QK^T and AV, every head and layer
        # sliding-window layers attend to (and read the KV of) the last `window` tokens only
        self._window = model.sliding_window
        self._window_share = model.num_sliding_layers / model.num_layers
        self._weight_bytes = model.decoder_weight_bytes(dtype_bytes)
        self._lm_head_bytes = float(model.lm_head_params * dtype_bytes)
        # Summed over GPUs: a replicated KV head is read and written on each GPU holding it.
        self._kv_bytes_per_token = model.kv_bytes_per_token_on(tp, dtype_bytes)
        if tp == 1:
            self._comm_s_per_token = 0.0
            self._comm_s_per_step = 0.0
        else:
            # Ring all-reduce: each GPU sends and receives 2 (tp - 1) / tp of the buffer. Two per
            # layer: after the attention output projection and after the MLP down projection.
            num_all_reduces = 2 * model.num_layers
            ring_factor = 2.0 * (tp - 1) / tp
            bytes_per_token = model.hidden_size * dtype_bytes
            self._comm_s_per_token = (
                num_all_reduces * ring_factor * bytes_per_token / hw.interconnect_bandwidth_bytes_per_s
            )
            self._comm_s_per_step = num_all_reduces * hw.interconnect_latency_s

    # -- plans ------------------------------------------------------------------------------

    def step_cost(self, plan: StepPlan) -> StepCost:
        """The full breakdown of one step (allocates; the simulator's hot path uses step_time_s)."""
        num_tokens, num_samples, num_keys, num_context = self._sums(plan)
        if num_tokens == 0:
            return _EMPTY_STEP
        flops, bytes_moved = self._flops_bytes(num_tokens, num_samples, num_keys, num_context)
        compute_s = flops / self._peak_flops_per_s
        memory_s = bytes_moved / self._bandwidth_bytes_per_s
        comm_s = self._comm_s(num_tokens)
        return StepCost(
            flops=flops,
            bytes_moved=bytes_moved,
            compute_s=compute_s,
            memory_s=memory_s,
            comm_s=comm_s,
            duration_s=self._combine(compute_s, memory_s, comm_s),
        )

    def step_time_s(self, plan: StepPlan) -> float:
        num_tokens, num_samples, num_keys, num_context = self._sums(plan)
        if num_tokens == 0:
            return 0.0
        return self._duration(num_tokens, num_samples, num_keys, num_context)

    # -- helpers for explain / tune ---------------------------------------------------------

    def ridge_tokens(self) -> float:
        """Tokens per step at which linear-layer compute time equals the weight-read time.

        Below it a step is bound by reading the weights, so extra tokens ride along almost free.
        Attention, KV traffic and the LM head are left out: the ridge is a property of the weights.
        """
        compute_per_token_s = self._flops_per_token / self._peak_flops_per_s
        if not self._moe:
            return self._weight_bytes / self._bandwidth_bytes_per_s / compute_per_token_s
        # the weights a step reads grow with its tokens (more experts): where the two lines cross
        low, high = 1.0, 1.0
        while self._weights_bytes_at(high) / self._bandwidth_bytes_per_s > compute_per_token_s * high:
            low, high = high, high * 2
        for _ in range(60):
            mid = (low + high) / 2
            if self._weights_bytes_at(mid) / self._bandwidth_bytes_per_s > compute_per_token_s * mid:
                low = mid
            else:
                high = mid
        return high

    def dense_ridge_tokens(self) -> float:
        """The ridge of a dense model with as many weights as this one's read and multiplied whole."""
        weight_bytes = self._model.decoder_weight_bytes(self._dtype_bytes)
        flops = 2.0 * self._model.num_non_embedding_params
        return (weight_bytes / self._bandwidth_bytes_per_s) / (flops / self._peak_flops_per_s)

    def decode_step_s(self, num_seqs: int, context_len: int) -> float:
        """One decode step of ``num_seqs`` sequences, each with ``context_len`` tokens cached."""
        return self.step_time_s(synthetic_plan(num_seqs, context_len))

    def prefill_time_s(self, num_tokens: int) -> float:
        """A prompt of ``num_tokens`` run alone, whole, in one step (it samples its first token)."""
        return self.step_time_s(synthetic_plan(0, 0, num_tokens))

    def steady_durations(self, plan: StepPlan, num_steps: int) -> npt.NDArray[np.float64]:
        """Durations of ``num_steps`` steps that repeat ``plan``, each chunk starting where it ended
        the step before (a scheduler's steady run). Element ``j`` equals :meth:`step_time_s` of the
        plan shifted by ``j`` steps, exactly (same operations in the same order).
        """
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        num_tokens, num_samples, num_keys, num_context = self._sums(plan)
        if num_tokens == 0:
            return np.zeros(num_steps)
        steps = np.arange(num_steps, dtype=np.int64)
        if self._window:
            keys, context = self._window_sums(plan, steps)
        else:
            # Shifting a chunk of n tokens by n adds n * n query-key pairs and n earlier tokens.
            shift = 0 if self._weights_only else plan_sums(plan).num_shift_keys
            keys = (num_keys + shift * steps).astype(np.float64)
            context = (num_context + (0 if self._weights_only else num_tokens) * steps).astype(np.float64)
        flops = self._flops_per_token * num_tokens + self._flops_per_sample * num_samples
        flops_per_step = flops + self._flops_per_key * keys
        fixed_bytes = self._weights_bytes_at(num_tokens) + (self._lm_head_bytes if num_samples else 0.0)
        bytes_moved = fixed_bytes + self._kv_bytes_per_token * (context + num_tokens)
        compute_s = flops_per_step / self._peak_flops_per_s
        memory_s = bytes_moved / self._bandwidth_bytes_per_s
        durations: npt.NDArray[np.float64] = np.maximum(compute_s, memory_s) + self._comm_s(num_tokens)
        return durations + self._overhead_s

    # -- arithmetic -------------------------------------------------------------------------

    def _sums(self, plan: StepPlan) -> tuple[int, int, float, float]:
        """(tokens, sampling chunks, query-key pairs, earlier-context tokens) over the plan; the
        last two averaged over the layers where some attend over a sliding window."""
        if self._weights_only:
            return sum(chunk.num_tokens for chunk in plan.chunks), 0, 0, 0
        sums = plan_sums(plan)
        if not self._window:
            return sums.num_tokens, sums.num_samples, sums.num_keys, sums.num_context
        keys, context = self._window_sums(plan, np.zeros(1, dtype=np.int64))
        return sums.num_tokens, sums.num_samples, float(keys[0]), float(context[0])

    def _window_sums(
        self, plan: StepPlan, steps: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Query-key pairs and earlier-context tokens of ``plan`` shifted by each of ``steps``,
        the window's layers' share at their windowed counts, the others' at the full ones."""
        full = np.zeros(len(steps), dtype=np.int64)
        windowed = np.zeros(len(steps), dtype=np.int64)
        full_context = np.zeros(len(steps), dtype=np.int64)
        windowed_context = np.zeros(len(steps), dtype=np.int64)
        for chunk in plan.chunks:
            n = chunk.num_tokens
            before = chunk.num_computed_tokens + n * steps
            full += n * before + n * (n + 1) // 2
            windowed += window_keys(before, n, self._window)
            full_context += before
            windowed_context += np.minimum(before, self._window)
        share = self._window_share
        keys: npt.NDArray[np.float64] = (1 - share) * full.astype(np.float64)
        keys = keys + share * windowed.astype(np.float64)
        context: npt.NDArray[np.float64] = (1 - share) * full_context.astype(np.float64)
        context = context + share * windowed_context.astype(np.float64)
        return keys, context

    def _flops_bytes(
        self, num_tokens: int, num_samples: int, num_keys: float, num_context: float
    ) -> tuple[float, float]:
        flops = self._flops_per_token * num_tokens + self._flops_per_sample * num_samples
        flops = flops + self._flops_per_key * num_keys
        fixed_bytes = self._weights_bytes_at(num_tokens) + (self._lm_head_bytes if num_samples else 0.0)
        bytes_moved = fixed_bytes + self._kv_bytes_per_token * (num_context + num_tokens)
        return flops, bytes_moved

    def _weights_bytes_at(self, num_tokens: float) -> float:
        """Weight bytes a step of ``num_tokens`` tokens reads (all of them, but for a MoE model)."""
        if not self._moe:
            return self._weight_bytes
        key = int(num_tokens)
        if key != num_tokens:  # the ridge's search between whole token counts
            return self._model.decoder_weight_bytes(self._dtype_bytes, num_tokens, self._expert_gpus)
        cached = self._weight_bytes_cache.get(key)
        if cached is None:
            cached = self._model.decoder_weight_bytes(self._dtype_bytes, key, self._expert_gpus)
            self._weight_bytes_cache[key] = cached
        return cached

    def _comm_s(self, num_tokens: int) -> float:
        return self._comm_s_per_token * num_tokens + self._comm_s_per_step

    def _duration(self, num_tokens: int, num_samples: int, num_keys: float, num_context: float) -> float:
        flops, bytes_moved = self._flops_bytes(num_tokens, num_samples, num_keys, num_context)
        compute_s = flops / self._peak_flops_per_s
        memory_s = bytes_moved / self._bandwidth_bytes_per_s
        return self._combine(compute_s, memory_s, self._comm_s(num_tokens))

    def _combine(self, compute_s: float, memory_s: float, comm_s: float) -> float:
        """The roofline: compute and memory overlap, communication and overhead do not.
        (:meth:`steady_durations` does the same on arrays.)"""
        return max(compute_s, memory_s) + comm_s + self._overhead_s
