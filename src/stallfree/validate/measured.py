"""The measured side of a validation: the requests, and how they ran on a real engine.

Two sources, one :class:`MeasuredRun`:

- :func:`run_engine`: the options' workload through ``LLMEngine`` in process on the wall clock
  (:mod:`stallfree.validate.replay`), every step timed, then the profile's reference steps timed
  again on the idle engine (is this machine as fast as when it was profiled?);
- :func:`read_bench`: a ``stallfree bench --save-result`` file (its own requests and arrival
  times) and, with the server's ``--step-log`` of that run, the served steps.

Torch is imported only when the engine runs, so importing this module stays light.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from stallfree.core import Request, SamplingParams
from stallfree.core.serving import ServingConfig
from stallfree.core.step import TimedStep
from stallfree.costs.measured import MeasuredCostModel
from stallfree.metrics import ItlAccumulator, RequestRecord, summarize
from stallfree.validate.options import Sampling, ValidationOptions
from stallfree.validate.result import EnginePredictor, ReferenceStep, RunScores
from stallfree.workload.classes import RecordedClass, class_summaries

if TYPE_CHECKING:
    from stallfree.engine.engine import LLMEngine

SAMPLING_PARAMS: dict[Sampling, SamplingParams] = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=1.0),
    "top-p": SamplingParams(temperature=1.0, top_p=0.9),
}


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """The requests (ordered by arrival), their measured scores, the configuration they ran with
    (in process: the engine's KV blocks and context length filled in), every step timed (None: a
    bench result without a step log), and, in process, the machine check and a time budget's
    engine predictor; ``classes``: a classes run's traffic classes, scored on each side."""

    requests: tuple[Request, ...]
    scores: RunScores
    serving: ServingConfig
    steps: tuple[TimedStep, ...] | None
    machine: tuple[ReferenceStep, ...] | None = None
    engine_predictor: EnginePredictor | None = None
    classes: tuple[RecordedClass, ...] = ()


def measure(options: ValidationOptions, serving: ServingConfig, model: MeasuredCostModel) -> MeasuredRun:
    """The measured side as ``options`` say: a bench result's, or the engine's in process."""
    if options.measured is not None:
        return read_bench(options.measured, options.step_log, serving)
    return run_engine(options, serving, model)


def read_bench(path: str, step_log: str | None, serving: ServingConfig) -> MeasuredRun:
    """A bench result's requests and measurements; with ``step_log``, the served steps."""
    from stallfree.workload.bench_result import load_bench_result

    bench = load_bench_result(path)
    steps = None
    if step_log is not None:
        from stallfree.server.step_log import load_step_log

        steps = tuple(load_step_log(step_log))
    requests = tuple(bench.arrays.iter_requests())
    scores = _scores(bench.records, bench.itl, bench.duration_s, _fleet_hit_rate(bench.data))
    if bench.classes:
        per_class = class_summaries(
            bench.classes, bench.class_of, bench.records, bench.class_itl, bench.duration_s
        )
        scores = replace(scores, classes=per_class)
    return MeasuredRun(requests, scores, serving, steps, classes=bench.classes)


def _fleet_hit_rate(data: Mapping[str, Any]) -> float | None:
    """The prefix cache's hit rate over a run's replicas, from the counters bench scraped from each
    one's /metrics behind a router (None: not a fleet, or a replica's counters missing)."""
    replicas = (data.get("fleet") or {}).get("replicas") or []
    counters = [r["counters"] for r in replicas]
    if not counters or any(c is None for c in counters):
        return None
    queried = sum(c["prefix_cache_queries"] for c in counters)
    return sum(c["prefix_cache_hits"] for c in counters) / queried if queried else None


