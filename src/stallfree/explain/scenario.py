"""The seed's scenario on one clock: N streams decoding, one long prompt arrives.

Both policies see the same arrival: the streams are prefilled (warm-up, cut
from the result), run ``lead_steps`` decode steps, then the prompt arrives at
a step boundary. With ``cached_prefix_tokens`` the prompt shares that prefix with earlier
traffic: a request with the same prefix runs in the warm-up and leaves its blocks in the prefix
cache, so only the prompt's new tail is computed (and chunked). The run ends ``tail_steps`` steps after the prompt's first
token. Step durations come from a :class:`StepTimer`: a cost model
(:mod:`.roofline`), or the real engine's measured steps with ``--engine torch`` (:mod:`.engine`). Gaps are the
other streams' inter-token times over the measured window: the ``lead_steps`` decode
steps before the arrival, the prompt, and ``tail_steps`` steps after its first token.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from stallfree.core import (
    DEFAULT_STEP_TOKEN_CAP,
    CacheConfig,
    Executor,
    Policy,
    PromptBlocks,
    Request,
    Scheduler,
    SchedulerConfig,
    StepTimePredictor,
    ceil_div,
    make_policy,
)
from stallfree.core.context import StepContext
from stallfree.core.plan import synthetic_plan
from stallfree.core.step import StepCostModel
from stallfree.sim.speculative import Acceptance, DraftVerifier
from stallfree.sim.timeline import Timeline, TimelineStep, simulate_timeline
from stallfree.workload.long_prompt import LongPrompt

PROMPT_ID = "prompt"
DEFAULT_SWEEP = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MAX_SCENARIO_WORK = 30_000_000  # see check_size


class StepTimer(StepCostModel, Protocol):
    """What explain runs on: a step cost model (``step_time_s``) plus what a run needs.

    :class:`~stallfree.explain.roofline.RooflineTimer` prices steps with a cost model;
    :class:`~stallfree.explain.engine.EngineTimer` runs them on the real engine.
    """

    def new_executor(self) -> Executor:
        """A fresh executor for one run (a real engine starts from an empty KV cache)."""
        ...

    def cache_config(self) -> CacheConfig:
        """The KV cache runs use (unbounded for the roofline, the real cache for an engine)."""
        ...

    def ridge_tokens(self, num_seqs: int, context_len: int) -> float:
        """Prompt tokens a step of ``num_seqs`` decodes carries almost free."""
        ...


class _WarmUp(Policy):
    """Prefill every stream whole in the first step, then hand every later step to ``policy``."""

    name = "warm-up"

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.warm = False

    def check_config(self, config: SchedulerConfig) -> None:
        self.policy.check_config(config)

    def schedule(self, ctx: StepContext) -> None:
        if self.warm:
            self.policy.schedule(ctx)
            return
        self._admit_whole(ctx, None)
        self.warm = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario(LongPrompt):
    """The seed's experiment (:class:`~stallfree.workload.long_prompt.LongPrompt`) on one clock,
    with how the chunked policy cuts the prompt."""

    chunk_tokens: int = 256
    step_budget_s: float | None = None  # chunked sizes its chunks by this step-time target instead
    cached_prefix_tokens: int = 0  # the prompt's first tokens, already in the prefix cache
    # ... or in a tier below it (host memory, a shared store): loaded this long (while the streams
    # run) before the prompt reaches the scheduler; its TTFT counts the load
    cached_prefix_load_s: float = 0.0

    def __post_init__(self) -> None:
        super(Scenario, self).__post_init__()
        if self.chunk_tokens <= 0:
            raise ValueError(f"chunk-tokens must be positive, got {self.chunk_tokens}")
        if not 0 <= self.cached_prefix_tokens < self.prompt_tokens:
            raise ValueError(
                f"cached-prefix-tokens must be >= 0 and below the prompt's {self.prompt_tokens:,} tokens, "
                f"got {self.cached_prefix_tokens}"
            )
        if not 0 <= self.cached_prefix_load_s < float("inf") or (
            self.cached_prefix_load_s and not self.cached_prefix_tokens
        ):
            raise ValueError("a cached prefix's load time must be >= 0 s, and comes with a cached prefix")
        if self.step_budget_s is not None and not self.step_budget_s > 0:
            raise ValueError(f"step-budget-ms must be positive, got {self.step_budget_s * 1000}")

    def num_cached_tokens(self, block_size: int) -> int:
        """The prompt tokens the cache gives it: whole blocks of the cached prefix."""
        return self.cached_prefix_tokens // block_size * block_size

    @property
    def decoder_max_tokens(self) -> int:
        # One warm-up step, then every step after the arrival moves the prompt by >= 1
        # token, so the streams can never run out before the run ends.
        return self.prompt_tokens + self.lead_steps + self.tail_steps + 8


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One policy's run, times relative to the moment every stream is decoding."""

    policy: str
    steps: tuple[TimelineStep, ...]
    token_times_s: dict[str, tuple[float, ...]]
    arrival_s: float
    first_token_s: float
    gaps_s: tuple[float, ...]

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def max_gap_s(self) -> float:
        return max(self.gaps_s)

    @property
    def median_gap_s(self) -> float:
        return statistics.median(self.gaps_s)

    @property
    def stream_tokens_per_s(self) -> float:
        """A stream's tokens a second over the measured window (mean over the streams)."""
        streams = [ts for rid, ts in self.token_times_s.items() if rid.startswith("s")]
        return statistics.mean(len(ts) for ts in streams) / self.steps[-1].end_s

    def prompt_chunk_steps(self) -> list[TimelineStep]:
        """The steps that carried a chunk of the prompt, in order."""
        return [s for s in self.steps if any(rid == PROMPT_ID for rid, _ in s.tokens_by_request)]

    def prompt_chunk_tokens(self) -> list[int]:
        """The prompt's chunk sizes, step by step."""
        return [n for s in self.steps for rid, n in s.tokens_by_request if rid == PROMPT_ID]


