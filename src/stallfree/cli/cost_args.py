"""The pricing flags, one per :class:`~stallfree.costs.choice.CostChoice` field (``--model
--hardware --tp --cost-model --profile --gpu-tables --framework --framework-version
--expert-parallel --dtype``), shared by every command that prices steps: declared with the
choice's own defaults, and parsed into a choice here, once."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stallfree.cli.common import UsageError, positive_int
from stallfree.costs.choice import DEFAULT_HARDWARE, DEFAULT_MODEL
from stallfree.costs.kv_transfer import DEFAULT_KV_LINK, LINKS

if TYPE_CHECKING:
    from stallfree.costs.choice import CostChoice, CostPick


def add_roofline_args(
    parser: argparse._ActionsContainer,
    *,
    model: str | None = None,
    hardware: str | None = DEFAULT_HARDWARE,
    cost_model: str = "auto",
) -> None:
    """``--model --hardware --tp --cost-model --profile`` and the GPU tables' flags, as every
    pricing command takes them; defaults are :class:`~stallfree.costs.choice.CostChoice`'s.

    ``model`` None: the profile's model, else :data:`~stallfree.costs.choice.DEFAULT_MODEL`;
    ``hardware`` None leaves it unset (the command decides what that means).
    """

    def default(value: str | None) -> str:
        return f" (default {value})" if value is not None else ""

    parser.add_argument(
        "--model",
        default=model,
        help="preset name, a Hugging Face id aiconfigurator-core ships, a HF config.json, or a folder "
        "holding one"
        + (default(model) if model else f" (default: the profile's model, else {DEFAULT_MODEL})"),
    )
    parser.add_argument(
        "--hardware", default=hardware, help="preset name or a hardware JSON file" + default(hardware)
    )
    parser.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel GPUs (default 1)")
    choices = (*COST_MODEL_CHOICES, "auto") if cost_model == "auto" else COST_MODEL_CHOICES
    parser.add_argument(
        "--cost-model",
        type=cost_model_arg,
        choices=choices,
        default=cost_model,
        help="weights-only (alias seed): the seed explainer's arithmetic; full: + attention FLOPs, KV-cache "
        "reads and writes, LM head, TP all-reduce; measured: fitted to a `stallfree profile` file "
        "(--profile) of the real engine, or with no profile on a GPU preset, measured GPU tables "
        "(see --gpu-tables)"
        + (
            "; auto: measured from --profile, else measured GPU tables (aiconfigurator-core's where installed "
            "and covering the model and GPU, else Vidur's on a100-*/h100-*/a40), else full"
            if "auto" in choices
            else ""
        )
        + f" (default {cost_model})",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="step profile from `stallfree profile` (implies --cost-model measured)",
    )
    add_gpu_table_args(parser)


def add_gpu_table_args(parser: argparse._ActionsContainer) -> None:
    """``--gpu-tables --framework --framework-version``: which measured GPU tables price steps;
    ``--expert-parallel``: how a MoE model's experts sit on the GPUs."""
    from stallfree.costs.aiconfigurator import FRAMEWORKS
    from stallfree.costs.choice import GPU_TABLES

    parser.add_argument(
        "--gpu-tables",
        choices=GPU_TABLES,
        default="auto",
        help="measured GPU tables: aiconfigurator (NVIDIA's aiconfigurator-core, pip install "
        '"stallfree[gpu]": H100, H200, B200, B300, GB200, GB300, L40S, RTX PRO 6000, A100 under '
        "vLLM, SGLang, TensorRT-LLM), vidur (Vidur's A100/H100/A40 tables, shipped); auto: "
        "aiconfigurator where it covers the model and GPU, else vidur (default auto)",
    )
    parser.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        help="the serving framework whose aiconfigurator table prices steps (implies "
        "--gpu-tables aiconfigurator; default vllm)",
    )
    parser.add_argument(
        "--framework-version",
        metavar="VERSION",
        help="that framework's table version (default: the newest aiconfigurator-core has for the GPU)",
    )
    parser.add_argument(
        "--expert-parallel",
        action="store_true",
        help="a MoE model's experts split whole over the --tp GPUs (vLLM --enable-expert-parallel, SGLang "
        "--ep-size) instead of each sliced over them; a step waits for the GPU its tokens route the most "
        "experts to (roofline and aiconfigurator tables)",
    )


