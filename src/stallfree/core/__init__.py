"""Pure scheduling core: stdlib only, no clock, no I/O, no torch.

Everything else (simulator, engine, server) drives this package through
:func:`stallfree.core.step.run_step` with an executor of its own.
"""

from stallfree.core.block_manager import BlockManager
from stallfree.core.config import (
    DEFAULT_STEP_TOKEN_CAP,
    DEFAULT_TOKEN_BUDGET,
    SCHEDULING_POLICIES,
    CacheConfig,
    SchedulerConfig,
    ceil_div,
)
from stallfree.core.plan import ScheduledChunk, StepPlan, StepResult, synthetic_plan
from stallfree.core.policy import (
    POLICIES,
    ChunkedPolicy,
    DecodeFirstPolicy,
    Policy,
    PrefillFirstPolicy,
    Steadiness,
    make_policy,
)
from stallfree.core.request import FinishReason, PromptBlocks, Request, SamplingParams
from stallfree.core.scheduler import Scheduler, StepEvents
from stallfree.core.serving import ServingConfig
from stallfree.core.state import SchedulerState, Sequence
from stallfree.core.steady import SteadyRun
from stallfree.core.step import Executor, StepCostModel, priced_executor, run_step
from stallfree.core.time_budget import StepTimePredictor

__all__ = [
    "DEFAULT_STEP_TOKEN_CAP",
    "DEFAULT_TOKEN_BUDGET",
    "POLICIES",
    "SCHEDULING_POLICIES",
    "BlockManager",
    "CacheConfig",
    "ChunkedPolicy",
    "DecodeFirstPolicy",
    "Executor",
    "FinishReason",
    "Policy",
    "PrefillFirstPolicy",
    "PromptBlocks",
    "Request",
    "SamplingParams",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerState",
    "Sequence",
    "ServingConfig",
    "Steadiness",
    "SteadyRun",
    "StepCostModel",
    "StepEvents",
    "StepPlan",
    "StepResult",
    "StepTimePredictor",
    "ceil_div",
    "make_policy",
    "priced_executor",
    "run_step",
    "synthetic_plan",
]