def run_scenario(
    scenario: Scenario, policy: Policy, timer: StepTimer, drafts: DraftVerifier | None = None
) -> PolicyRun:
    """Warm up the streams, let the prompt arrive, stop ``tail_steps`` after its first token.

    The warm-up prefills every stream in one step whatever the policy (it is cut from the
    result); then ``policy`` schedules everything that is measured. ``drafts``: a policy that
    speculates has its drafts accepted by this model (on a priced timer).
    """
    config = SchedulerConfig(max_num_seqs=scenario.streams + 1)
    policy.check_config(config)
    warm_up = _WarmUp(policy)
    cached = scenario.cached_prefix_tokens
    cache = replace(timer.cache_config(), enable_prefix_caching=True) if cached else timer.cache_config()
    sched = Scheduler(config, cache, warm_up)
    executor = timer.new_executor()
    if drafts is not None:
        priced, verifier = executor, drafts
        executor = lambda plan: verifier.result(plan, priced(plan).duration_s + verifier.drafting_s(plan))  # noqa: E731
    most = scenario.decoder_max_tokens * (1 + (drafts.num_speculative_tokens if drafts else 0))
    streams = [Request(f"s{i}", scenario.context_tokens, most) for i in range(scenario.streams)]
    ids = [r.request_id for r in streams]
    # Earlier traffic left the prompt's prefix in the cache: a request that shares it runs (and
    # leaves) in the warm-up, its blocks freed but still cached when the prompt arrives.
    prefix = PromptBlocks((*range(cached), -1)) if cached else None
    earlier = [Request("earlier", cached + 1, 1, prompt_blocks=prefix)] if cached else []
    tl = simulate_timeline(
        sched, executor, [*streams, *earlier], stop=lambda t: True
    )  # one prefill-first step
    if len(tl.token_times_s) < len(ids):
        raise ValueError(
            f"the KV cache cannot hold {scenario.streams} streams of {scenario.context_tokens} tokens"
        )
    origin_s, warmup_steps = tl.end_s, len(tl.steps)
    tl = simulate_timeline(
        sched,
        executor,
        [],
        start_s=origin_s,
        timeline=tl,
        stop=lambda t: len(t.steps) - warmup_steps >= scenario.lead_steps,
    )
    arrival_s = tl.end_s
    content = PromptBlocks((*range(cached), *range(-2, -2 - scenario.prompt_tokens + cached, -1)))
    prompt = Request(
        PROMPT_ID,
        scenario.prompt_tokens,
        1,
        arrival_time_s=arrival_s + scenario.cached_prefix_load_s,
        prompt_blocks=content if cached else None,
    )

    def done(t: Timeline) -> bool:
        first = t.token_times_s.get(PROMPT_ID)
        return first is not None and sum(1 for s in t.steps if s.start_s >= first[0]) >= scenario.tail_steps

    tl = simulate_timeline(sched, executor, [prompt], start_s=arrival_s, timeline=tl, stop=done)
    steps = tuple(
        TimelineStep(
            s.start_s - origin_s, s.duration_s, s.num_decode_tokens, s.num_prefill_tokens, s.tokens_by_request
        )
        for s in tl.steps[warmup_steps:]
    )
    times = {rid: tuple(t - origin_s for t in ts if t > origin_s) for rid, ts in tl.token_times_s.items()}
    # gaps between a stream's deliveries (the tokens of accepted drafts come together)
    gaps = tuple(b - a for rid in ids for a, b in itertools.pairwise(dict.fromkeys(times[rid])))
    return PolicyRun(policy.name, steps, times, arrival_s - origin_s, times[PROMPT_ID][0], gaps)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    chunk_tokens: int
    max_gap_s: float
    ttft_s: float
    ttft_vs_alone: float


