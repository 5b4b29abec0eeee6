"""``stallfree profile``: measure the real engine on this machine, or a running server through its API
(``--base-url``, :mod:`stallfree.bench.profile`), into a step-profile JSON file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from stallfree.cli.common import (
    ENGINE_MODELS,
    UsageError,
    add_dtype_arg,
    add_quantization_arg,
    check_writable,
    positive_float,
    positive_int,
)

if TYPE_CHECKING:
    from stallfree.specs.step_profile import StepProfile

_DESCRIPTION = """\
Measure the PyTorch engine on this machine over a grid of synthetic steps that covers what the
scheduler produces: pure decode batches (1 .. --max-num-seqs) across contexts, prompt chunks
across sizes and earlier context, mixed steps, the sampler per row (greedy / temperature /
top-p), the linear layers alone, and real engine steps for the cost outside the model. Each
point repeats (median and IQR kept); a point during which other processes used more than
--busy-fraction of the CPU is re-measured, and the run warns if some never got quiet.
The JSON file (schema stallfree-step-profile v1, see stallfree.specs.step_profile) carries a
fingerprint: model, dtype, device and its name, threads, torch version, date.
Use it with --cost-model measured --profile FILE (simulate, tune, sweep, specs, explain) and
with stallfree validate.
"""

_EPILOG = """\
examples:
  stallfree profile --model random:medium --out medium.profile.json        # a few minutes on 2 cores
  stallfree profile --model random:tiny --quick --out tiny.profile.json    # seconds
  stallfree specs --profile medium.profile.json                            # what was measured
  stallfree profile --base-url http://localhost:8000 --max-num-batched-tokens 2048 \\
      --max-num-seqs 16 --model-config ./model --out vllm.profile.json    # a running server
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile",
        help="measure the real engine on this machine: a step profile for --cost-model measured",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        help=f"{ENGINE_MODELS} (default random:medium); with --base-url: the served model (default: its first)",
    )
    p.add_argument("--out", required=True, help="profile JSON file to write")
    add_dtype_arg(p)
    add_quantization_arg(p)
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    p.add_argument(
        "--max-num-seqs",
        type=positive_int,
        help="largest decode batch to measure (default 64; with --base-url 16: the server's own limit "
        "or less, recorded as given)",
    )
    p.add_argument("--quick", action="store_true", help="a sparse grid, 3 repeats (well under a minute)")
    p.add_argument(
        "--busy-fraction",
        type=positive_float,
        default=0.25,
        help="re-measure a point when other processes used more than this share of the CPU (default %(default)s)",
    )
    p.add_argument(
        "--max-attempts",
        type=positive_int,
        default=3,
        help="measurements of a busy point (a server's: an unsteady decode point) at most (default 3)",
    )
    p.add_argument("--no-progress", action="store_true", help="progress lines, not a bar, even on a terminal")
    _add_server_args(p)
    p.set_defaults(handler=run)


def _add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "a running server, black box (stallfree.bench.profile: streams' gaps, TTFT; the same schema)"
    )
    g.add_argument("--base-url", help="profile this OpenAI-compatible server instead of the engine")
    g.add_argument("--api-key", help="bearer token for the server")
    g.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        help="the server's token budget a step, as it was started with (default: assume 512); prompts "
        "up to it are single steps",
    )
    g.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another scheduler setting the server runs with, recorded in the fingerprint as given",
    )
    g.add_argument(
        "--model-config",
        help="the served model's HF config.json (or its folder): model dims for KV sizing (default: none)",
    )
    g.add_argument("--seed", type=int, help="seed of the prompt text (default: a new one each run)")
    g.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds per request (default %(default)s)"
    )
    g.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="send neither ignore_eos nor min_tokens (for servers that reject unknown fields)",
    )


def run(args: argparse.Namespace) -> int:
    from stallfree.specs.step_profile import save_profile

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    out = Path(args.out)
    check_writable(out, "--out")
    profile = _server_profile(args, log) if args.base_url else _engine_profile(args, log)
    counts = (
        f"{len(profile.steps)} steps, {len(profile.sampling)} sampling, {len(profile.linear)} linear, "
        f"{len(profile.overhead)} overhead points"
    )
    if profile.settings.get("partial"):
        path = save_profile(profile, out.with_suffix(".partial.json"))
        log(f"interrupted: wrote the {counts} measured so far to {path} (marked partial)")
        return 130
    problems = _fit_problems(profile)
    if problems:
        rejected = replace(profile, settings={**profile.settings, "rejected": problems})
        path = save_profile(rejected, out.with_suffix(".rejected.json"))
        for problem in problems:
            log(f"error: {problem}")
        log(
            f"error: not written to {out}: a model fitted to these measurements would mislead; they are in "
            f"{path} (refused by --profile). Profile again on a quieter machine"
        )
        return 1
    path = save_profile(profile, out)
    print(f"wrote {path}: {counts}; {profile.describe()}")
    return 0


def _engine_profile(args: argparse.Namespace, log: Callable[[str], None]) -> StepProfile:
    from stallfree.engine.profiler import ProfileOptions, run_profile

    options = ProfileOptions(
        model=args.model or "random:medium",
        dtype=args.dtype,
        device=args.device,
        quantization=args.quantization,
        threads=args.threads,
        max_num_seqs=args.max_num_seqs or 64,
        quick=args.quick,
        busy_fraction=args.busy_fraction,
        max_attempts=args.max_attempts,
    )
    return run_profile(options, progress=False if args.no_progress else None, log=log)


def _server_profile(args: argparse.Namespace, log: Callable[[str], None]) -> StepProfile:
    from stallfree.bench.profile import ServerProfileOptions, run_server_profile

    settings = dict(_setting(text) for text in args.server_setting)
    options = ServerProfileOptions(
        base_url=args.base_url,
        model=args.model,
        api_key=args.api_key,
        max_num_seqs=args.max_num_seqs or 16,
        token_budget=args.max_num_batched_tokens,
        scheduler=settings,
        model_config=args.model_config,
        quick=args.quick,
        ignore_eos=args.ignore_eos,
        timeout_s=args.timeout,
        seed=args.seed,
        max_attempts=args.max_attempts,
    )
    return run_server_profile(options, log)


def _setting(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise UsageError(f"--server-setting wants KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _fit_problems(profile: StepProfile) -> list[str]:
    from stallfree.costs.measured import MeasuredCostModel

    try:
        return MeasuredCostModel(profile).fit_problems()
    except ValueError as exc:  # too few points to fit at all
        return [str(exc)]
