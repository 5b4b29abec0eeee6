"""The model runner: a step plan in, logits for the sampling rows out.

It mirrors the scheduler's block tables (cutting ``plan.trimmed_block_tables``, dropping
``plan.freed_request_ids``, then appending ``plan.new_block_ids``, since a preempted request may
be re-admitted in the same plan with fresh blocks), builds the flat batch and runs one forward. It owns the KV
cache but no request state: token ids come from the caller each step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from stallfree.core import StepPlan
from stallfree.engine.batch import build_inputs
from stallfree.engine.kv_cache import KVCache
from stallfree.engine.model import LlamaModel
from stallfree.engine.native import ChunkKernel, DecodeKernel


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        decode_kernel: DecodeKernel | None = None,
        chunk_kernel: ChunkKernel | None = None,
    ) -> None:
        """``decode_kernel`` / ``chunk_kernel``: the compiled decode and prompt-chunk attention
        (:mod:`stallfree.engine.native`)."""
        self.model = model
        self.kv_cache = kv_cache
        self.decode_kernel = decode_kernel
        self.chunk_kernel = chunk_kernel
        self.block_tables: dict[str, list[int]] = {}

    def reset(self) -> None:
        """Forget every request's block table (the cache's contents become garbage)."""
        self.block_tables.clear()

    def execute(
        self, plan: StepPlan, token_ids: Mapping[str, Sequence[int]]
    ) -> tuple[tuple[str, ...], torch.Tensor]:
        """Run ``plan``; return the sampling request ids and their fp32 logits, row for row (a
        request verifying ``d`` drafts has ``d + 1`` rows in a row)."""
        for rid, kept in plan.trimmed_block_tables.items():
            if (table := self.block_tables.get(rid)) is not None:
                del table[kept:]
        for rid in plan.freed_request_ids:
            self.block_tables.pop(rid, None)
        for rid, blocks in plan.new_block_ids.items():
            self.block_tables.setdefault(rid, []).extend(blocks)
        if not plan.chunks:
            return (), torch.empty(0, self.model.spec.vocab_size)
        spec = self.model.spec
        inputs = build_inputs(
            plan.chunks,
            token_ids,
            self.block_tables,
            self.kv_cache,
            query_group=spec.num_attention_heads // spec.num_kv_heads,
            decode_kernel=self.decode_kernel,
            chunk_kernel=self.chunk_kernel,
        )
        logits = self.model(
            inputs.input_ids, inputs.positions, self.kv_cache, inputs.attn, inputs.logits_indices
        )
        return inputs.sample_request_ids, logits