@dataclass(frozen=True, slots=True)
class DraftPoint:
    """The seed's arrival with ``num_speculative_tokens`` drafts a stream, under vLLM's rule at
    one token budget: what the streams gain and the prompt pays."""

    num_speculative_tokens: int
    stream_tokens_per_s: float
    max_gap_s: float
    ttft_s: float
    prompt_tokens_per_step: float


@dataclass(frozen=True, slots=True)
class Speculation:
    """Speculative decoding in the scenario: up to ``num_speculative_tokens`` drafts a stream,
    accepted as ``acceptance`` says, in steps of ``token_budget`` tokens (the chunked run's size:
    the streams plus its chunk); ``sweep`` moves the budget from the prompt to the drafts."""

    num_speculative_tokens: int
    acceptance: Acceptance
    token_budget: int
    sweep: tuple[DraftPoint, ...]


@dataclass(frozen=True, slots=True)
class Explanation:
    """Everything ``stallfree explain`` prints, plots and emits as JSON."""

    scenario: dict[str, Any]
    ridge_tokens: float
    decode_step_s: float
    prefill_alone_s: float
    runs: dict[str, PolicyRun]
    sweep: tuple[SweepPoint, ...]
    warnings: tuple[str, ...] = ()  # what a real deployment could not run as shown
    # The same scenario priced by a cost model, beside a measured run (explain --engine torch --profile)
    predicted: dict[str, PolicyRun] | None = None
    speculation: Speculation | None = None
    disaggregated: dict[str, Any] | None = (
        None  # the prompt on prefill GPUs, its KV shipped (disaggregate.py)
    )

    def to_json(self) -> dict[str, Any]:
        chunked = self.runs["chunked"].prompt_chunk_steps()
        budget_s = self.scenario.get("step_budget_s")
        return {
            "scenario": self.scenario,
            "warnings": list(self.warnings),
            "ridge_tokens": self.ridge_tokens,
            "decode_step_s": self.decode_step_s,
            "prefill_alone_s": self.prefill_alone_s,
            "policies": {
                name: {
                    "max_gap_s": run.max_gap_s,
                    "median_gap_s": run.median_gap_s,
                    "ttft_s": run.ttft_s,
                    "ttft_vs_alone": run.ttft_s / self.prefill_alone_s,
                    **({} if self.speculation is None else {"stream_tokens_per_s": run.stream_tokens_per_s}),
                }
                for name, run in self.runs.items()
            },
            **({} if self.disaggregated is None else {"disaggregated": self.disaggregated}),
            **(
                {}
                if self.speculation is None
                else {
                    "speculative": {
                        "num_speculative_tokens": self.speculation.num_speculative_tokens,
                        **self.speculation.acceptance.describe(),
                        "token_budget": self.speculation.token_budget,
                        "sweep": [asdict(p) for p in self.speculation.sweep],
                    }
                }
            ),
            "prompt_chunks": {
                "num_steps": len(chunked),
                "first_step_s": chunked[0].duration_s,
                "last_step_s": chunked[-1].duration_s,
                "max_step_s": max(s.duration_s for s in chunked),
                "last_vs_first": chunked[-1].duration_s / chunked[0].duration_s,
                "chunk_tokens": self.runs["chunked"].prompt_chunk_tokens(),
                "step_s": [s.duration_s for s in chunked],
                "num_steps_over_budget": None
                if budget_s is None
                else sum(1 for s in chunked if s.duration_s > budget_s),
            },
            "sweep": [asdict(p) for p in self.sweep],
            "predicted": None
            if self.predicted is None
            else {
                name: {
                    key: {"measured": measured, "predicted": predicted, "ratio": predicted / measured}
                    for key, measured, predicted in (
                        ("max_gap_s", self.runs[name].max_gap_s, run.max_gap_s),
                        ("median_gap_s", self.runs[name].median_gap_s, run.median_gap_s),
                        ("ttft_s", self.runs[name].ttft_s, run.ttft_s),
                    )
                }
                for name, run in self.predicted.items()
            },
        }


def check_size(scenario: Scenario, block_size: int, sweep_chunks: Sequence[int]) -> None:
    """Refuse, at once, a scenario whose runs would take minutes to simulate.

    A run's cost is its streams' KV blocks and its steps' rows: ``streams x (context /
    block_size + steps)``, steps set by the smallest chunk. Past :data:`MAX_SCENARIO_WORK`
    (about 20 s of scheduling on a laptop core) the answer is an error, not a hang.
    """
    runs = 2 + len(sweep_chunks)
    steps = ceil_div(scenario.prompt_tokens, min([scenario.chunk_tokens, *sweep_chunks]))
    steps += scenario.lead_steps + scenario.tail_steps
    work = runs * (scenario.streams + 1) * (ceil_div(scenario.context_tokens, block_size) + steps)
    if work > MAX_SCENARIO_WORK:
        raise ValueError(
            f"this scenario is too large to simulate: {runs} runs x {scenario.streams + 1} sequences x "
            f"({scenario.context_tokens:,} context tokens / {block_size} + {steps:,} steps) = {work:,} "
            f"block and step rows, over the {MAX_SCENARIO_WORK:,} explain allows; use fewer streams, "
            "a shorter context or prompt, or larger chunks"
        )


