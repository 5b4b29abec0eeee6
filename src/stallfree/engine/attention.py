"""Attention of a ragged step over the paged KV cache.

A step's tokens come in two groups (the batch builder orders them so):

- the first rows are single-token chunks (decodes), in groups of a few sequences: each
  group's contexts are gathered block-wise from the cache, padded to the longest, and
  attended with one pair of matmuls and a padding mask (a group's gathered K/V is sized
  to stay in cache between the gather and the matmuls that read it); a group of one
  sequence attends over its exact context, unmasked, through SDPA;
- then each multi-token chunk (a prompt chunk or a recompute) attends over its own
  context with causal masking inside the chunk, one call per chunk.

With the compiled kernel (:mod:`stallfree.engine.native`, fp32 on the CPU) all the decodes
instead go to it in one call, which reads each sequence's blocks in place. With bf16 weights on
a CPU with AVX512-BF16 (whose matmuls already round activations to bf16), each multi-token chunk
goes to the compiled chunk kernel instead: bf16 products over its blocks in place, one call.

Grouped-query attention never copies K/V per query head and never asks SDPA for
``enable_gqa`` (many times slower in bf16 on CPU): decodes fold each KV head's group of
query heads into extra query rows. A chunk with no earlier context puts the group in
SDPA's batch dimension over expanded (stride-0) K/V views and asks for plain causal
attention (the flash kernel then skips the masked half). A chunk after earlier context, on
the CPU, runs two flash calls whose results merge by their log-sum-exps: over the earlier
context, unmasked, with the group folded into query rows (each KV head's context read once
for all its query heads), and over the chunk itself, plain causal. Under one mask instead,
a 1,992-token chunk after 48 cached tokens took 1.9x as long (12 layers of random:medium, one
thread: ~1 s more). Elsewhere (CUDA) it attends under an additive mask in the model dtype,
the group folded into query rows, built once per step by the batch builder and shared by
all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stallfree.engine.native import ChunkKernel, DecodeKernel


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Single-token chunks in rows ``[start, start + num_seqs)``, attended together."""

    start: int
    num_seqs: int
    gather_rows: torch.Tensor  # [kv_heads * num_seqs * max_blocks] rows of the cache's block view
    padding: torch.Tensor  # [num_seqs, 1, max_blocks * block_size] bool, True = past the context
    max_context_len: int  # the longest context in the group (a group of one: its context)


@dataclass(frozen=True, slots=True)
class ChunkAttention:
    """One multi-token chunk: rows ``[start, start + num_tokens)`` of the step."""

    start: int
    num_tokens: int
    num_computed_tokens: int
    gather_rows: torch.Tensor  # [kv_heads * blocks holding the context]
    blocks: torch.Tensor  # [blocks holding the context] long, in order
    # [num_tokens * query_group, context_len] additive (0 = attend, -inf = not), model dtype,
    # rows token-major (token t's query heads of one KV head are rows t*group .. t*group+group-1);
    # None: no earlier context (plain causal), or on the CPU (two flash calls merged).
    mask: torch.Tensor | None

    @property
    def context_len(self) -> int:
        return self.num_computed_tokens + self.num_tokens


