"""``stallfree generate`` (text from the PyTorch engine) and ``stallfree save-model``.

``generate`` streams: every prompt runs at once in the engine, and the text is written as the
engine steps, prompt after prompt in order (a later prompt's text waits in memory until the ones
before it end, then catches up). Ctrl-C keeps what was generated: the text so far is printed
(with ``--json``, the records, ``finish_reason`` ``"abort"`` for the unfinished), exit 130 (143 after a SIGTERM).
torch is imported inside the handlers only, so ``stallfree --help`` stays light.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallfree.cli.common import (
    ENGINE_MODELS,
    UsageError,
    non_negative_int,
    positive_int,
)
from stallfree.cli.device import check_device
from stallfree.cli.serving_args import add_engine_args, engine_config

if TYPE_CHECKING:
    from stallfree.engine.engine import LLMEngine
    from stallfree.engine.requests import RequestOutput


def register(subparsers: Any) -> None:
    gen = subparsers.add_parser(
        "generate",
        help=f"generate text with the PyTorch engine ({ENGINE_MODELS})",
        description="Run prompts through the real engine, scheduled by the stall-free scheduler.",
    )
    add_engine_args(gen)
    gen.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for a batch)")
    gen.add_argument("--max-tokens", type=positive_int, default=32, help="tokens to generate per prompt")
    gen.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    gen.add_argument("--top-k", type=non_negative_int, default=0, help="0 = no top-k cut")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None, help="sampling seed of every prompt")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    gen.add_argument(
        "--chat", action="store_true", help="wrap each prompt as a user turn of the chat template"
    )
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt")
    gen.set_defaults(handler=run_generate)

    save = subparsers.add_parser(
        "save-model",
        help="write a random:<preset> model as a Hugging Face checkpoint folder",
        description="Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json.",
    )
    save.add_argument("model", help="random:<preset> (tiny, small, medium, large)")
    save.add_argument("directory", type=Path)
    save.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    save.add_argument("--seed", type=int, default=0, help="weight seed")
    save.set_defaults(handler=run_save_model)


def run_generate(args: argparse.Namespace) -> int:
    from stallfree.core import SamplingParams
    from stallfree.engine import LLM

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
    )
    check_device(args.device)
    llm = LLM(engine_config(args))
    engine = llm.engine
    prompts: list[str] | list[list[int]] = args.prompt
    if args.chat:
        tokenizer = engine.tokenizer
        prompts = [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in args.prompt]
    request_ids = _add_all(engine, prompts, params)
    # said once every prompt is accepted (a refusal is one line)
    print(f"stallfree generate: {engine.describe_budget()}", file=sys.stderr)
    print(f"  {engine.describe_format()}", file=sys.stderr, flush=True)
    latest: dict[str, RequestOutput] = {}
    holdback = max((len(stop) for stop in params.stop), default=1) - 1
    printer = _Printer(request_ids, holdback) if not args.json else None
    try:
        while engine.has_unfinished_requests():
            for out in engine.step().outputs:
                latest[out.request_id] = out
                if printer is not None:
                    printer.update(out)
    except KeyboardInterrupt:
        for rid in request_ids:
            with contextlib.suppress(Exception):  # whatever state the interrupted step left
                engine.abort_request(rid)
        if printer is not None:
            printer.flush_all(latest)
        else:
            _print_json(args.prompt, request_ids, latest)
        print("stallfree generate: interrupted; the text above is what was generated", file=sys.stderr)
        return 130
    if args.json:
        _print_json(args.prompt, request_ids, latest)
    return 0


def _add_all(engine: LLMEngine, prompts: Sequence[str | Sequence[int]], params: Any) -> list[str]:
    """Queue every prompt; a bad one leaves nothing queued."""
    request_ids: list[str] = []
    try:
        for prompt in prompts:
            if isinstance(prompt, str):
                request_ids.append(engine.add_request(prompt=prompt, sampling_params=params))
            else:
                request_ids.append(engine.add_request(prompt_token_ids=list(prompt), sampling_params=params))
    except ValueError:
        for rid in request_ids:
            engine.abort_request(rid)
        raise
    return request_ids


class _Printer:
    """Writes each request's text in prompt order: the current one live, later ones on catching up."""

    def __init__(self, request_ids: list[str], holdback: int) -> None:
        self.request_ids = request_ids
        # An unfinished text's last ``holdback`` characters may start a stop string that the
        # engine will cut away: they wait (stop strings up to holdback + 1 characters long).
        self.holdback = holdback
        self.current = 0
        self.written: dict[str, int] = {}  # characters of each request's text already written
        self.finished: set[str] = set()
        self.texts: dict[str, str] = {}

    def update(self, out: RequestOutput) -> None:
        self.texts[out.request_id] = out.text
        if out.finished:
            self.finished.add(out.request_id)
        self._advance()

    def _advance(self) -> None:
        while self.current < len(self.request_ids):
            rid = self.request_ids[self.current]
            if rid not in self.finished:
                self._write(rid, self.holdback)
                return
            self._write(rid)
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.current += 1

    def _write(self, rid: str, holdback: int = 0) -> None:
        text = self.texts.get(rid, "")
        text = text[: len(text) - holdback] if holdback else text
        done = self.written.get(rid, 0)
        if len(text) > done:
            sys.stdout.write(text[done:])
            sys.stdout.flush()
            self.written[rid] = len(text)

    def flush_all(self, latest: dict[str, RequestOutput]) -> None:
        """After an interrupt: every request's text so far, each on its own line."""
        for out in latest.values():
            self.texts[out.request_id] = out.text
        for rid in self.request_ids[self.current :]:
            self._write(rid)
            sys.stdout.write("\n")
        sys.stdout.flush()
        self.current = len(self.request_ids)


def _print_json(prompts: list[str], request_ids: list[str], latest: dict[str, RequestOutput]) -> None:
    for prompt, rid in zip(prompts, request_ids, strict=True):
        out = latest.get(rid)
        finished = out is not None and out.finished
        record = {
            "prompt": prompt,
            "text": out.text if out is not None else "",
            "token_ids": list(out.token_ids) if out is not None else [],
            "prompt_token_ids": list(out.prompt_token_ids) if out is not None else None,
            "finish_reason": out.finish_reason if finished and out is not None else "abort",
        }
        print(json.dumps(record))


def run_save_model(args: argparse.Namespace) -> int:
    from stallfree.engine.weights import RANDOM_PREFIX, load_model, save_pretrained

    if not args.model.startswith(RANDOM_PREFIX):
        raise UsageError(f"save-model writes random:<preset> models only, got {args.model!r}")
    directory: Path = args.directory
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UsageError(f"{directory} exists and is not an empty folder")
    import torch

    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    model, tokenizer = load_model(args.model, dtype, "cpu", seed=args.seed)
    save_pretrained(model, tokenizer, directory)
    print(f"wrote {args.model} ({model.spec.num_params / 1e6:.1f} M parameters, {args.dtype}) to {directory}")
    return 0
