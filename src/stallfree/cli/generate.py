"""``stallfree generate`` (text from the PyTorch engine) and ``stallfree save-model``.

torch is imported inside the handlers only, so ``stallfree --help`` stays light.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stallfree.cli.common import UsageError, add_engine_args, engine_kwargs, non_negative_int, positive_int
from stallfree.cli.device import check_device


def register(subparsers: Any) -> None:
    gen = subparsers.add_parser(
        "generate",
        help="generate text with the PyTorch engine (random:<preset> or a local HF folder)",
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
    llm = LLM(args.model, **engine_kwargs(args))
    prompts: list[str] | list[list[int]] = args.prompt
    if args.chat:
        tokenizer = llm.engine.tokenizer
        prompts = [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in args.prompt]
    outputs = llm.generate(prompts, params)
    for prompt, out in zip(args.prompt, outputs, strict=True):
        if args.json:
            record = {
                "prompt": prompt,
                "text": out.text,
                "token_ids": list(out.token_ids),
                "prompt_token_ids": list(out.prompt_token_ids),
                "finish_reason": out.finish_reason,
            }
            print(json.dumps(record))
        else:
            print(out.text)
    return 0


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
