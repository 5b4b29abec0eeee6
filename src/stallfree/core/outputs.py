"""What an engine's step hands its driver: the step that ran and each request's output so far.

The PyTorch engine and the virtual replica (a scheduler whose steps take their priced time) both
return these, so the server's engine thread drives either the same way. Plain values, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallfree.core.plan import StepPlan, StepResult
from stallfree.core.scheduler import StepEvents


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """A request's output so far; ``new_text``/``new_token_ids`` are this step's additions."""

    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    new_text: str = ""
    new_token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = None
    # Per generated token, its top_logprobs alternatives as (token id, logprob); None unless asked.
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None


@dataclass(frozen=True, slots=True)
class EngineStep:
    """A step that ran: what the scheduler planned, what the executor measured, what finished."""

    plan: StepPlan
    result: StepResult
    events: StepEvents


@dataclass(frozen=True, slots=True)
class StepOutputs:
    """What one engine step call did.

    ``outputs``: one per request that got a token, finished ones included; ``step``: the
    step that ran, or None when nothing could be scheduled (no KV blocks for any waiting
    prompt, say): a driver then waits for something to change instead of spinning.
    """

    outputs: tuple[RequestOutput, ...]
    step: EngineStep | None

    @property
    def ran(self) -> bool:
        return self.step is not None


IDLE = StepOutputs((), None)