def run_engine(options: ValidationOptions, serving: ServingConfig, model: MeasuredCostModel) -> MeasuredRun:
    """The workload through ``LLMEngine`` on the wall clock (the engine is dropped on return: its
    weights and KV cache are not needed for the simulation)."""
    from tqdm import tqdm

    from stallfree.engine.engine import LLMEngine
    from stallfree.validate.replay import replay
    from stallfree.workload import WorkloadOptions, sample, workload_from_options

    fp = model.profile.fingerprint
    workload = workload_from_options(
        WorkloadOptions(
            arrival="poisson" if options.burstiness is None else "gamma",
            qps=options.qps,
            burstiness=options.burstiness,
            lengths=options.lengths,
            turns=options.turns,
            system_prompt_tokens=options.system_prompt_tokens,
            think_time_s=options.think_time_s,
        )
    )
    requests = tuple(sample(workload, options.num_requests, options.seed).iter_requests())
    engine = LLMEngine(
        options.model or str(fp.get("model")),
        dtype=options.dtype or str(fp.get("dtype", "auto")),
        quantization=None if options.dtype else profiled_quantization(fp),
        device=options.device or fp.get("device"),
        serving=serving,
        seed=options.seed,
        step_time_predictor=model.step_time_s if serving.step_budget_ms is not None else None,
        adapt_threads=False,  # as the profile measured it: a fixed pool
    )
    _warm_up(engine)
    state = engine.scheduler.state
    queried, hits = state.num_prefix_queried_tokens, state.num_prefix_hit_tokens
    bar = tqdm(
        total=len(requests), disable=not options.progress, unit="req", file=sys.stderr, desc=serving.policy
    )
    with bar:
        run = replay(
            engine,
            requests,
            sampling=SAMPLING_PARAMS[options.sampling_mode],
            seed=options.seed,
            on_finish=bar.update,
        )
    machine = _machine(model, engine)
    predictor = None
    if engine.predictor is not None and engine.step_budget_stats is not None:
        # what the engine planned by: the profile scaled by measured / predicted (CalibratedPredictor)
        predictor = EnginePredictor(
            final_scale=engine.predictor.scale,
            mean_abs_error=engine.step_budget_stats.mean_prediction_error,
        )
    ran = replace(
        serving, num_blocks=engine.model_runner.kv_cache.num_blocks, max_model_len=engine.max_model_len
    )
    hit_rate = None
    if serving.enable_prefix_caching:  # the simulator's counters, on the engine's scheduler
        queried = state.num_prefix_queried_tokens - queried
        hit_rate = (state.num_prefix_hit_tokens - hits) / queried if queried else None
    scores = _scores(run.records, run.itl, run.duration_s, hit_rate)
    return MeasuredRun(requests, scores, ran, tuple(run.steps), machine, predictor)


def _scores(
    records: Iterable[RequestRecord], itl: ItlAccumulator, duration_s: float, hit_rate: float | None = None
) -> RunScores:
    """The metrics' summary, its longest gap exact (the ITL samples are rounded), and the prefix
    cache's hit rate where it is known."""
    records = list(records)
    summary = summarize(records, itl, duration_s)
    summary["max_itl_ms"] = max((r.max_itl_s for r in records if r.is_completed), default=0.0) * 1000
    summary["prefix_cache_hit_rate"] = hit_rate
    return RunScores.of(summary, records, itl)


def profiled_quantization(fingerprint: Mapping[str, Any]) -> str | None:
    """The matmul weights' format the profile ran (its ``quantization``; a profile older than that
    field says it in ``linear``: ``bf16`` / ``q8_0`` panels, with or without ``-dot``)."""
    if "quantization" in fingerprint:
        return cast("str | None", fingerprint["quantization"])
    kind = str(fingerprint.get("linear", "")).removesuffix("-dot")
    return kind if kind in ("bf16", "q8_0") else None


def _warm_up(engine: LLMEngine) -> None:
    """A few steps before the clock starts: the first calls of each kernel are slow."""
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for n in (8, 64):
        engine.add_request(f"warm-up-{n}", prompt_token_ids=[5] * n, sampling_params=params)
    while engine.has_unfinished_requests():
        engine.step()


def _machine(model: MeasuredCostModel, engine: LLMEngine) -> tuple[ReferenceStep, ...] | None:
    """The profile's reference steps (``stallfree profile`` times them throughout): each one's
    median when profiled, and its time again on the idle engine after the run. Is this machine as
    fast now, for memory-bound (decode) and compute-bound (prompt) steps?"""
    from stallfree.engine.profiler import reference_times_s
    from stallfree.specs.step_profile import REFERENCES

    settings = model.profile.settings
    if not settings.get("reference_step_s") or engine.has_unfinished_requests():
        return None
    engine.model_runner.reset()  # the last finished requests' tables (the scheduler freed their blocks)
    try:
        now = reference_times_s(engine.model_runner, int(settings.get("max_num_seqs", 16)), 5)
    except ValueError:  # a cache sized for this run's fewer sequences cannot hold the reference step
        return None  # the run is kept; only the machine check is left out
    return tuple(
        ReferenceStep(kind, float(statistics.median(settings[key])), now[kind])
        for key, kind in REFERENCES.items()
        if settings.get(key)
    )
