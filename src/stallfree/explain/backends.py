""":func:`run_explain`: :class:`ExplainOptions` -> the :class:`Explanation` ``stallfree explain``
prints and the page draws.

The options pick the clock that prices the scenario's steps: the roofline cost model, a
profile's measured model, or the real PyTorch engine (imported only then). What a real server
could not run as shown (past the model's context, past the KV cache) is said as warnings beside
the arithmetic; weights that cannot fit at all are refused. Bad input of any kind is a
``ValueError`` in the command line's words; nothing here prints.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from stallfree.core.config import ceil_div
from stallfree.explain.options import ExplainOptions
from stallfree.explain.scenario import Explanation, Scenario, StepTimer, explain

if TYPE_CHECKING:
    from stallfree.costs.measured import MeasuredCostModel
    from stallfree.costs.roofline import CostModel, CostModelConfig
    from stallfree.explain.roofline import PricedTimer, RooflineTimer
    from stallfree.specs import ModelSpec

MEM_UTILIZATION = 0.9  # as simulate's default --gpu-memory-utilization

_log = logging.getLogger(__name__)


def run_explain(options: ExplainOptions) -> Explanation:
    """Both policies and the chunk sweep for ``options``, on the clock they choose."""
    defaults = options.scenario_defaults
    model = options.model or defaults.model
    prompt = options.prompt_tokens or defaults.prompt_tokens
    context = options.context_tokens or defaults.context_tokens
    sweep = options.sweep_chunks
    roofline: RooflineTimer | None = None
    timer: StepTimer
    if options.is_priced_by_profile:
        timer, echo = _measured(options)
    elif options.is_priced_by_gpu_tables:
        timer, echo, roofline = _gpu_tables(options, model)
    elif options.engine == "roofline":
        roofline, echo = _roofline(options, model)
        timer = roofline
    else:
        timer, echo = _torch(options, model, prompt, context, sweep)
    chunk = options.chunk_tokens or defaults.chunk_tokens or echo.pop("auto_chunk_tokens", None)
    if chunk is None:
        chunk = int(timer.ridge_tokens(options.streams, context))
    budget_ms = options.step_budget_ms
    deployment = roofline.cost_model.config if roofline else None
    load_s = _prefix_load_s(options, deployment, echo)
    scenario = Scenario(
        prompt_tokens=prompt,
        streams=options.streams,
        context_tokens=context,
        chunk_tokens=chunk,
        step_budget_s=budget_ms / 1000 if budget_ms else None,
        cached_prefix_tokens=options.cached_prefix_tokens,
        cached_prefix_load_s=load_s,
    )
    warnings = _deployment_warnings(roofline.cost_model.config, scenario) if roofline else []
    if options.is_priced_by_gpu_tables:  # the roofline said what the deployment holds, not how fast
        roofline = None
    if options.is_priced_by_profile:  # a PricedTimer over the profile's measured model
        measured = cast("MeasuredCostModel", cast("PricedTimer", timer).cost_model)
        warnings += _beyond_the_profile(measured, prompt, chunk)
    if budget_ms:
        echo["step_budget_ms"] = budget_ms
    if options.engine != "torch" or options.profile is None:
        k = options.speculative_tokens
        drafts = (k, options.acceptance) if k else None
        result = explain(scenario, timer, sweep, echo, warnings=warnings, speculation=drafts)
        if options.disaggregate is None or deployment is None:
            return result
        from stallfree.costs.kv_transfer import kv_link
        from stallfree.explain.disaggregate import disaggregated

        row = disaggregated(
            options.disaggregate,
            timer,
            deployment.model,
            deployment.dtype_bytes,
            deployment.tp,
            kv_link(options.kv_link, deployment.hardware),
            streams=scenario.streams,
            context_tokens=scenario.context_tokens,
            prompt_tokens=scenario.prompt_tokens,
            prefill_alone_s=result.prefill_alone_s,
            decode_step_s=result.decode_step_s,
        )
        return replace(result, disaggregated=row)
    # A real run with a profile: the measured model plans a time budget's chunks, and prices the
    # same scenario beside the run (its error, in the same run).
    from stallfree.explain.roofline import PricedTimer

    cost = _profile_model(options.profile)
    echo["profile"] = options.profile
    run = explain(scenario, timer, sweep, echo, warnings=warnings, predictor=cost.step_time_s)
    priced = explain(scenario, PricedTimer(cost, cost.ridge_tokens), ())
    return replace(run, predicted=priced.runs)


def _prefix_load_s(
    options: ExplainOptions, deployment: CostModelConfig | None, echo: dict[str, Any]
) -> float:
    """How long the cached prefix takes to load from the tier ``--cached-prefix-link`` reaches (0:
    it is in the GPU's cache): its KV a GPU's share, over that GPU's link (a host preset, else a
    network one, or GB/s); said in ``echo``."""
    name = options.cached_prefix_link
    if name is None:
        return 0.0
    from stallfree.costs.kv_transfer import HOST_LINKS, kv_transfer, tier_link

    assert deployment is not None  # a priced GPU deployment (checked by the options)
    link = tier_link(name, host=name in HOST_LINKS)
    tp = deployment.tp  # each GPU loads its shard over its own link
    load = kv_transfer(
        deployment.model,
        options.cached_prefix_tokens,
        deployment.dtype_bytes,
        link,
        tp_prefill=tp,
        tp_decode=tp,
    )
    echo.update(cached_prefix_link=link.name, cached_prefix_gb_per_gpu=load.num_bytes / tp / 1e9)
    return load.wire_s


def _roofline(options: ExplainOptions, model_name: str) -> tuple[RooflineTimer, dict[str, Any]]:
    from stallfree.costs.choice import CostChoice, pick_cost_model
    from stallfree.explain.roofline import RooflineTimer

    # a roofline kind: "measured" went to _measured
    pick = pick_cost_model(
        CostChoice(
            options.cost_model,
            model_name,
            options.hardware,
            options.tp,
            expert_parallel=options.expert_parallel,
        )
    )
    cost = cast("CostModel", pick.pricer)
    model, hardware = pick.model, pick.hardware
    _check_weights_fit(cost.config)
    echo = {
        "model": model.name,
        "hardware": hardware.name,
        "tp": options.tp,
        "expert_parallel": options.expert_parallel,
        "cost_model": options.cost_model,
        "engine": "roofline",
    }
    if model.is_moe:
        echo["moe"] = _moe_note(model, options.streams, cost, options.tp if options.expert_parallel else 1)
    return RooflineTimer(cost), echo


def _moe_note(model: ModelSpec, streams: int, cost: CostModel, expert_gpus: int) -> str:
    """Why a mixture of experts' ridge lies far above a dense model's of the same size (and, with
    its experts split over ``expert_gpus`` GPUs, what the busiest of them reads)."""
    experts = model.moe_num_experts
    active = model.num_active_params / model.num_params
    ridge = cost.ridge_tokens()
    split = (
        f" (the busiest of {expert_gpus} GPUs holding {experts // expert_gpus} each: "
        f"{model.busiest_experts(streams, expert_gpus):.1f}, an even split "
        f"{model.expected_experts(streams) / expert_gpus:.1f})"
        if expert_gpus > 1
        else ""
    )
    return (
        f"{model.moe_experts_per_token} of {experts} experts a token ({active:.0%} of the weights): "
        f"{streams} decodes read {model.expected_experts(streams):.0f} of them a layer{split}, a "
        f"{ridge:,.0f}-token step {model.expected_experts(ridge):.0f}; compute catches up with the "
        f"read only there (a dense model: at ~{cost.dense_ridge_tokens():,.0f})"
    )


def _gpu_tables(options: ExplainOptions, model_name: str) -> tuple[StepTimer, dict[str, Any], RooflineTimer]:
    """Steps priced by measured GPU tables; the full roofline of the same deployment beside them,
    for what it holds (the KV cache, the weights)."""
    from stallfree.costs.choice import CostChoice, pick_cost_model
    from stallfree.explain.roofline import PricedTimer, RooflineTimer

    choice = CostChoice(
        "measured",
        model_name,
        options.hardware,
        options.tp,
        gpu_tables=options.gpu_tables,
        framework=options.framework,
        framework_version=options.framework_version,
        expert_parallel=options.expert_parallel,
    )
    pick = pick_cost_model(choice)
    full = pick_cost_model(
        CostChoice("full", pick.model, pick.hardware, options.tp, expert_parallel=options.expert_parallel)
    )
    _check_weights_fit(cast("CostModel", full.pricer).config)
    cost = pick.pricer
    echo = {
        "model": pick.model.name,
        "hardware": pick.hardware.name,
        "tp": options.tp,
        "expert_parallel": options.expert_parallel,
        "cost_model": pick.why,
        "engine": "measured GPU tables",
    }
    return (
        PricedTimer(cost, lambda n, c: cost.ridge_tokens()),
        echo,
        RooflineTimer(cast("CostModel", full.pricer)),
    )


def _measured(options: ExplainOptions) -> tuple[StepTimer, dict[str, Any]]:
    from stallfree.explain.roofline import PricedTimer

    path = options.profile
    if path is None:  # only a profile's options come here; said again for mypy
        raise ValueError("no profile")
    cost = _profile_model(path)
    fp = cost.profile.fingerprint
    echo = {
        "model": str(fp.get("model")),
        "hardware": f"{fp.get('device')} ({fp.get('device_name')})",
        "tp": 1,
        "cost_model": "measured",
        "profile": path,
        "engine": "measured profile",
    }
    return PricedTimer(cost, cost.ridge_tokens), echo


def _profile_model(path: str) -> MeasuredCostModel:
    """A profile's measured model: all explain prices by (no model spec needed, so profiles
    without a model_config work too)."""
    from stallfree.costs.measured import MeasuredCostModel

    return MeasuredCostModel.from_file(path)


def _beyond_the_profile(cost: MeasuredCostModel, prompt_tokens: int, chunk_tokens: int) -> list[str]:
    """What the profile never measured but the scenario prices: a prompt run whole in a step
    longer than any it timed (on a server that chunks at its budget it would not even run as one
    step), and chunks after earlier context where it timed none (a server profile's prompts each
    fit one step)."""
    warnings = []
    largest = max(sum(n for n, _, _ in p.chunks) for p in cost.profile.steps)
    if prompt_tokens > largest:
        budget = cost.profile.fingerprint.get("scheduler", {}).get("max_num_batched_tokens")
        server = f"; the server chunks prompts at its {budget}-token budget" if budget else ""
        warnings.append(
            f"the profile measured steps of at most {largest:,} prompt tokens: prefill-first's "
            f"{prompt_tokens:,}-token step is priced beyond them, by extrapolation{server}"
        )
    after_context = any(before > 0 for p in cost.profile.steps for _, before, _ in p.chunks)
    if chunk_tokens < prompt_tokens and not after_context:
        warnings.append(
            "the profile timed no chunk after earlier context (a server profile times whole prompts): "
            "the later chunks' attention is extrapolated from whole prompts (on vLLM it overpriced a "
            "chunked 2K prompt 1.4-1.9x, benchmarks/README.md)"
        )
    return warnings


def _check_weights_fit(config: CostModelConfig) -> None:
    """Refuse a deployment whose weights do not fit (as ``simulate`` does)."""
    model, hardware, tp = config.model, config.hardware, config.tp
    usable = hardware.mem_capacity_bytes * tp * MEM_UTILIZATION
    weights = model.weight_bytes(config.dtype_bytes)
    if weights >= usable:
        raise ValueError(
            f"{model.name}'s weights ({weights / 1e9:,.1f} GB) do not fit on {tp} x {hardware.name} "
            f"({usable / 1e9:,.1f} GB at utilisation {MEM_UTILIZATION}); raise --tp or pick larger hardware"
        )


def _deployment_warnings(config: CostModelConfig, scenario: Scenario) -> list[str]:
    """What a real server could not run as shown: the model's context, and each policy's KV memory."""
    from stallfree.costs.memory import kv_memory

    model, hardware, tp = config.model, config.hardware, config.tp
    prompt, context, streams = scenario.prompt_tokens, scenario.context_tokens, scenario.streams
    warnings = []
    limit = model.max_position_embeddings
    if context + prompt > limit:
        warnings.append(
            f"a {prompt:,}-token prompt beside {context:,}-token streams exceeds {model.name}'s "
            f"{limit:,}-token context: a real server would reject it"
        )
    # Each stream grows one token per step: lead and tail steps, plus the prompt's steps.
    prompt_steps = {"prefill-first": 1, "chunked": ceil_div(prompt, scenario.chunk_tokens)}
    step_tokens = {"prefill-first": prompt, "chunked": scenario.chunk_tokens + streams}
    for policy, steps in prompt_steps.items():
        needed = streams * (context + scenario.lead_steps + scenario.tail_steps + steps + 1) + prompt
        try:
            kv = kv_memory(
                model,
                hardware,
                tp=tp,
                gpu_memory_utilization=MEM_UTILIZATION,
                dtype_bytes=config.dtype_bytes,
                max_num_batched_tokens=step_tokens[policy],
            )
            held = kv.num_tokens
        except ValueError:
            held = 0
        if held < needed:
            warnings.append(
                f"{policy} needs {needed:,} KV-cache tokens; beside the weights and its "
                f"{step_tokens[policy]:,}-token step's activations, {tp} x {hardware.name} holds {held:,}: "
                "a real server would preempt or queue (the figures assume it does not)"
            )
    return warnings


def _torch(
    options: ExplainOptions, model_name: str, prompt: int, context: int, sweep: Sequence[int]
) -> tuple[StepTimer, dict[str, Any]]:
    """The real engine as the clock. ``options.device`` is not checked here: an unusable one fails
    inside torch (the command line checks it first, ``stallfree.cli.device``)."""
    try:
        import torch

        from stallfree.engine.dtypes import choose_dtype
        from stallfree.explain.engine import EngineTimer
    except ImportError as exc:
        raise ValueError(
            f"--engine torch needs the engine extra (pip install -e '.[engine]'): {exc}"
        ) from None
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    from stallfree.engine.native import bf16_dot_products

    bf16_kernels = options.dtype == "auto" and device == "cpu" and bf16_dot_products()
    dtype = choose_dtype(options.dtype, torch.device(device), bf16_kernels=bf16_kernels)
    if dtype.note:
        _log.warning("note: %s", dtype.note)  # as the engine says it: stderr, unless logging is set up
    smallest = min([*sweep, options.chunk_tokens or 8])
    # Streams grow by one token per step; a chunked run takes at most prompt / chunk steps.
    stream_tokens = context + ceil_div(prompt, smallest) + 32
    timer = EngineTimer(
        model_name,
        max_tokens=options.streams * stream_tokens + prompt + 64,
        max_seq_tokens=max(prompt + 1, stream_tokens),
        dtype=dtype.dtype,
        quantization=dtype.quantization,
        device=device,
    )
    hardware = (
        torch.cuda.get_device_name(device)
        if device.startswith("cuda")
        else f"{torch.get_num_threads()}-thread CPU"
    )
    echo: dict[str, Any] = {
        "model": timer.model.spec.name,
        "hardware": hardware,
        "tp": 1,
        "cost_model": "measured",
        "engine": f"torch {dtype.name} on {device}"
        + (f", {dtype.quantization} weights" if dtype.quantization else ""),
    }
    if options.chunk_tokens is None and device == "cpu":
        # On a CPU the ridge costs a long prompt several times its time: serve's and generate's
        # rule (the streams' gaps within ~3x their step, the prompt's price capped) for these streams.
        from stallfree.engine.auto_budget import choose_token_budget

        choice = choose_token_budget(
            timer.model_runner, num_streams=options.streams, prompt_tokens=prompt, context=context
        )
        echo["auto_chunk_tokens"], echo["chunk_reason"] = choice.chunk_tokens, choice.reason()
    return timer, echo
