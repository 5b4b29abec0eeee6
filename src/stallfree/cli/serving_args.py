"""The scheduler's flags, one per :class:`~stallfree.core.serving.ServingConfig` field (vLLM's
names), shared by every command that schedules, and the engine's (generate, serve): declared,
parsed and turned into configs here."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from stallfree.cli.common import (
    ENGINE_MODELS,
    UsageError,
    add_dtype_arg,
    add_quantization_arg,
    non_negative_int,
    positive_float,
    positive_int,
)

if TYPE_CHECKING:
    from stallfree.core.serving import ServingConfig
    from stallfree.engine.config import EngineConfig
    from stallfree.sim.speculative import Acceptance


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
    "enable_prefix_caching": ("--enable-prefix-caching",),
    "num_speculative_tokens": ("--speculative-tokens", "--num-speculative-tokens"),
    "speculative_rule": ("--speculative-rule",),
    "scheduling_policy": ("--scheduling-policy",),
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
    "num_speculative_tokens": "chunked: speculative decoding, each decode verifies up to N draft tokens a "
    "step (default 0: none)",
    "speculative_rule": "how drafts share a step with prompt chunks: {rules} (default {rule})",
    "scheduling_policy": "who waits first and who is preempted when KV blocks run out: {orders} "
    "(default {order})",
    "enable_prefix_caching": "reuse the KV blocks of prompt prefixes seen before (vLLM V1's automatic "
    "prefix caching; default on, as in vLLM); applies to requests whose prompts are known: the engine's, "
    "traces with block hashes, multi-turn sessions",
}


_SERVING_TYPES: dict[str, Callable[[str], Any]] = {
    "watermark": float,
    "step_budget_ms": positive_float,
    "num_speculative_tokens": non_negative_int,
    "speculative_rule": str,
    "scheduling_policy": str,
}


def add_prefix_caching_arg(parser: argparse._ActionsContainer) -> None:
    """``--enable-prefix-caching`` / ``--no-enable-prefix-caching``, default from :class:`ServingConfig`
    (for a command that takes no other scheduler flag, as ``tune``)."""
    from stallfree.core.serving import ServingConfig

    parser.add_argument(
        *SERVING_FLAGS["enable_prefix_caching"],
        dest="enable_prefix_caching",
        action=argparse.BooleanOptionalAction,
        default=ServingConfig().enable_prefix_caching,
        help=_SERVING_HELP["enable_prefix_caching"],
    )


def add_serving_args(
    parser: argparse._ActionsContainer, *, policy_list: bool = False, more_policies: str = ""
) -> None:
    """One flag per :class:`ServingConfig` field (:data:`SERVING_FLAGS`), defaults from the config.

    ``policy_list``: ``--policy`` takes a comma list (simulate compares policies), and also what
    ``more_policies`` says (simulate's ``disagg:xPyD``).
    """
    from stallfree.core import DEFAULT_STEP_TOKEN_CAP, DEFAULT_TOKEN_BUDGET, POLICIES, SCHEDULING_POLICIES
    from stallfree.core.policy import SPECULATIVE_RULES
    from stallfree.core.serving import DEFAULT_MAX_NUM_SEQS, ServingConfig

    defaults = ServingConfig()
    fill = {
        "budget": DEFAULT_TOKEN_BUDGET,
        "step_cap": DEFAULT_STEP_TOKEN_CAP,
        "seqs": DEFAULT_MAX_NUM_SEQS,
        "block": defaults.block_size,
        "watermark": defaults.watermark,
        "rules": "; ".join(f"{name}: {rule}" for name, rule in SPECULATIVE_RULES.items()),
        "rule": defaults.speculative_rule,
        "orders": "; ".join(f"{name}: {rule}" for name, rule in SCHEDULING_POLICIES.items()),
        "order": defaults.scheduling_policy,
    }
    choices = {"speculative_rule": tuple(SPECULATIVE_RULES), "scheduling_policy": tuple(SCHEDULING_POLICIES)}
    if policy_list:
        parser.add_argument(
            "--policy",
            default=defaults.policy,
            help=f"policy or comma list: {', '.join(POLICIES)}{more_policies} (default %(default)s)",
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
        if name == "enable_prefix_caching":
            add_prefix_caching_arg(parser)
            continue
        value_type = _SERVING_TYPES.get(name, positive_int)
        parser.add_argument(
            *flags,
            dest=name,
            type=value_type,
            default=getattr(defaults, name),
            metavar={"step_budget_ms": "MS", "speculative_rule": "RULE", "scheduling_policy": "POLICY"}.get(
                name, "N"
            ),
            choices=choices.get(name),
            help=_SERVING_HELP[name].format(**fill),
        )


def add_acceptance_arg(
    parser: argparse._ActionsContainer, *, draft_rate: bool = True, draft: bool = False
) -> None:
    """``--acceptance-rate`` (and with ``draft_rate`` ``--draft-rate``): how often the simulator's
    drafts are right and made (with ``--speculative-tokens``); ``draft``: ``--draft`` too, what
    drafting costs."""
    parser.add_argument(
        "--acceptance-rate",
        metavar="RATE",
        help="with --speculative-tokens: the share of draft tokens accepted, each independently (0.7), "
        "or by position as vLLM's spec-decode metrics report it (0.8,0.6,0.45,0.3: verify steps whose "
        "i-th draft was accepted)",
    )
    if draft_rate:
        parser.add_argument(
            "--draft-rate",
            type=float,
            default=1.0,
            metavar="SHARE",
            help="with --speculative-tokens: the share of decode steps that have drafts (n-gram lookup "
            "finds none where the text does not repeat; a draft model always guesses) (default 1)",
        )
    if not draft:
        return
    parser.add_argument(
        "--draft",
        default="ngram",
        metavar="METHOD",
        help="with --speculative-tokens: what drafting costs: ngram (prompt lookup, free), eagle (a head "
        "of one decoder layer: a layer's share of a decode step each pass) or model:NAME (a draft "
        "model's decode step each pass, priced as the target's steps) (default ngram)",
    )


def acceptance_arg(args: argparse.Namespace) -> Acceptance | None:
    """The parsed ``--acceptance-rate`` for ``--speculative-tokens`` (None without either); a
    :class:`UsageError` if one comes without the other or is wrong."""
    from stallfree.sim.speculative import Acceptance

    k, rate = args.num_speculative_tokens, args.acceptance_rate
    if not k:
        for flag, given in (
            ("--draft-rate", args.draft_rate != 1.0),
            ("--draft", getattr(args, "draft", "ngram") != "ngram"),
        ):
            if given:
                raise UsageError(f"{flag} applies with --speculative-tokens N")
    if rate is None:
        if k:
            raise UsageError(
                "--speculative-tokens needs --acceptance-rate: the share of draft tokens accepted "
                "(a server's spec-decode metrics say it: vllm:spec_decode_num_accepted_tokens_total "
                "over vllm:spec_decode_num_draft_tokens_total)"
            )
        return None
    if not k:
        raise UsageError("--acceptance-rate applies with --speculative-tokens N")
    try:
        acceptance = Acceptance.parse(rate, k)
    except ValueError as exc:
        raise UsageError(f"--acceptance-rate: {exc}") from None
    try:
        return replace(acceptance, proposal_rate=args.draft_rate)
    except ValueError as exc:
        raise UsageError(f"--draft-rate: {exc}") from None


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
    policy_list=True)``); ``--step-budget-ms`` and ``--speculative-tokens`` are the chunked policy's,
    so the baselines beside it run without them (and they need chunked among them)."""
    policies = policy_list(args.policy)
    for flag, value in (
        ("--step-budget-ms", args.step_budget_ms),
        ("--speculative-tokens", args.num_speculative_tokens),
    ):
        if value and "chunked" not in policies:
            raise UsageError(f"{flag} applies to the chunked policy only")
    baseline = argparse.Namespace(**{**vars(args), "step_budget_ms": None, "num_speculative_tokens": 0})
    return [serving_config(args if policy == "chunked" else baseline, policy) for policy in policies]


def add_engine_args(parser: argparse._ActionsContainer) -> None:
    """The PyTorch engine's options: ``--model --dtype --quantization --device`` and the serving flags (generate, serve)."""
    parser.add_argument("--model", default="random:small", help=f"{ENGINE_MODELS} (default %(default)s)")
    add_dtype_arg(parser)
    add_quantization_arg(parser)
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    add_serving_args(parser)
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="a `stallfree profile` of this machine: its measured model predicts step times for "
        "--step-budget-ms (which needs it)",
    )
    for bound in ("min", "max"):
        parser.add_argument(
            f"--prompt-lookup-{bound}",
            type=positive_int,
            metavar="N",
            help=f"with --speculative-tokens: the {'shortest' if bound == 'min' else 'longest'} n-gram the "
            "drafter looks up in the prompt and output (vLLM's names and defaults: 5 and 5; one given sets both)",
        )


