"""The loop body every driver shares: schedule, execute, update.

Drivers (the simulator's simulated clock, the engine's wall clock) call
:func:`run_step` repeatedly and own time and arrivals; this module owns
neither. Executors are plain callables, so tests pass a function.
"""

from __future__ import annotations

from collections.abc import Callable

from stallfree.core.plan import StepPlan, StepResult
from stallfree.core.scheduler import Scheduler, StepEvents

Executor = Callable[[StepPlan], StepResult]


def run_step(scheduler: Scheduler, executor: Executor) -> tuple[StepPlan, StepResult, StepEvents] | None:
    """Run one step; ``None`` when the scheduler has nothing to run now."""
    plan = scheduler.schedule()
    if plan.is_empty:
        return None
    result = executor(plan)
    events = scheduler.update_from_output(plan, result)
    return plan, result, events
