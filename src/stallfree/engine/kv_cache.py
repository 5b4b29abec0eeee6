"""The paged KV cache: K and V tensors indexed by the core block manager's block ids.

Layout per layer is heads-first, ``[num_kv_heads, num_blocks, block_size, head_dim]``:
gathering a sequence's blocks yields ``[num_kv_heads, context, head_dim]`` directly, the
shape attention wants, with no transpose copy. Token ``p`` of a request whose block table
is ``t`` lives at slot ``t[p // block_size] * block_size + p % block_size``.

Invariant: the cache is zero-initialised, so padded slots a batched read touches hold
finite values (masked-out NaNs would still poison ``softmax @ V``).
"""

from __future__ import annotations

import os

import torch

from stallfree.specs import ModelSpec


def kv_bytes_per_block(spec: ModelSpec, block_size: int, dtype: torch.dtype) -> int:
    """K and V of one block across all layers."""
    return 2 * spec.num_layers * spec.num_kv_heads * block_size * spec.head_dim * dtype.itemsize


class KVCache:
    """Owns the K/V storage; knows nothing about which request holds which block."""

    def __init__(
        self,
        spec: ModelSpec,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"KV cache needs positive num_blocks and block_size, got {num_blocks}, {block_size}"
            )
        shape = (spec.num_layers, spec.num_kv_heads, num_blocks, block_size, spec.head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = spec.num_kv_heads
        # K+V of one block in ONE layer (what attention gathers per block per layer).
        self.bytes_per_block = 2 * spec.num_kv_heads * block_size * spec.head_dim * dtype.itemsize
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros(shape, dtype=dtype, device=device)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.key[index], self.value[index]

    @property
    def num_bytes(self) -> int:
        return 2 * self.key.numel() * self.key.element_size()


def free_memory_bytes(device: torch.device) -> int:
    """Memory the KV cache could take on ``device`` now (CUDA: free; CPU: MemAvailable)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as meminfo:  # noqa: PTH123 - a Linux pseudo-file
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
