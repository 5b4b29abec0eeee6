"""The PyTorch engine: a Llama-family model run step by step by the shared core scheduler.

Public API (vLLM's names): :class:`LLM` for offline batches, :class:`LLMEngine` for
step-by-step driving (servers, the measured explainer), :class:`RequestOutput`, and the
core's :class:`SamplingParams`. This package imports torch; nothing outside it may.
"""

from stallfree.core import SamplingParams
from stallfree.core.outputs import EngineStep, RequestOutput, StepOutputs
from stallfree.engine.engine import LLMEngine
from stallfree.engine.llm import LLM
from stallfree.engine.random_models import RANDOM_PRESETS

__all__ = [
    "LLM",
    "RANDOM_PRESETS",
    "EngineStep",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "StepOutputs",
]
