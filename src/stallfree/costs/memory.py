"""KV-cache capacity from hardware: how many paged blocks fit beside the weights.

Capacity = GPU memory x TP x ``gpu_memory_utilization`` (vLLM's knob) - the weights - an
activation reserve, divided into blocks of ``block_size`` tokens. Everything is summed over the
``tp`` GPUs of one replica. The reserve is the peak working memory of the largest step the
scheduler can plan: ``max_num_batched_tokens`` tokens through one layer (the residual stream,
its normed copy, q/k/v, the MLP's gate and up projections) plus float32 logits for
``max_num_seqs`` sequences. vLLM measures this peak by running a dummy batch; we estimate it.

Invariant: a :class:`KvMemory` always holds at least one block; a model that leaves no room
raises ``ValueError`` saying what took the memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallfree.specs.hardware import HardwareSpec
from stallfree.specs.model import ModelSpec

_GB = 1e9  # what users read: every size shown is decimal GB, as `specs` and `explain` show them
_LOGIT_BYTES = 4  # samplers work on float32 logits


@dataclass(frozen=True, slots=True)
class KvMemory:
    """Where one replica's memory goes, in bytes summed over its GPUs, and the blocks that fit."""

    usable_bytes: float
    weight_bytes: int
    activation_reserve_bytes: int
    kv_bytes_per_token: float
    block_size: int
    num_blocks: int

    @property
    def kv_bytes(self) -> float:
        return self.usable_bytes - self.weight_bytes - self.activation_reserve_bytes

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size


def activation_reserve_bytes(
    model: ModelSpec, *, tp: int, dtype_bytes: int, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """Peak working memory of the largest step, summed over ``tp`` GPUs (see module docstring)."""
    per_token_per_gpu = (
        2 * model.hidden_size  # residual stream and its normed copy, replicated on every GPU
        + (model.q_size + 2 * model.kv_size) // tp
        + 2 * model.intermediate_size // tp  # gate and up projections
    )
    hidden = max_num_batched_tokens * per_token_per_gpu * dtype_bytes * tp
    logits = max_num_seqs * model.vocab_size * _LOGIT_BYTES  # split over the GPUs' vocab shards
    return hidden + logits


def kv_memory(
    model: ModelSpec,
    hardware: HardwareSpec,
    *,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    dtype_bytes: int = 2,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
) -> KvMemory:
    """KV blocks that fit on ``tp`` GPUs of ``hardware`` once ``model``'s weights are loaded."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    for label, value in (
        ("tp", tp),
        ("block_size", block_size),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_num_seqs", max_num_seqs),
    ):
        if value <= 0:
            raise ValueError(f"{label} must be positive, got {value}")
    usable = hardware.mem_capacity_bytes * tp * gpu_memory_utilization
    weights = model.weight_bytes(dtype_bytes)
    reserve = activation_reserve_bytes(
        model,
        tp=tp,
        dtype_bytes=dtype_bytes,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
    )
    kv_per_token = model.kv_bytes_per_token_on(tp, dtype_bytes)
    num_blocks = int((usable - weights - reserve) // (kv_per_token * block_size))
    if num_blocks <= 0:
        raise ValueError(
            f"{model.name} does not fit on {tp} x {hardware.name} at gpu_memory_utilization "
            f"{gpu_memory_utilization}: {usable / _GB:.1f} GB usable, weights {weights / _GB:.1f} GB, "
            f"activations {reserve / _GB:.1f} GB, no room for the KV cache; raise --tp or the utilisation"
        )
    return KvMemory(
        usable_bytes=usable,
        weight_bytes=weights,
        activation_reserve_bytes=reserve,
        kv_bytes_per_token=kv_per_token,
        block_size=block_size,
        num_blocks=num_blocks,
    )


def fixed_kv_memory(
    model: ModelSpec, num_blocks: int, *, tp: int = 1, block_size: int = 16, dtype_bytes: int = 2
) -> KvMemory:
    """A KV cache of exactly ``num_blocks`` blocks (an engine's ``--num-blocks``), whatever the memory."""
    if num_blocks <= 0 or block_size <= 0 or tp <= 0:
        raise ValueError(
            f"num_blocks, block_size and tp must be positive, got {num_blocks}, {block_size}, {tp}"
        )
    kv_per_token = model.kv_bytes_per_token_on(tp, dtype_bytes)
    weights = model.weight_bytes(dtype_bytes)
    return KvMemory(
        usable_bytes=weights + num_blocks * block_size * kv_per_token,
        weight_bytes=weights,
        activation_reserve_bytes=0,
        kv_bytes_per_token=kv_per_token,
        block_size=block_size,
        num_blocks=num_blocks,
    )
