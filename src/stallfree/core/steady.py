"""The simulator's fast path: how many steps in a row a plan repeats, and applying them at once.

Most simulated steps repeat the one before (the same decodes, one prompt chunk of the same size),
differing only in context length. :func:`steady_run` counts how many times a freshly scheduled
plan repeats before something other than time changes; :func:`apply_steady` applies that many
steps in one go. Invariant: the state afterwards equals scheduling and updating each step.
"""

from __future__ import annotations

from typing import Final

from stallfree.core.config import ceil_div
from stallfree.core.plan import StepPlan
from stallfree.core.policy import Policy, Steadiness
from stallfree.core.state import SchedulerState


class SteadyRun:
    """``num_steps`` repeats of a plan (this step included); ``ends_at_arrival``: an arrival
    would end the run sooner (the driver cuts it at the first step starting at or after it).
    Immutable (``Final`` attributes), a plain class: one is made every plan."""

    __slots__ = ("ends_at_arrival", "num_steps")

    def __init__(self, num_steps: int, ends_at_arrival: bool) -> None:
        self.num_steps: Final = num_steps
        self.ends_at_arrival: Final = ends_at_arrival


SINGLE_STEP = SteadyRun(1, False)


def steady_run(state: SchedulerState, policy: Policy, plan: StepPlan) -> SteadyRun:
    """How many steps in a row ``plan`` runs if nothing arrives; call right after scheduling it.

    The count stops at the step in which a request finishes, before any prompt chunk would reach
    its last token, and before the running requests would need more KV blocks than are free.
    A plan the policy says does not repeat (:meth:`Policy.steadiness`) runs once.
    """
    steadiness = policy.steadiness(plan, len(state.running))
    if steadiness is Steadiness.NONE or plan.preempted_request_ids:
        return SINGLE_STEP
    running = state.running_by_id
    num_steps = 1 << 62
    for chunk in plan.chunks:
        seq = running[chunk.request_id]
        if chunk.emits_token:
            # Only decodes may sample in a steady run; a one-token last prompt chunk looks
            # like a decode in the plan but makes the request decode from the next step on.
            if chunk.num_tokens != 1 or seq.num_output_tokens == 0:
                return SINGLE_STEP
            num_steps = min(num_steps, seq.request.max_tokens - seq.num_output_tokens)
        else:
            # Steps 1..k run without reaching the last token: u - k * c >= 1.
            num_steps = min(num_steps, (seq.num_uncomputed_tokens - 1) // chunk.num_tokens)
    if num_steps > 1 and state.block_manager.num_blocks is not None:
        num_steps = _steps_within_free_blocks(state, plan, num_steps)
    return SteadyRun(max(num_steps, 1), steadiness is Steadiness.UNTIL_ARRIVAL)


def _steps_within_free_blocks(state: SchedulerState, plan: StepPlan, num_steps: int) -> int:
    """The largest k <= num_steps whose steps 2..k find their new blocks free."""
    bm = state.block_manager
    free = bm.num_free_blocks or 0
    bs = bm.block_size
    # ceil((a + k c) / bs) - ceil((a + c) / bs) <= ceil((k - 1) c / bs): usually enough.
    if sum(ceil_div((num_steps - 1) * c.num_tokens, bs) for c in plan.chunks) <= free:
        return num_steps
    low, high = 1, num_steps  # _extra_blocks(1) == 0 <= free; find the largest k that fits
    while low < high:
        mid = (low + high + 1) // 2
        if _extra_blocks(plan, mid, bs) <= free:
            low = mid
        else:
            high = mid - 1
    return low


def _extra_blocks(plan: StepPlan, num_steps: int, block_size: int) -> int:
    """Blocks held after ``num_steps`` steps minus those held after the first (``context_len``
    is a chunk's context after its first step). A module function, not a closure: a compiled
    closure and its environment refer to each other, a cycle only the collector frees, and it
    would keep every plan it saw alive until then."""
    return sum(
        ceil_div(c.num_computed_tokens + num_steps * c.num_tokens, block_size)
        - ceil_div(c.context_len, block_size)
        for c in plan.chunks
    )


def apply_steady(state: SchedulerState, plan: StepPlan, num_steps: int) -> tuple[list[str], list[str]]:
    """Advance ``plan``'s requests by ``num_steps`` steps (at most :func:`steady_run`'s count).

    The blocks of steps 2.. are allocated here, not announced in a plan: for drivers whose
    executor keeps no block tables (the simulator). Returns the requests that got tokens (one per
    step each) and those that reached ``max_tokens``; the caller finishes the latter.
    """
    new_tokens: list[str] = []
    at_max_tokens: list[str] = []
    running = state.running_by_id
    bm = state.block_manager
    block_size = bm.block_size
    for chunk in plan.chunks:
        rid = chunk.request_id
        seq = running[rid]
        computed = seq.num_computed_tokens = chunk.num_computed_tokens + num_steps * chunk.num_tokens
        # It holds the blocks of its first step's context; grow only past them.
        if ceil_div(computed, block_size) > ceil_div(chunk.context_len, block_size):
            bm.allocate(rid, computed)
        state.cache_computed(seq, computed)
        if chunk.emits_token:
            seq.num_output_tokens += num_steps
            new_tokens.append(rid)
            if seq.num_output_tokens >= seq.request.max_tokens:
                at_max_tokens.append(rid)
    return new_tokens, at_max_tokens
