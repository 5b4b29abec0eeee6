"""The engine's one typed config: which weights, how they run, and how steps are scheduled.

:class:`EngineConfig` is what :class:`~stallfree.engine.engine.LLMEngine`, ``LLM``, the server and
the CLI pass around; :meth:`EngineConfig.from_options` is the keyword form (vLLM's ``LLM(model,
**kwargs)``): engine fields by name, every other name a :class:`~stallfree.core.serving.ServingConfig`
option. torch-free, so the CLI builds one without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from stallfree.core import StepTimePredictor
from stallfree.core.serving import ServingConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """``model``: ``random:<preset>``, a GGUF file or short name, or a local HF folder.
    ``quantization``: ``q8_0`` runs the matmul weights as llama.cpp's Q8_0 int8 blocks, ``bf16``
    as bf16 (on the CPU, fp32 activations; see :class:`~stallfree.engine.model.PackedWeights`).
    ``serving`` says how to schedule. ``kv_cache_memory_fraction``: share of free memory the KV
    cache takes when ``serving.num_blocks`` is not given. ``step_time_predictor``
    (``StepPlan -> seconds``, such as a measured profile's ``MeasuredCostModel.step_time_s``; the
    engine imports no cost model itself) is what ``serving.step_budget_ms`` plans by.
    ``adapt_threads``: on the CPU, run each step on no more threads than the cores other processes
    leave free (:mod:`stallfree.engine.cpu_share`); a profile turns it off to measure the machine
    at fixed threads. ``auto_token_budget``: on the CPU, a chunked ``serving`` with no budget,
    chunk size or step-time budget gets the token budget this machine's steps call for
    (:func:`~stallfree.engine.auto_budget.choose_token_budget`), measured at start-up.
    ``prompt_lookup_min`` / ``prompt_lookup_max``: with ``serving.num_speculative_tokens``, the
    n-gram lengths the drafter looks up (:mod:`~stallfree.engine.drafts`; vLLM's names and
    defaults: one given sets the other). ``adaptive_drafts``: propose a request only the drafts
    worth their rows here, from its recent acceptance (else every draft a lookup finds, as vLLM)."""

    model: str = "random:small"
    dtype: str = "auto"
    device: str | None = None
    quantization: str | None = None
    serving: ServingConfig = field(default_factory=ServingConfig)
    kv_cache_memory_fraction: float | None = None
    seed: int = 0
    step_time_predictor: StepTimePredictor | None = None
    adapt_threads: bool = True
    auto_token_budget: bool = False
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    adaptive_drafts: bool = True

    def __post_init__(self) -> None:
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        low, high = self.lookup_range
        if low > high:
            raise ValueError(f"prompt_lookup_min {low} must be <= prompt_lookup_max {high}")

    @property
    def lookup_range(self) -> tuple[int, int]:
        """The n-gram lengths the drafter tries: vLLM's rule (5 and 5; one given sets the other)."""
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        return low or high or 5, high or low or 5

    @classmethod
    def from_options(cls, model: str = "random:small", **options: Any) -> EngineConfig:
        """Engine fields by name, the rest :meth:`ServingConfig.from_options` (``token_budget``,
        ``max_num_seqs``, ...); ``serving`` and serving options together are refused."""
        own = {f.name for f in fields(cls)}
        engine = {k: v for k, v in options.items() if k in own}
        serving = {k: v for k, v in options.items() if k not in own}
        if serving and "serving" in engine:
            raise ValueError("give either serving or its options, not both")
        if serving:
            engine["serving"] = ServingConfig.from_options(**serving)
        return cls(model=model, **engine)
