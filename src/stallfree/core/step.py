"""The loop body every driver shares: schedule, execute, update.

Drivers (the simulator's simulated clock, the engine's wall clock) call
:func:`run_step` repeatedly and own time and arrivals; this module owns
neither. Executors are plain callables, so tests pass a function; a cost model becomes one
through :func:`priced_executor`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from stallfree.core.plan import StepPlan, StepResult
from stallfree.core.request import PromptBlocks, Request, SamplingParams
from stallfree.core.scheduler import Scheduler, StepEvents

Executor = Callable[[StepPlan], StepResult]


@dataclass(frozen=True, slots=True)
class TimedStep:
    """A step that ran on a wall clock: its plan, when it started and ended, the executor's share."""

    plan: StepPlan
    start_s: float
    end_s: float
    executor_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class StepCostModel(Protocol):
    """The one "price a step" contract: how long ``plan`` takes, in seconds.

    Roofline and measured cost models implement it; a real engine's timer implements it by
    running the plan. Drivers on a simulated clock execute plans with :func:`priced_executor`.
    """

    def step_time_s(self, plan: StepPlan) -> float: ...


def priced_executor(cost_model: StepCostModel) -> Executor:
    """An executor whose steps take what ``cost_model`` says and sample nothing."""
    step_time_s = cost_model.step_time_s
    return lambda plan: StepResult(duration_s=step_time_s(plan))


def run_step(scheduler: Scheduler, executor: Executor) -> tuple[StepPlan, StepResult, StepEvents] | None:
    """Run one step; ``None`` when the scheduler has nothing to run now."""
    plan = scheduler.schedule()
    if plan.is_empty:
        return None
    result = executor(plan)
    events = scheduler.update_from_output(plan, result)
    return plan, result, events


def prompt_token_ids(
    prompt: str | None, token_ids: Sequence[int] | None, encode: Callable[[str], list[int]]
) -> list[int]:
    """A request's prompt as token ids: its text encoded, or the ids given (exactly one of the
    two; ValueError otherwise, or when the prompt is empty). Every engine's ``add_request``."""
    if (prompt is None) == (token_ids is None):
        raise ValueError("give exactly one of prompt or prompt_token_ids")
    ids = encode(prompt) if prompt is not None else list(token_ids or ())
    if not ids:
        raise ValueError("the prompt is empty")
    return ids


def queue_prompt(
    scheduler: Scheduler,
    request_id: str,
    ids: Sequence[int],
    params: SamplingParams,
    arrival_s: float,
    priority: int = 0,
) -> None:
    """Hand ``scheduler`` the request of prompt ``ids`` (prefix-cacheable by them); a ValueError
    saying why if it can never run."""
    request = Request(
        request_id,
        len(ids),
        params.max_tokens,
        arrival_s,
        params,
        PromptBlocks(tuple(ids)),
        priority=priority,
    )
    reason = scheduler.add_request(request)
    if reason is not None:
        raise ValueError(f"request {request_id} rejected: {reason}")
