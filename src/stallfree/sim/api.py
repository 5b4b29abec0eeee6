"""The Python API of ``stallfree simulate``: names and numbers in, a :class:`SimulationResult` out.

:func:`simulate` builds what the command line builds (model and hardware specs, a cost model,
KV capacity from memory, a scheduler with one policy) and runs a workload through
:func:`~stallfree.sim.traffic.run_traffic`. Every argument mirrors a command-line option.
:func:`auto_cost_model` is what ``cost_model="auto"`` (the default of ``simulate``, ``tune`` and
``sweep`` on the command line) picks: the most accurate model available for the hardware.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from stallfree.core import ChunkedPolicy, Request, Scheduler
from stallfree.core.serving import ServingConfig
from stallfree.metrics import ItlAccumulator, RequestRecord, summarize
from stallfree.sim.cost_model import CostModel, CostModelConfig, CostModelKind
from stallfree.sim.gpu_measured import GpuMeasuredCostModel, gpu_family
from stallfree.sim.measured import MeasuredCostModel, VariedSteps
from stallfree.sim.memory import KvMemory, fixed_kv_memory, kv_memory
from stallfree.sim.traffic import SteadyCostModel, StepTrace, run_traffic
from stallfree.specs import (
    HARDWARE_PRESETS,
    HardwareSpec,
    ModelSpec,
    load_hardware_spec,
    load_model_spec,
)
from stallfree.specs.step_profile import StepProfile, load_profile
from stallfree.workload import Workload, WorkloadArrays, sample


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """One policy's run. ``summary`` has vLLM's benchmark keys plus ours (see :func:`simulate`).
    ``partial``: stopped early (``simulate``'s ``stop``); then it covers what was done by then."""

    policy: str
    summary: dict[str, Any]
    records: list[RequestRecord]
    itl: ItlAccumulator
    kv: KvMemory
    steps: StepTrace | None
    partial: bool = False


def simulate(
    workload: Workload | WorkloadArrays | Iterable[Request],
    *,
    model: str | ModelSpec | None = None,
    hardware: str | HardwareSpec = "a100-80gb",
    tp: int = 1,
    cost_model: CostModelKind | Literal["measured", "auto"] = "full",
    profile: str | StepProfile | MeasuredCostModel | None = None,
    sampling: str = "greedy",
    dtype_bytes: int | None = None,
    step_overhead_s: float = 0.0,
    serving: ServingConfig | None = None,
    gpu_memory_utilization: float = 0.9,
    num_requests: int | None = None,
    seed: int = 0,
    goodput: Mapping[str, float] | None = None,
    keep_steps: bool = False,
    fast: bool = True,
    step_noise: bool = False,
    step_scales: tuple[float, float] | None = None,
    stop: Callable[[], bool] | None = None,
) -> SimulationResult:
    """Simulate ``workload`` served as ``serving`` says on ``tp`` x ``hardware`` running ``model``.

    ``workload``: a :class:`~stallfree.workload.Workload` (sampled with ``num_requests`` and
    ``seed``), sampled :class:`~stallfree.workload.WorkloadArrays`, or requests ordered by arrival.
    ``serving`` is the scheduling configuration (default: chunked at
    :data:`~stallfree.core.DEFAULT_TOKEN_BUDGET` tokens per step); its ``max_model_len``
    defaults to the model's ``max_position_embeddings`` and its ``num_blocks`` to what fits. ``step_overhead_s`` is added to every
    step (scheduling, sampling, kernel launches: what a roofline leaves out). ``goodput`` maps ``ttft`` / ``tpot`` /
    ``e2el`` to SLOs in ms. ``fast=False`` schedules every step (the reference the fast path equals).
    ``step_noise`` (a profile's model only) multiplies each step's time by a factor drawn with
    ``seed`` from how the profiled machine's steps varied; ``step_scales`` (decode-only, with
    prompt tokens) multiplies the steps of each kind (:class:`~stallfree.sim.measured.VariedSteps`).

    ``cost_model="measured"`` (implied by ``profile``) prices steps from a step profile of the
    real engine (:class:`~stallfree.sim.measured.MeasuredCostModel`; ``sampling`` is the mode
    every sampled row pays: greedy, temperature or top-p), and ``model`` defaults to the
    profiled one (otherwise ``llama-3-8b``). With no ``profile`` and a GPU ``hardware`` preset
    (``a100-*``, ``h100-*``, ``a40``), ``measured`` prices steps from Vidur's measured operator
    tables shipped with stallfree (:class:`~stallfree.sim.gpu_measured.GpuMeasuredCostModel`).
    ``cost_model="auto"`` picks as :func:`auto_cost_model` says (``measured`` with a ``profile``
    or on a GPU preset with a shipped table, else ``full``); the default here stays ``full``, the
    command line's is ``auto``. ``dtype_bytes`` sizes weights and KV (default 2, or
    the profile's). ``serving.num_blocks`` fixes the KV cache instead of sizing it from ``hardware``;
    with a ``profile`` (an engine's, not ``hardware``'s) it defaults to what the engine allocates where
    memory allows: ``max_num_seqs`` full ``max_model_len`` contexts.

    The summary holds :func:`stallfree.metrics.summarize`'s keys plus ``policy``, ``num_steps``,
    ``max_step_ms``, ``num_kv_blocks``, ``kv_block_size`` and ``rejected_reasons`` (reason ->
    count). ``serving.step_budget_ms`` sizes chunked steps by time with the cost model as the
    step-time predictor; the summary then adds ``step_budget_ms``, ``num_steps_over_budget``
    (steps that took longer), ``num_guarded_steps`` (steps whose first prompt got the 16-token
    starvation guard past the target) and ``num_decode_overruns`` (of those, steps whose decodes
    alone were over it).

    ``stop`` (a Ctrl-C's flag, say) is asked between steps; once it returns True the run ends
    there and the result is ``partial``: the records of the requests finished by then (the rest
    left out), the summary of those over the simulated time so far, with ITL samples of every
    gap simulated so far (requests still in flight included) and the steps run.
    """
    hardware_spec = load_hardware_spec(hardware) if isinstance(hardware, str) else hardware
    if cost_model == "auto":
        cost_model = auto_cost_model(hardware_spec, profile=profile)[0]
    costs: SteadyCostModel
    if profile is None and cost_model == "measured" and gpu_family(hardware_spec.name) is not None:
        # a GPU preset: Vidur's measured operator tables, shipped (sim/gpu_measured.py)
        model_spec = _model_spec("llama-3-8b" if model is None else model)
        dtype_bytes = 2 if dtype_bytes is None else dtype_bytes
        costs = GpuMeasuredCostModel(
            model_spec, hardware_spec, tp=tp, dtype_bytes=dtype_bytes, overhead_s=step_overhead_s
        )
    elif profile is not None or cost_model == "measured":
        if profile is None:
            raise ValueError(
                "cost_model 'measured' needs a profile (a stallfree profile file) or a GPU preset "
                f"with a shipped table (a100-*, h100-*, a40); {hardware_spec.name} has none"
            )
        measured = (
            profile
            if isinstance(profile, MeasuredCostModel)
            else MeasuredCostModel(
                load_profile(profile) if isinstance(profile, str) else profile,
                sampling=sampling,
                overhead_s=step_overhead_s,
            )
        )
        profiled = model is None or model == measured.profile.fingerprint.get("model")
        model_spec = measured.model_spec() if profiled else _model_spec(model)  # type: ignore[arg-type]
        dtype_bytes = measured.dtype_bytes if dtype_bytes is None else dtype_bytes
        costs = measured
    else:
        model_spec = _model_spec("llama-3-8b" if model is None else model)
        dtype_bytes = 2 if dtype_bytes is None else dtype_bytes
        costs = CostModel(
            CostModelConfig(
                model_spec,
                hardware_spec,
                tp=tp,
                dtype_bytes=dtype_bytes,
                kind=cost_model,
                overhead_s=step_overhead_s,
            )
        )
    serving = serving or ServingConfig()
    context = model_spec.max_position_embeddings
    num_blocks = serving.num_blocks
    if num_blocks is None and isinstance(costs, MeasuredCostModel):
        # A profile is of an engine, not of ``hardware``: its KV cache as the engine sizes it
        # where memory allows (max_num_seqs full contexts, as LLMEngine caps its cache).
        num_blocks = serving.full_contexts_num_blocks(context)
    if num_blocks is not None:
        kv = fixed_kv_memory(
            model_spec, num_blocks, tp=tp, block_size=serving.block_size, dtype_bytes=dtype_bytes
        )
    else:
        kv = kv_memory(
            model_spec,
            hardware_spec,
            tp=tp,
            gpu_memory_utilization=gpu_memory_utilization,
            block_size=serving.block_size,
            dtype_bytes=dtype_bytes,
            max_num_batched_tokens=serving.step_token_cap(context),
            max_num_seqs=serving.num_seqs_limit,
        )
    # The cost model is the step-time predictor of a time-budgeted policy (unused otherwise).
    scheduler = serving.make_scheduler(context, kv.num_blocks, predictor=costs.step_time_s)
    if step_noise or step_scales is not None:
        if not isinstance(costs, MeasuredCostModel):
            raise ValueError(
                "step_noise and step_scales need a profile's model (how the profiled machine's steps ran)"
            )
        decode, prompt = step_scales or (1.0, 1.0)
        noise = costs.step_noise() if step_noise else None
        costs = VariedSteps(costs, decode=decode, prompt=prompt, noise=noise, seed=seed)
    run = run_traffic(
        scheduler,
        costs,
        _requests(workload, num_requests, seed),
        fast=fast,
        keep_steps=keep_steps,
        step_budget_s=serving.step_budget_s,
        stop=stop,
    )
    if not run.records and not run.stopped:
        raise ValueError("no request could run: the workload is empty")
    # Every request rejected is a result (nulls and the rejections), whenever they arrived: a
    # lone request or all-at-once arrivals give a zero duration, later arrivals a positive one.
    scores = summarize(run.records, run.itl, run.duration_s, goodput)
    summary: dict[str, Any] = {
        "policy": serving.policy,
        **scores,
        # exact, where the ITL samples are rounded to 16 significant bits (None without a gap)
        "max_itl_ms": max((r.max_itl_s for r in run.records), default=0.0) * 1000
        if scores["max_itl_ms"] is not None
        else None,
        "num_steps": run.num_steps,
        "max_step_ms": run.max_step_s * 1000,
        **_step_budget_summary(serving, scheduler, run.num_steps_over_budget),
        "num_kv_blocks": kv.num_blocks,
        "kv_block_size": serving.block_size,
        "rejected_reasons": run.rejected_reasons,
    }
    return SimulationResult(serving.policy, summary, run.records, run.itl, kv, run.steps, run.stopped)


def auto_cost_model(
    hardware: str | HardwareSpec,
    *,
    model: str | ModelSpec | None = None,
    tp: int = 1,
    profile: str | StepProfile | MeasuredCostModel | None = None,
) -> tuple[Literal["measured", "full"], str]:
    """The most accurate cost model available for ``hardware``, and why, in a few words.

    ``measured`` from ``profile`` when one is given; ``measured`` from Vidur's shipped tables when
    ``hardware`` is a GPU preset that :func:`~stallfree.sim.gpu_measured.gpu_family` knows
    (``a100-*``, ``h100-*``; a hardware file or spec counts only if it equals the preset in every
    field); otherwise ``full``. With ``model``, a borrowed efficiency curve (no table of the
    model's own layer shape at ``tp``) is named in the reason.
    """
    if profile is not None:
        return "measured", f"profile {profile}" if isinstance(profile, str) else "the given profile"
    spec = load_hardware_spec(hardware) if isinstance(hardware, str) else hardware
    family = gpu_family(spec.name) if HARDWARE_PRESETS.get(spec.name) == spec else None
    if family is None:
        return "full", f"no measured table for {spec.name}"
    why = f"Vidur's {family.upper()} tables"
    if model is not None:
        try:
            gpu = GpuMeasuredCostModel(_model_spec(model), spec, tp=tp)
        except ValueError:
            return "measured", why  # the run itself says what is wrong with the pair
        if not gpu.measured:
            why += f", {gpu.table_model}'s curve"
    return "measured", why


def _step_budget_summary(serving: ServingConfig, scheduler: Scheduler, num_over: int) -> dict[str, Any]:
    """A time-budgeted run's step-time target and what missed it (nothing without a budget)."""
    policy = scheduler.policy
    if serving.step_budget_ms is None or not isinstance(policy, ChunkedPolicy):
        return {}
    return {
        "step_budget_ms": serving.step_budget_ms,
        "num_steps_over_budget": num_over,
        "num_guarded_steps": policy.num_guarded_steps,
        "num_decode_overruns": policy.num_decode_overruns,
    }


def _model_spec(model: str | ModelSpec) -> ModelSpec:
    return load_model_spec(model) if isinstance(model, str) else model


def _requests(
    workload: Workload | WorkloadArrays | Iterable[Request], num_requests: int | None, seed: int
) -> Iterable[Request]:
    if isinstance(workload, Workload):
        return sample(workload, num_requests, seed).iter_requests()
    if isinstance(workload, WorkloadArrays):
        return workload.iter_requests()
    return sorted(workload, key=lambda r: r.arrival_time_s)