def explain(
    scenario: Scenario,
    timer: StepTimer,
    sweep_chunks: Sequence[int] = DEFAULT_SWEEP,
    scenario_echo: dict[str, Any] | None = None,
    *,
    warnings: Sequence[str] = (),
    predictor: StepTimePredictor | None = None,
    speculation: tuple[int, Acceptance] | None = None,
) -> Explanation:
    """Run both policies and the chunk sweep on ``timer``.

    With ``scenario.step_budget_s`` the chunked run sizes its chunks by time: ``predictor``
    (default: ``timer.step_time_s``, right for a cost model; a real engine's timer runs the plan,
    so it needs a model's prediction) prices each candidate step. The sweep stays fixed chunks.

    ``speculation`` = (k, acceptance): the streams also verify up to k drafts a step, in steps as
    large as the chunked run's (streams + chunk): a run under vLLM's rule and one under SGLang's,
    and a sweep over 0..k drafts under vLLM's (a priced ``timer`` only).
    """
    check_size(scenario, timer.cache_config().block_size, sweep_chunks)
    cached = scenario.num_cached_tokens(timer.cache_config().block_size)
    alone = timer.step_time_s(synthetic_plan(0, 0, scenario.prompt_tokens - cached, cached))
    if scenario.step_budget_s is None:
        chunked = make_policy("chunked", chunk_tokens=scenario.chunk_tokens)
    else:
        chunked = make_policy(
            "chunked",
            token_budget=DEFAULT_STEP_TOKEN_CAP,
            step_budget_s=scenario.step_budget_s,
            predictor=predictor or timer.step_time_s,
        )
    runs = {
        "prefill-first": run_scenario(scenario, make_policy("prefill-first"), timer),
        "chunked": run_scenario(scenario, chunked, timer),
    }
    sweep = []
    for chunk in sweep_chunks:
        run = (
            runs["chunked"]  # already measured: on a real engine a run is seconds
            if chunk == scenario.chunk_tokens and scenario.step_budget_s is None
            else run_scenario(scenario, make_policy("chunked", chunk_tokens=chunk), timer)
        )
        sweep.append(SweepPoint(chunk, run.max_gap_s, run.ttft_s, run.ttft_s / alone))
    spec = None
    if speculation is not None:
        spec = _speculate(scenario, timer, runs, *speculation)
    fields = asdict(scenario)
    if not scenario.cached_prefix_load_s:
        del fields["cached_prefix_load_s"]  # a prefix in the GPU's cache: nothing to say
    echo = {**fields, **(scenario_echo or {})}
    return Explanation(
        scenario=echo,
        ridge_tokens=timer.ridge_tokens(scenario.streams, scenario.context_tokens),
        decode_step_s=timer.step_time_s(synthetic_plan(scenario.streams, scenario.context_tokens)),
        prefill_alone_s=alone,
        runs=runs,
        sweep=tuple(sweep),
        warnings=tuple(warnings),
        speculation=spec,
    )


def _speculate(
    scenario: Scenario, timer: StepTimer, runs: dict[str, PolicyRun], k: int, acceptance: Acceptance
) -> Speculation:
    """Add the drafted runs to ``runs`` (k drafts, vLLM's and SGLang's rules) and sweep 0..k."""
    if scenario.step_budget_s is not None:
        raise ValueError("--speculative-tokens does not combine with --step-budget-ms")
    budget = scenario.streams + scenario.chunk_tokens

    def run(num: int, rule: str) -> PolicyRun:
        policy = make_policy(
            "chunked", token_budget=budget, num_speculative_tokens=num, speculative_rule=rule
        )
        return run_scenario(scenario, policy, timer, DraftVerifier(acceptance, num) if num else None)

    for rule in ("vllm", "sglang"):
        runs[f"chunked + {k} drafts ({rule})"] = run(k, rule)
    points = []
    for num in range(k + 1):
        drafted = runs[f"chunked + {k} drafts (vllm)"] if num == k else run(num, "vllm")
        sizes = drafted.prompt_chunk_tokens()
        points.append(
            DraftPoint(
                num, drafted.stream_tokens_per_s, drafted.max_gap_s, drafted.ttft_s, statistics.mean(sizes)
            )
        )
    return Speculation(k, acceptance, budget, tuple(points))