def engine_config(args: argparse.Namespace, **fields: Any) -> EngineConfig:
    """The engine options of parsed ``args`` (plus ``fields``, e.g. a seed) as an
    :class:`~stallfree.engine.config.EngineConfig`; with ``--step-budget-ms`` the ``--profile``'s
    measured model is the step-time predictor; with no budget flag on the CPU the engine measures
    the budget this machine calls for (``auto_token_budget``)."""
    from stallfree.tune.sigint import deferred

    # Importing the engine imports torch, whose C++ init calls back into Python: a Ctrl-C (or a
    # SIGTERM) raised inside such a callback aborts the process ("terminate called ..."), so the
    # import holds the signal and it is raised once torch is in.
    with deferred():
        from stallfree.engine.config import EngineConfig

    serving = serving_config(args)
    profile = getattr(args, "profile", None)
    if serving.step_budget_ms is not None:
        if profile is None:
            raise UsageError(
                "--step-budget-ms needs --profile FILE: a `stallfree profile` of this machine, whose "
                "measured model predicts each candidate step's time"
            )
        from stallfree.costs.measured import MeasuredCostModel

        try:
            fields["step_time_predictor"] = MeasuredCostModel.from_file(profile).step_time_s
        except (OSError, ValueError) as exc:
            raise UsageError(f"--profile {profile}: {exc}") from None
    try:
        return EngineConfig(
            auto_token_budget=True,
            model=args.model,
            dtype=args.dtype,
            device=args.device,
            quantization=args.quantization,
            serving=serving,
            prompt_lookup_min=args.prompt_lookup_min,
            prompt_lookup_max=args.prompt_lookup_max,
            **fields,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
