"""Run timed requests through :class:`LLMEngine` on the wall clock, keeping every step.

The engine as a participant of the simulator's one driver (:func:`~stallfree.sim.driver.drive`)
on a :class:`~stallfree.sim.driver.WallClock`, for ``stallfree validate``: each
:class:`~stallfree.core.Request` is added when the wall clock passes its ``arrival_time_s``
(checked between steps, as the simulator checks its clock), steps run back to back while
anything is unfinished, and the driver sleeps until the next arrival when nothing is. Every
step's plan and wall time (the whole ``LLMEngine.step`` call) are kept, and every token's
time, so the run is scored by the same metrics code as a simulated one.

Prompts are random token ids (seeded) of the requested length; outputs run to ``max_tokens``
(``ignore_eos``), so the token counts are exactly the simulator's. A request whose
``prompt_blocks`` name its tokens (a multi-turn session's) gets one random token per distinct
id, so equal ids are equal tokens and the engine's prefix cache sees the sharing the simulator
sees; ids naming an earlier request's answer stand for the tokens the engine generated there,
where that request has finished by the time this one arrives (else they stay random, and miss).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stallfree.core import Request, SamplingParams
from stallfree.core.step import TimedStep
from stallfree.engine.engine import LLMEngine
from stallfree.metrics import ItlAccumulator, RequestRecord, record_from_token_times
from stallfree.sim.driver import WallClock, drive

FIRST_TOKEN_ID = 3  # ids below are special tokens of the random tokenizer


@dataclass(slots=True)
class ReplayRun:
    records: list[RequestRecord]
    itl: ItlAccumulator
    duration_s: float
    steps: list[TimedStep] = field(default_factory=list)


class EngineReplica:
    """An :class:`LLMEngine` on the wall clock, keeping every step and token time: a participant
    of :func:`~stallfree.sim.driver.drive`."""

    def __init__(
        self,
        engine: LLMEngine,
        clock: WallClock,
        template: SamplingParams,
        seed: int,
        on_finish: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self._clock = clock
        self._template = template
        self._tokens = _Tokens(random.Random(seed), engine.model.spec.vocab_size)
        self.requests: dict[str, Request] = {}
        self.token_times: dict[str, list[float]] = {}
        self.first_scheduled: dict[str, float] = {}
        self.finish_reason: dict[str, str] = {}
        self.steps: list[TimedStep] = []
        self.on_finish = on_finish

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def add_request(self, request: Request, now_s: float) -> None:
        self.requests[request.request_id] = request
        self.token_times[request.request_id] = []
        params = _with_max_tokens(self._template, request.max_tokens)
        self.engine.add_request(
            request.request_id, prompt_token_ids=self._tokens.prompt(request), sampling_params=params
        )

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        """Run a step now: its end is when the call returns."""
        if not self.engine.has_unfinished_requests():
            return None
        step_start = self._clock.now()
        out = self.engine.step()
        step_end = self._clock.now()
        if out.step is None:  # nothing schedulable: look again after a moment
            return step_end + 0.001
        self.steps.append(TimedStep(out.step.plan, step_start, step_end, out.step.result.duration_s))
        for chunk in out.step.plan.chunks:
            self.first_scheduled.setdefault(chunk.request_id, step_start)
        for output in out.outputs:
            self.token_times[output.request_id].append(step_end)
            if output.finish_reason is not None:
                self.finish_reason[output.request_id] = output.finish_reason
                self._tokens.answered(self.requests[output.request_id], output.token_ids)
                if self.on_finish is not None:
                    self.on_finish()
        return step_end

    def cut(self, at_s: float) -> float | None:
        return None  # one replica: never cut

    def finish_step(self) -> None:
        """Nothing left: the engine applied its step before it returned."""


def replay(
    engine: LLMEngine,
    requests: Sequence[Request],
    *,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    on_finish: Callable[[], None] | None = None,
) -> ReplayRun:
    """Serve ``requests`` (any order; sorted by arrival) on the wall clock; the clock starts at 0.

    ``sampling`` is every request's template (its ``max_tokens`` is replaced by the request's;
    default greedy). Returns records in arrival order, every ITL, and every step.
    """
    ordered = sorted(requests, key=lambda r: r.arrival_time_s)
    clock = WallClock()
    replica = EngineReplica(engine, clock, sampling or SamplingParams(temperature=0.0), seed, on_finish)
    drive(clock, ordered, [replica])
    duration = clock.now()
    itl = ItlAccumulator()
    records = [
        record_from_token_times(
            request_id=r.request_id,
            arrival_s=r.arrival_time_s,
            token_times_s=replica.token_times[r.request_id],
            num_prompt_tokens=r.num_prompt_tokens,
            itl=itl,
            finish_reason=replica.finish_reason.get(r.request_id, "failed"),
            first_scheduled_s=replica.first_scheduled.get(r.request_id),
        )
        for r in ordered
    ]
    return ReplayRun(records, itl, duration, replica.steps)


class _Tokens:
    """The token ids of each request's prompt: random, one per distinct id where its
    ``prompt_blocks`` name them, an earlier answer's where the ids name it (see the module)."""

    def __init__(self, rng: random.Random, vocab_size: int) -> None:
        self._rng = rng
        self._vocab = vocab_size
        self._of_id: dict[tuple[int, int], int] = {}

    def _random(self) -> int:
        return self._rng.randrange(FIRST_TOKEN_ID, self._vocab)

    def prompt(self, request: Request) -> list[int]:
        content, n = request.prompt_blocks, request.num_prompt_tokens
        if content is None:
            return [self._random() for _ in range(n)]
        per_id, of_id = content.tokens_per_id, self._of_id
        out = []
        for i in range(min(n, content.num_named_tokens)):
            key = (content.ids[i // per_id], i % per_id)
            token = of_id.get(key)
            if token is None:
                token = of_id[key] = self._random()
            out.append(token)
        return out + [self._random() for _ in range(n - len(out))]

    def answered(self, request: Request, token_ids: Sequence[int]) -> None:
        """``request`` generated ``token_ids``: the ids its content names for them mean those."""
        content = request.prompt_blocks
        if content is None or content.tokens_per_id != 1:
            return
        start = request.num_prompt_tokens
        for block_id, token_id in zip(content.ids[start : content.num_named_tokens], token_ids, strict=False):
            self._of_id[(block_id, 0)] = token_id


def _with_max_tokens(template: SamplingParams, max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=template.temperature,
        top_k=template.top_k,
        top_p=template.top_p,
        seed=template.seed,
        ignore_eos=True,
    )
