"""Pure scheduling core: stdlib only, no clock, no I/O, no torch.

Everything else (simulator, engine, server) drives this package through
:func:`stallfree.core.step.run_step` with an executor of its own.
"""

from stallfree.core.block_manager import BlockManager
from stallfree.core.plan import ScheduledChunk, StepPlan, StepResult
from stallfree.core.policy import (
    POLICIES,
    ChunkedPolicy,
    DecodeFirstPolicy,
    Policy,
    PrefillFirstPolicy,
    Steadiness,
    make_policy,
)
from stallfree.core.request import FinishReason, Request, SamplingParams
from stallfree.core.scheduler import CacheConfig, Scheduler, SchedulerConfig, StepEvents
from stallfree.core.step import Executor, run_step

__all__ = [
    "POLICIES",
    "BlockManager",
    "CacheConfig",
    "ChunkedPolicy",
    "DecodeFirstPolicy",
    "Executor",
    "FinishReason",
    "Policy",
    "PrefillFirstPolicy",
    "Request",
    "SamplingParams",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerConfig",
    "Steadiness",
    "StepEvents",
    "StepPlan",
    "StepResult",
    "make_policy",
    "run_step",
]
