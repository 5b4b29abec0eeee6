"""The real engine as explain's :class:`~stallfree.explain.scenario.StepTimer`: steps measured
on the wall clock.

Each step's duration is the wall time since the previous step ended (or since this
one started), so scheduling and sampling overhead are in it: the clock the streams
would see. Prompts are random token ids (random weights time like real ones);
tokens are greedy. The reference figures (decode step, prefill alone, ridge) come
from synthetic steps on the same runner (:mod:`stallfree.engine.step_timing`).
"""

from __future__ import annotations

import gc
import random
import time

import torch

from stallfree.core import CacheConfig, Executor, StepPlan, StepResult
from stallfree.core.config import ceil_div
from stallfree.engine.kv_cache import KVCache, free_memory_bytes, kv_bytes_per_block
from stallfree.engine.model_runner import ModelRunner
from stallfree.engine.native import chunk_kernel_for, kernel_for
from stallfree.engine.step_timing import measure_ridge, time_plan
from stallfree.engine.weights import load_model

RIDGE_CHUNKS = (8, 16, 32, 64, 128, 256, 512, 1024)
REPEATS = 5  # one run of a reference step is too noisy to divide a TTFT by
FIRST_TOKEN_ID = 3  # ids below are special tokens of the random tokenizer


class EngineTimer:
    """Measures steps of ``model`` with a KV cache sized for ``max_tokens`` tokens, its weights in
    ``dtype`` or ``quantization`` as :class:`~stallfree.engine.engine.LLMEngine` runs them."""

    def __init__(
        self,
        model: str,
        *,
        max_tokens: int,
        max_seq_tokens: int,
        dtype: torch.dtype = torch.bfloat16,
        quantization: str | None = None,
        device: str = "cpu",
        block_size: int = 16,
        ridge_tolerance: float = 1.2,
        seed: int = 0,
    ) -> None:
        self.model, _ = load_model(model, dtype, device, seed)
        self.model.prepack_cpu_weights(quantization)
        spec = self.model.spec
        if max_seq_tokens > spec.max_position_embeddings:
            raise ValueError(
                f"a sequence of {max_seq_tokens:,} tokens exceeds {spec.name}'s "
                f"{spec.max_position_embeddings:,} positions"
            )
        num_blocks = ceil_div(max_tokens, block_size) + 64  # headroom: partly-filled last blocks
        self.kv_bytes = num_blocks * kv_bytes_per_block(spec, block_size, dtype)
        free = free_memory_bytes(self.model.device)
        if self.kv_bytes > 0.8 * free:
            raise ValueError(
                f"the KV cache for {max_tokens:,} tokens needs {self.kv_bytes / 2**30:.1f} GiB, "
                f"more than the {free / 2**30:.1f} GiB free here"
            )
        self.model_runner = ModelRunner(
            self.model,
            KVCache(spec, num_blocks, block_size, dtype, self.model.device),
            kernel_for(self.model.device, dtype),
            chunk_kernel_for(self.model.device, dtype, self.model.weights.kind, spec.head_dim),
        )
        self.ridge_tolerance = ridge_tolerance
        self.seed = seed
        self._ridge: dict[tuple[int, int], float] = {}
        # A full collection walking the start-up heap (torch, tokenizer, model objects) is a
        # ~80 ms pause in the middle of some step; freeze it out of the collector (vLLM does too).
        gc.collect()
        gc.freeze()

    def cache_config(self) -> CacheConfig:
        kv = self.model_runner.kv_cache
        return CacheConfig(block_size=kv.block_size, num_blocks=kv.num_blocks, watermark=0.0)

    def new_executor(self) -> Executor:
        runner = self.model_runner
        runner.reset()
        rng = random.Random(self.seed)
        vocab = self.model.spec.vocab_size
        token_ids: dict[str, list[int]] = {}
        last_end: list[float] = []

        def execute(plan: StepPlan) -> StepResult:
            start = time.perf_counter()
            for c in plan.chunks:
                if c.request_id not in token_ids:
                    token_ids[c.request_id] = [
                        rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(c.num_known_tokens)
                    ]
            rids, logits = runner.execute(plan, token_ids)
            picks = logits.argmax(dim=-1).tolist()  # .tolist() waits for the device
            for rid, tok in zip(rids, picks, strict=True):
                token_ids[rid].append(tok)
            end = time.perf_counter()
            since = max(start, last_end[0]) if last_end else start
            last_end[:] = [end]
            return StepResult(end - since, dict(zip(rids, picks, strict=True)))

        return execute

    # Reference figures run between scenario runs: the last run's block tables are stale.
    def step_time_s(self, plan: StepPlan) -> float:
        """The median of :data:`REPEATS` runs of ``plan`` (after a warm-up run)."""
        self.model_runner.reset()
        return time_plan(self.model_runner, plan, repeats=REPEATS)

    def ridge_tokens(self, num_seqs: int, context_len: int) -> float:
        """Largest chunk (of :data:`RIDGE_CHUNKS`) whose mixed step costs <= tolerance x a decode step."""
        key = (num_seqs, context_len)
        if key not in self._ridge:
            self.model_runner.reset()
            _, points = measure_ridge(
                self.model_runner, num_seqs, context_len, RIDGE_CHUNKS, self.ridge_tolerance
            )
            fits = [p.chunk_tokens for p in points if p.ratio_to_decode <= self.ridge_tolerance]
            self._ridge[key] = float(fits[-1] if fits else RIDGE_CHUNKS[0])
        return self._ridge[key]
