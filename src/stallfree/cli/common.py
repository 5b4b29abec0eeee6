"""Argument helpers shared by the subcommands (parsing only, no behaviour)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stallfree.core.serving import ServingConfig
    from stallfree.sim.costs import CostPick


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


def _whole_number(text: str, minimum: int, rule: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{rule}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _whole_number(text, 1, "must be positive")


def non_negative_int(text: str) -> int:
    return _whole_number(text, 0, "must be >= 0")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def int_list(text: str) -> list[int]:
    """``16,32,64`` -> [16, 32, 64], each positive."""
    return [positive_int(part) for part in text.split(",") if part.strip()]


def add_roofline_args(
    parser: argparse._ActionsContainer, *, model: str | None, hardware: str | None, cost_model: str
) -> None:
    """``--model --hardware --tp --cost-model``, as every roofline command takes them.

    ``None`` defaults leave the option unset (the command decides what that means).
    """

    def default(value: str | None) -> str:
        return f" (default {value})" if value is not None else ""

    parser.add_argument(
        "--model",
        default=model,
        help="preset name, a HF config.json, or a folder holding one" + default(model),
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
        "(--profile) of the real engine, or with no profile on an a100-*/h100-* preset, Vidur's measured "
        "GPU tables"
        + (
            "; auto: measured when there is a profile or a shipped table, else full"
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


COST_MODEL_CHOICES = ("weights-only", "full", "measured")


def resolve_cost_model(args: argparse.Namespace) -> str | None:
    """``--cost-model auto`` replaced in ``args`` by what the cost-model factory picks for it; the
    few words that say why, or None when a kind was given. Call it before :func:`measured_profile`."""
    return None if args.cost_model != "auto" else pick_costs(args)[1]


def pick_costs(args: argparse.Namespace, **options: Any) -> tuple[CostPick, str | None]:
    """``--model --hardware --tp --cost-model --profile`` through the one cost-model factory, with
    ``args.cost_model`` set to the kind picked (never ``auto``); the pick and, for ``auto``, the few
    words that say why (None when a kind was named). ``options`` are further
    :class:`~stallfree.sim.costs.CostChoice` fields (``dtype_bytes``, ``sampling``, ``step_overhead_s``)."""
    from stallfree.sim.costs import CostChoice, pick_cost_model

    kind = args.cost_model
    if kind != "auto":
        measured_profile(args, gpu_tables=True)  # measured with neither: say which flag is missing
    choice = CostChoice(kind, args.model, args.hardware, args.tp, args.profile, **options)
    try:
        pick = pick_cost_model(choice)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    args.cost_model = pick.kind
    return pick, pick.why if kind == "auto" else None


def measured_profile(args: argparse.Namespace, gpu_tables: bool = False) -> str | None:
    """The profile file of ``--cost-model measured`` (``--profile`` alone implies it), else None.
    ``gpu_tables``: ``measured`` with no profile is allowed for a GPU preset (shipped tables)."""
    if args.profile is not None:
        args.cost_model = "measured"
    elif args.cost_model == "measured":
        from stallfree.sim.gpu_measured import gpu_family

        hardware = getattr(args, "hardware", None)
        if gpu_tables and gpu_family(str(hardware or "")) is not None:
            return None  # a GPU preset: the shipped Vidur tables (sim/gpu_measured.py)
        tables = (
            f" or a GPU preset with a shipped table (a100-*, h100-*); {hardware} has none"
            if gpu_tables and hardware
            else ""
        )
        raise UsageError(
            f"--cost-model measured needs --profile FILE (write one with `stallfree profile`){tables}"
        )
    return str(args.profile) if args.profile is not None else None


def cost_model_arg(text: str) -> str:
    """``--cost-model`` with its aliases resolved (``seed`` is ``weights-only``)."""
    from stallfree.sim.cost_model import cost_model_kind

    return cost_model_kind(text)


SERVING_FLAGS: dict[str, tuple[str, ...]] = {
    "policy": ("--policy",),
    "max_num_batched_tokens": ("--max-num-batched-tokens", "--token-budget"),
    "chunk_tokens": ("--chunk-tokens",),
    "max_num_seqs": ("--max-num-seqs",),
    "max_model_len": ("--max-model-len",),
    "block_size": ("--block-size",),
    "num_blocks": ("--num-blocks",),
    "watermark": ("--kv-watermark",),
    "step_budget_ms": ("--step-budget-ms",),
}
"""The command-line flags of each :class:`~stallfree.core.serving.ServingConfig` field (vLLM's
names; ``--token-budget`` is Sarathi-Serve's name for the same budget)."""

_SERVING_HELP = {
    "max_num_batched_tokens": "tokens per step, for every policy: chunked: the budget, decodes included "
    "(default {budget}; with --step-budget-ms a cap, default {step_cap}); prefill-first/decode-first: prompt tokens batched whole in one step "
    "(default max-model-len)",
    "chunk_tokens": "chunked: prompt tokens per step on top of the decodes, instead of a budget",
    "max_num_seqs": "running requests at most (default {seqs}, and at most a chunked budget)",
    "max_model_len": "prompt + output limit (default: the model's context)",
    "block_size": "tokens per KV block (default {block})",
    "num_blocks": "KV-cache blocks (default: sized from memory)",
    "watermark": "share of KV blocks admission keeps free (default {watermark})",
    "step_budget_ms": "chunked: size prompt chunks so each step's predicted time stays within MS "
    "(decodes always run; a token budget given with it is a cap, default {step_cap}); needs a step-time "
    "predictor: the simulator's cost model, or the engine's measured --profile",
}


_SERVING_TYPES: dict[str, Callable[[str], Any]] = {"watermark": float, "step_budget_ms": positive_float}


def add_serving_args(parser: argparse._ActionsContainer, *, policy_list: bool = False) -> None:
    """One flag per :class:`ServingConfig` field (:data:`SERVING_FLAGS`), defaults from the config.

    ``policy_list``: ``--policy`` takes a comma list (simulate compares policies).
    """
    from stallfree.core import DEFAULT_STEP_TOKEN_CAP, DEFAULT_TOKEN_BUDGET, POLICIES
    from stallfree.core.serving import DEFAULT_MAX_NUM_SEQS, ServingConfig

    defaults = ServingConfig()
    fill = {
        "budget": DEFAULT_TOKEN_BUDGET,
        "step_cap": DEFAULT_STEP_TOKEN_CAP,
        "seqs": DEFAULT_MAX_NUM_SEQS,
        "block": defaults.block_size,
        "watermark": defaults.watermark,
    }
    if policy_list:
        parser.add_argument(
            "--policy",
            default=defaults.policy,
            help=f"policy or comma list: {', '.join(POLICIES)} (default %(default)s)",
        )
    else:
        parser.add_argument(
            "--policy",
            choices=POLICIES,
            default=defaults.policy,
            help="scheduling policy (default %(default)s)",
        )
    for name, flags in SERVING_FLAGS.items():
        if name == "policy":
            continue
        value_type = _SERVING_TYPES.get(name, positive_int)
        parser.add_argument(
            *flags,
            dest=name,
            type=value_type,
            default=getattr(defaults, name),
            metavar="MS" if name == "step_budget_ms" else "N",
            help=_SERVING_HELP[name].format(**fill),
        )


def serving_config(args: argparse.Namespace, policy: str | None = None) -> ServingConfig:
    """The parsed serving flags as a :class:`ServingConfig` (``policy`` overrides ``--policy``);
    a combination that cannot work is a :class:`UsageError`."""
    from stallfree.core.serving import ServingConfig

    fields = {name: getattr(args, name) for name in SERVING_FLAGS}
    if policy is not None:
        fields["policy"] = policy
    try:
        return ServingConfig(**fields)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def policy_list(text: str) -> list[str]:
    """``--policy chunked,prefill-first`` -> the policies, each known and named once."""
    from stallfree.core import POLICIES

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in POLICIES]
    if unknown or not names:
        named = ", ".join(repr(name) for name in unknown) if unknown else repr(text)
        raise UsageError(f"unknown policy {named}; choose from: {', '.join(POLICIES)}")
    if len(set(names)) != len(names):
        raise UsageError(f"policy listed twice in {text!r}")
    return names