@dataclass(frozen=True, slots=True)
class NativeDecode:
    """Single-token chunks in rows ``[0, num_seqs)``, attended by the compiled kernel."""

    kernel: DecodeKernel
    block_table: torch.Tensor  # [num_seqs, most blocks] long, zero-padded past each context
    context_lens: torch.Tensor  # [num_seqs] long

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Where each token's K/V is written, and what each token attends to (the decodes: in
    ``decode_groups``, or all in ``native_decode``)."""

    slot_mapping: torch.Tensor  # [num_tokens] long: cache slot of each token
    decode_groups: tuple[DecodeGroup, ...]
    chunks: tuple[ChunkAttention, ...]
    native_decode: NativeDecode | None = None
    chunk_kernel: ChunkKernel | None = None  # attends every chunk (bf16 products) where set


def gather_rows(block_ids: torch.Tensor, kv_heads: int, num_blocks: int) -> torch.Tensor:
    """Rows of the ``[kv_heads * num_blocks, block_size * D]`` cache view holding ``block_ids``,
    head-major, so the gathered rows ARE the ``[kv_heads, blocks, block_size, D]`` layout.

    A dim-0 ``index_select`` of whole rows is about twice as fast as indexing dim 1 on CPU.
    """
    heads = torch.arange(kv_heads, device=block_ids.device)[:, None] * num_blocks
    return (heads + block_ids.flatten()[None, :]).flatten()


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Write ``k``/``v`` ([T, kv_heads, D]) to the cache, attend; return ``[T, heads * D]``."""
    num_tokens, num_heads, head_dim = q.shape
    key_cache, value_cache = cache
    kv_heads, num_blocks, block_size, _ = key_cache.shape
    group = num_heads // kv_heads
    key_cache.view(kv_heads, -1, head_dim).index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    value_cache.view(kv_heads, -1, head_dim).index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    key_rows = key_cache.view(kv_heads * num_blocks, block_size * head_dim)
    value_rows = value_cache.view(kv_heads * num_blocks, block_size * head_dim)

    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype, device=q.device)
    native = meta.native_decode
    if native is not None:
        n = native.num_seqs
        out[:n] = native.kernel(
            q[:n].reshape(n, num_heads * head_dim).contiguous(),
            key_cache,
            value_cache,
            native.block_table,
            native.context_lens,
            scale,
        )
    decode_q: torch.Tensor | None = None
    for g in meta.decode_groups:
        rows = slice(g.start, g.start + g.num_seqs)
        n = g.num_seqs
        if n == 1:
            # One sequence (a lone stream, or a context long enough to fill a group): its exact
            # context, no mask, each KV head's query heads as query rows, through SDPA's flash
            # kernel: a third of the two small matmuls' time at short contexts, the same at 3,000.
            ctx = g.max_context_len
            sq = q[rows].view(1, kv_heads, group, head_dim)
            sk = key_rows.index_select(0, g.gather_rows).view(1, kv_heads, -1, head_dim)[:, :, :ctx]
            sv = value_rows.index_select(0, g.gather_rows).view(1, kv_heads, -1, head_dim)[:, :, :ctx]
            out[rows] = F.scaled_dot_product_attention(sq, sk, sv, scale=scale).view(1, num_heads * head_dim)
            continue
        if decode_q is None:  # scaled once for every group of several
            last = meta.decode_groups[-1]
            decode_q = q[: last.start + last.num_seqs] * scale
        # [n, H, D] -> [kv_heads, n, group, D]: query head h uses KV head h // group.
        dq = decode_q[rows].view(n, kv_heads, group, head_dim).permute(1, 0, 2, 3)
        dk = key_rows.index_select(0, g.gather_rows).view(kv_heads, n, -1, head_dim)
        dv = value_rows.index_select(0, g.gather_rows).view(kv_heads, n, -1, head_dim)
        # Plain matmuls beat SDPA here: over a batch of sequences of a handful of query rows
        # each, SDPA ran 1.4-2x slower on CPU at 256+ tokens (bf16, even unmasked). Scores stay
        # in the model dtype (as the matmul made them); the softmax accumulates in fp32.
        scores = torch.matmul(dq, dk.transpose(-1, -2)).masked_fill_(g.padding, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out[rows] = torch.matmul(probs, dv).permute(1, 0, 2, 3).reshape(n, num_heads * head_dim)
    for chunk in meta.chunks:
        rows = slice(chunk.start, chunk.start + chunk.num_tokens)
        n, before = chunk.num_tokens, chunk.num_computed_tokens
        if meta.chunk_kernel is not None:  # reads q's rows where they lie, writes out's
            q_rows = q[rows].reshape(n, num_heads * head_dim)
            meta.chunk_kernel(q_rows, key_cache, value_cache, chunk.blocks, before, scale, out[rows])
            continue
        # [1, kv_heads, n * group, D]: each KV head's query heads folded into its query rows.
        fq = q[rows].view(n, kv_heads, group, head_dim).transpose(0, 1).reshape(1, kv_heads, -1, head_dim)
        if before:
            ctx = before if chunk.mask is None else chunk.context_len
            ck = key_rows.index_select(0, chunk.gather_rows).view(1, kv_heads, -1, head_dim)[:, :, :ctx]
            cv = value_rows.index_select(0, chunk.gather_rows).view(1, kv_heads, -1, head_dim)[:, :, :ctx]
        if chunk.mask is not None:  # all the context, causal inside the chunk, under one mask
            cout = F.scaled_dot_product_attention(fq, ck, cv, attn_mask=chunk.mask, scale=scale)
            out[rows] = (
                cout.view(kv_heads, n, group, head_dim).transpose(0, 1).reshape(n, num_heads * head_dim)
            )
            continue
        # The chunk itself, plain causal. Query heads as [group, kv_heads, n, D]: batch g, head h is
        # query head h * group + g, and K/V broadcast over the group as expanded views (no copies).
        cq = q[rows].view(n, kv_heads, group, head_dim).permute(2, 1, 0, 3)
        shape = (group, kv_heads, n, head_dim)
        sk, sv = k[rows].transpose(0, 1).expand(shape), v[rows].transpose(0, 1).expand(shape)
        if not before:
            cout = F.scaled_dot_product_attention(cq, sk, sv, is_causal=True, scale=scale)
        else:  # and the earlier context, all of it visible, merged by log-sum-exp
            assert _cpu_flash is not None  # the batch builder made no mask: merges_chunk_attention
            own, own_lse = _cpu_flash(cq, sk, sv, 0.0, True, scale=scale)[:2]
            past, past_lse = _cpu_flash(fq, ck, cv, 0.0, False, scale=scale)[:2]
            past = past.view(kv_heads, n, group, head_dim).permute(2, 0, 1, 3)
            past_lse = past_lse.view(kv_heads, n, group).permute(2, 0, 1)
            top = torch.maximum(own_lse, past_lse)
            w_own, w_past = (own_lse - top).exp_().unsqueeze(-1), (past_lse - top).exp_().unsqueeze(-1)
            cout = ((own.float() * w_own + past.float() * w_past) / (w_own + w_past)).to(q.dtype)
        out[rows] = cout.permute(2, 1, 0, 3).reshape(n, num_heads * head_dim)
    return out


# The CPU flash kernel behind SDPA, which also returns each query row's log-sum-exp (None where
# this torch has no such op: chunks after earlier context then attend under a mask).
_cpu_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def merges_chunk_attention(device: torch.device) -> bool:
    """Whether a chunk after earlier context attends by two merged flash calls (no mask)."""
    return device.type == "cpu" and _cpu_flash is not None
