"""The one cost-model factory: a :class:`CostChoice` in, a step pricer out, with what was picked and why.

Every command and API that prices steps (simulate, tune, explain, specs, validate) states what it
wants as a :class:`CostChoice` and calls :func:`pick_cost_model`. The sources, most accurate first:

- ``measured`` with a ``profile``: a `stallfree profile` of a real engine
  (:class:`~stallfree.costs.measured.MeasuredCostModel`); the model defaults to the profiled one;
- ``measured`` on a GPU that NVIDIA's aiconfigurator-core measured (the optional ``gpu`` extra:
  ``h100-sxm``, ``h200-sxm``, ``b200-sxm``, ... under vLLM, SGLang or TensorRT-LLM), for a model
  whose config it ships (:class:`~stallfree.costs.aiconfigurator.AicCostModel`);
- ``measured`` on a GPU preset Vidur measured (``a100-*``, ``h100-*``, ``a40``): its operator
  tables, shipped (:class:`~stallfree.costs.vidur.GpuMeasuredCostModel`);
- the roofline, ``full`` or ``weights-only`` (:class:`~stallfree.costs.roofline.CostModel`).

``auto`` takes the first that applies. Invariant: a choice of strings and numbers is hashable and
pickles (a tune trial carries one to its workers); the pick is the same in any process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from stallfree.costs.aiconfigurator import (
    FRAMEWORKS,
    AicCostModel,
    aic_available,
    aic_model_id,
    aic_system,
    shipped_config,
)
from stallfree.costs.measured import MeasuredCostModel
from stallfree.costs.protocol import StepPricer
from stallfree.costs.roofline import (
    COST_MODEL_KINDS,
    CostModel,
    CostModelConfig,
    CostModelKind,
    check_expert_parallel,
    cost_model_kind,
)
from stallfree.costs.vidur import GpuMeasuredCostModel, gpu_family
from stallfree.specs import HARDWARE_PRESETS, HardwareSpec, ModelSpec, load_hardware_spec, load_model_spec
from stallfree.specs.step_profile import StepProfile, load_profile

COST_KINDS = (*COST_MODEL_KINDS, "measured", "auto")
DEFAULT_MODEL = "llama-3-8b"
DEFAULT_HARDWARE = "a100-80gb"
Source = Literal["profile", "aiconfigurator", "gpu-tables", "roofline"]
GPU_TABLES = ("auto", "aiconfigurator", "vidur")


@dataclass(frozen=True, slots=True)
class CostChoice:
    """What to price steps with. ``kind``: auto, weights-only (alias seed), full or measured;
    ``profile`` (a file, a loaded profile or its model) implies measured; ``model`` None: the
    profile's model, else :data:`DEFAULT_MODEL`; ``dtype_bytes`` None: the profile's, else 2;
    ``sampling``: the mode every sampled row pays (a profile's model); ``step_overhead_s`` is
    added to every step. ``gpu_tables`` picks the measured GPU tables (auto: aiconfigurator-core's
    where installed and it covers the model and GPU, else Vidur's); ``framework`` (vllm, sglang,
    trtllm; None: vllm) and ``framework_version`` (None: the newest it has) choose
    aiconfigurator's table, and a framework given asks for it. ``expert_parallel``: a MoE
    model's experts split whole over the ``tp`` GPUs (roofline and aiconfigurator's tables;
    Vidur's are dense and a profile measured its own server)."""

    kind: str = "auto"
    model: str | ModelSpec | None = None
    hardware: str | HardwareSpec = DEFAULT_HARDWARE
    tp: int = 1
    profile: str | StepProfile | MeasuredCostModel | None = None
    dtype_bytes: int | None = None
    sampling: str = "greedy"
    step_overhead_s: float = 0.0
    gpu_tables: str = "auto"
    framework: str | None = None
    framework_version: str | None = None
    expert_parallel: bool = False

    @property
    def model_name(self) -> str:
        """The model priced: the one named, else the profile's, else :data:`DEFAULT_MODEL`."""
        if isinstance(self.model, ModelSpec):
            return self.model.name
        if self.model is not None:
            return self.model
        profile = self.profile
        if isinstance(profile, MeasuredCostModel):
            profile = profile.profile
        if isinstance(profile, str):
            profile = load_profile(profile)
        return DEFAULT_MODEL if profile is None else str(profile.fingerprint.get("model", "profiled"))


@dataclass(frozen=True, slots=True)
class CostPick:
    """A :class:`CostChoice` resolved: the pricer and everything sized with it."""

    pricer: StepPricer
    model: ModelSpec
    hardware: HardwareSpec
    tp: int
    dtype_bytes: int
    kind: Literal["weights-only", "full", "measured"]
    source: Source
    why: str  # a few words: what auto picked and why, or what was asked

    @property
    def measured(self) -> MeasuredCostModel | None:
        """The profile's model (whose KV cache is the profiled engine's, not ``hardware``'s)."""
        return self.pricer if isinstance(self.pricer, MeasuredCostModel) else None


def pick_once(choice: CostChoice) -> CostPick:
    """:func:`pick_cost_model`, once per choice in a process (tune's trials and a disaggregated run's
    pools ask again and again); a choice holding a loaded profile, not a path, is resolved each time."""
    try:
        hash(choice)
    except TypeError:
        return pick_cost_model(choice)
    return _picked(choice)


def pick_cost_model(choice: CostChoice) -> CostPick:
    """Resolve ``choice``; a choice that cannot be priced is a one-line ``ValueError``."""
    kind = cost_model_kind(choice.kind)
    if kind not in COST_KINDS:
        raise ValueError(f"unknown cost model {choice.kind!r}; choose from {', '.join(COST_KINDS)} (seed)")
    if choice.gpu_tables not in GPU_TABLES:
        raise ValueError(f"unknown GPU tables {choice.gpu_tables!r}; choose from {', '.join(GPU_TABLES)}")
    if choice.framework is not None and choice.framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {choice.framework!r}; choose from {', '.join(FRAMEWORKS)}")
    hardware = load_hardware_spec(choice.hardware) if isinstance(choice.hardware, str) else choice.hardware
    auto = kind == "auto"
    if choice.profile is not None or (
        kind == "measured" and gpu_family(hardware.name) is None and aic_system(hardware.name) is None
    ):
        if choice.expert_parallel:
            raise ValueError(
                "expert parallelism prices GPU deployments; a profile measured its server as it ran"
            )
        return _profiled(choice, hardware, "auto" if auto else "asked")
    model = resolve_model(choice.model or DEFAULT_MODEL)  # every pick below prices this spec
    if choice.expert_parallel:
        check_expert_parallel(model, choice.tp)
    if kind in ("auto", "measured"):
        aic = _aic_pick(choice, model, hardware, auto)
        if aic is not None:
            return aic
    if kind == "measured" and gpu_family(hardware.name) is None:  # aiconfigurator's GPU, said no
        return _profiled(choice, hardware, "asked")
    family = gpu_family(hardware.name) if HARDWARE_PRESETS.get(hardware.name) == hardware else None
    if kind == "measured" or (auto and family is not None and not model.is_moe):  # Vidur's: dense only
        return _gpu_tables(choice, model, hardware, auto)
    roofline: CostModelKind = "full" if auto or kind == "full" else "weights-only"
    dtype_bytes = choice.dtype_bytes or 2
    config = CostModelConfig(
        model,
        hardware,
        tp=choice.tp,
        dtype_bytes=dtype_bytes,
        kind=roofline,
        overhead_s=choice.step_overhead_s,
        expert_parallel=choice.expert_parallel,
    )
    why = f"no measured table for {hardware.name}; auto" if auto else "asked"
    return CostPick(CostModel(config), model, hardware, choice.tp, dtype_bytes, config.kind, "roofline", why)


def _profiled(choice: CostChoice, hardware: HardwareSpec, how: str) -> CostPick:
    profile = choice.profile
    if profile is None:
        raise ValueError(
            "cost model 'measured' needs a profile (a stallfree profile file) or a GPU preset with a "
            f"shipped table (a100-*, h100-*, a40); {hardware.name} has none"
        )
    if isinstance(profile, MeasuredCostModel):
        measured = profile
    else:
        loaded = load_profile(profile) if isinstance(profile, str) else profile
        measured = MeasuredCostModel(loaded, sampling=choice.sampling, overhead_s=choice.step_overhead_s)
    profiled = choice.model is None or choice.model == measured.profile.fingerprint.get("model")
    model = measured.model_spec() if profiled else resolve_model(choice.model)  # type: ignore[arg-type]
    why = f"profile {profile}" if isinstance(profile, str) else "the given profile"
    dtype_bytes = choice.dtype_bytes or measured.dtype_bytes
    pricer: StepPricer = measured
    return CostPick(pricer, model, hardware, choice.tp, dtype_bytes, "measured", "profile", f"{why}; {how}")


def _gpu_tables(choice: CostChoice, model: ModelSpec, hardware: HardwareSpec, auto: bool) -> CostPick:
    if choice.expert_parallel:
        raise ValueError(
            "Vidur's GPU tables are of dense models: expert parallelism is priced by aiconfigurator-core's "
            '(pip install "stallfree[gpu]") or the roofline (--cost-model full)'
        )
    family = gpu_family(hardware.name)
    dtype_bytes = choice.dtype_bytes or 2
    gpu = GpuMeasuredCostModel(
        model, hardware, tp=choice.tp, dtype_bytes=dtype_bytes, overhead_s=choice.step_overhead_s
    )
    why = f"Vidur's {str(family).upper()} tables"
    if not gpu.measured:
        why += f", {gpu.table_model}'s curve"
    return CostPick(
        gpu,
        model,
        hardware,
        choice.tp,
        dtype_bytes,
        "measured",
        "gpu-tables",
        f"{why}; auto" if auto else why,
    )


def _aic_pick(choice: CostChoice, model: ModelSpec, hardware: HardwareSpec, auto: bool) -> CostPick | None:
    """aiconfigurator-core's tables where the choice allows them and they cover it; None where
    they need not be used, a one-line ``ValueError`` where they were asked for and cannot be."""
    # measured on a GPU only aiconfigurator has tables for: its reason is the one to give
    only_aic = cost_model_kind(choice.kind) == "measured" and gpu_family(hardware.name) is None
    asked = choice.gpu_tables == "aiconfigurator" or choice.framework is not None or only_aic
    if choice.gpu_tables == "vidur" and choice.framework is not None:
        raise ValueError("a framework picks aiconfigurator-core's tables, not Vidur's")
    if choice.gpu_tables == "vidur":
        return None
    name = choice.model.name if isinstance(choice.model, ModelSpec) else choice.model or DEFAULT_MODEL
    system = aic_system(hardware.name) if HARDWARE_PRESETS.get(hardware.name) == hardware else None
    model_id = aic_model_id(name)
    if only_aic and system is None and choice.gpu_tables == "auto" and choice.framework is None:
        return None  # no measured table at all: the profile's error says what to give
    missing = (
        'aiconfigurator-core is not installed (pip install "stallfree[gpu]")'
        if not aic_available()
        else f"aiconfigurator-core has no tables for {hardware.name}"
        if system is None
        else f"aiconfigurator-core ships no config for {name}"
        if model_id is None
        else None
    )
    if missing is not None or system is None or model_id is None:
        if asked and missing is not None:
            raise ValueError(missing)
        return None
    framework = choice.framework or "vllm"
    dtype_bytes = choice.dtype_bytes or 2
    if dtype_bytes not in (1, 2):
        if asked:
            raise ValueError("aiconfigurator-core's tables are of bf16 and fp8 kernels: --dtype bf16 or fp8")
        return None
    pricer = AicCostModel(
        model_id,
        system,
        framework,
        choice.framework_version,
        tp=choice.tp,
        expert_parallel=choice.expert_parallel,
        fp8=dtype_bytes == 1,
        overhead_s=choice.step_overhead_s,
    )
    why = f"aiconfigurator-core's {system} tables, {framework} {pricer.version}" + (
        ", fp8" if pricer.fp8 else ""
    )
    return CostPick(
        pricer,
        model,
        hardware,
        choice.tp,
        dtype_bytes,
        "measured",
        "aiconfigurator",
        f"{why}; auto" if auto and not asked else why,
    )


def resolve_model(model: str | ModelSpec) -> ModelSpec:
    """A model spec: given, one of our presets or paths, or a Hugging Face id whose config
    aiconfigurator-core ships."""
    if isinstance(model, ModelSpec):
        return model
    config = shipped_config(model)
    if config is not None:  # a Hugging Face id whose config aiconfigurator-core ships
        return ModelSpec.from_hf_config(config, name=model)
    return load_model_spec(model)


_picked = functools.lru_cache(maxsize=16)(pick_cost_model)