def serving_configs(args: argparse.Namespace) -> list[ServingConfig]:
    """One :class:`ServingConfig` per policy of ``--policy``'s comma list (``add_serving_args(...,
    policy_list=True)``); ``--step-budget-ms`` is the chunked policy's, so the baselines beside it
    run without it (and it needs chunked among them)."""
    policies = policy_list(args.policy)
    if args.step_budget_ms is not None and "chunked" not in policies:
        raise UsageError("--step-budget-ms applies to the chunked policy only")
    baseline = argparse.Namespace(**{**vars(args), "step_budget_ms": None})
    return [serving_config(args if policy == "chunked" else baseline, policy) for policy in policies]


# stallfree.engine.dtypes.DTYPE_CHOICES, spelled out so that parsing never imports torch.
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def add_dtype_arg(parser: argparse._ActionsContainer, what: str = "weights and KV dtype") -> None:
    """``--dtype``: every engine entry point's, with the one ``auto`` rule (stallfree.engine.dtypes)."""
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help=f"{what}; auto: bfloat16 on CUDA and on CPUs that run it fast (AVX-512, AMX), "
        "else float32 (default %(default)s)",
    )


ENGINE_MODELS = "random:<preset>, a GGUF file (a .gguf path or a short name: smollm2) or a local HF folder"
"""The models the PyTorch engine loads (stallfree.engine.weights.load_model), as help text says it."""


def add_engine_args(parser: argparse._ActionsContainer) -> None:
    """The PyTorch engine's options: ``--model --dtype --device`` and the serving flags (generate, serve)."""
    parser.add_argument("--model", default="random:small", help=f"{ENGINE_MODELS} (default %(default)s)")
    add_dtype_arg(parser)
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    add_serving_args(parser)
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="a `stallfree profile` of this machine: its measured model predicts step times for "
        "--step-budget-ms (which needs it)",
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options of parsed ``args``, as ``LLMEngine`` keyword arguments; with
    ``--step-budget-ms`` the ``--profile``'s measured model is the step-time predictor."""
    serving = serving_config(args)
    kwargs: dict[str, Any] = {"dtype": args.dtype, "device": args.device, "serving": serving}
    profile = getattr(args, "profile", None)
    if serving.step_budget_ms is not None:
        if profile is None:
            raise UsageError(
                "--step-budget-ms needs --profile FILE: a `stallfree profile` of this machine, whose "
                "measured model predicts each candidate step's time"
            )
        from stallfree.sim.measured import MeasuredCostModel

        try:
            kwargs["step_time_predictor"] = MeasuredCostModel.from_file(profile).step_time_s
        except (OSError, ValueError) as exc:
            raise UsageError(f"--profile {profile}: {exc}") from None
    return kwargs


def check_writable(path: Path, flag: str) -> None:
    """Fail now, not after minutes of work, if ``flag``'s file cannot be written at ``path``."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with path.open("a"):
            pass
        if not existed:
            path.unlink()
    except OSError as error:
        raise UsageError(f"{flag} {path}: {error.strerror or error}") from None