def gpu_tables_of(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`add_gpu_table_args`' flags as :class:`~stallfree.costs.choice.CostChoice` fields."""
    return {
        "gpu_tables": args.gpu_tables,
        "framework": args.framework,
        "framework_version": args.framework_version,
        "expert_parallel": args.expert_parallel,
    }


COST_MODEL_CHOICES = ("weights-only", "full", "measured")
ROOFLINE_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


def add_roofline_dtype_arg(parser: argparse._ActionsContainer, default: str | None) -> None:
    """``--dtype`` of a priced deployment (weights and KV cache); fp8 takes the GPU tables' fp8 kernels."""
    parser.add_argument(
        "--dtype",
        choices=tuple(ROOFLINE_DTYPE_BYTES),
        default=default,
        help="weight and KV dtype; fp8: the GPU tables' fp8 GEMMs and KV cache "
        + (f"(default {default})" if default else "(default bf16, or the profile's with --profile)"),
    )


def dtype_bytes_arg(args: argparse.Namespace) -> int | None:
    """``--dtype`` in bytes, None when it was left to the profile."""
    return ROOFLINE_DTYPE_BYTES[args.dtype] if args.dtype else None


def resolve_cost_model(args: argparse.Namespace) -> str | None:
    """``--cost-model auto`` replaced in ``args`` by what the cost-model factory picks for it; the
    few words that say why, or None when a kind was given. Call it before :func:`measured_profile`."""
    return None if args.cost_model != "auto" else pick_costs(args)[1]


def pick_costs(args: argparse.Namespace, **options: Any) -> tuple[CostPick, str | None]:
    """``--model --hardware --tp --cost-model --profile`` through the one cost-model factory, with
    ``args.cost_model`` set to the kind picked (never ``auto``); the pick and, for ``auto``, the few
    words that say why (None when a kind was named). ``options`` are further
    :class:`~stallfree.costs.choice.CostChoice` fields (``dtype_bytes``, ``sampling``, ``step_overhead_s``)."""
    _, pick, why = picked_choice(args, **options)
    return pick, why


def picked_choice(args: argparse.Namespace, **options: Any) -> tuple[CostChoice, CostPick, str | None]:
    """:func:`pick_costs`, with the choice it picked (kind as asked): a run priced by that choice
    finds it picked already (:func:`~stallfree.costs.choice.pick_once`: GPU tables load once)."""
    from stallfree.costs.choice import pick_once

    kind = args.cost_model
    if kind != "auto":
        measured_profile(args, gpu_tables=True)  # measured with neither: say which flag is missing
    choice = cost_choice(args, **options)
    try:
        pick = pick_once(choice)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    args.cost_model = pick.kind
    return choice, pick, pick.why if kind == "auto" else None


def cost_choice(args: argparse.Namespace, **options: Any) -> CostChoice:
    """The pricing flags as a :class:`~stallfree.costs.choice.CostChoice` (names and paths only, so
    it pickles); ``options`` are its further fields (``dtype_bytes``, ``sampling``, ...)."""
    from stallfree.costs.choice import CostChoice

    return CostChoice(
        args.cost_model, args.model, args.hardware, args.tp, args.profile, **gpu_tables_of(args), **options
    )


def measured_profile(args: argparse.Namespace, gpu_tables: bool = False) -> str | None:
    """The profile file of ``--cost-model measured`` (``--profile`` alone implies it), else None.
    ``gpu_tables``: ``measured`` with no profile is allowed for a GPU preset (shipped tables)."""
    if args.profile is not None:
        args.cost_model = "measured"
    elif args.cost_model == "measured":
        from stallfree.costs.aiconfigurator import aic_system
        from stallfree.costs.vidur import gpu_family

        hardware = str(getattr(args, "hardware", None) or "")
        if gpu_tables and (gpu_family(hardware) is not None or aic_system(hardware) is not None):
            return None  # a GPU preset: measured tables (costs/aiconfigurator.py, costs/vidur.py)
        tables = (
            f" or a GPU preset with measured tables (a100-*, h100-*, h200-sxm, b200-sxm, ...); {hardware} has none"
            if gpu_tables and hardware
            else ""
        )
        raise UsageError(
            f"--cost-model measured needs --profile FILE (write one with `stallfree profile`){tables}"
        )
    return str(args.profile) if args.profile is not None else None


def cost_model_arg(text: str) -> str:
    """``--cost-model`` with its aliases resolved (``seed`` is ``weights-only``)."""
    from stallfree.costs.roofline import cost_model_kind

    return cost_model_kind(text)


def add_kv_link_arg(add: Callable[..., Any], when: str) -> None:
    """``--kv-link`` (``add``: a parser's or group's ``add_argument``); ``when`` opens its help."""
    others = ", ".join(name for name in LINKS if name != "nvlink")
    add(
        "--kv-link",
        default=DEFAULT_KV_LINK,
        metavar="LINK",
        help=f"{when}: nvlink (the hardware's GPU-to-GPU figure), {others}, or a number of GB/s a GPU "
        "(default %(default)s)",
    )
