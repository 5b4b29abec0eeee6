"""A short, prepared check of the engine's CUDA path (run it when a GPU machine is lent).

1. Correctness on the GPU: a tiny fp32 random model saved as an HF checkpoint; our logits
   (ragged chunked steps through the paged cache) vs transformers on the same GPU, and
   greedy tokens of LLM.generate vs transformers' greedy loop. TF32 is switched off so
   fp32 means fp32; tolerance 1e-3 (GPU reductions differ in order from the CPU's).
2. Speed: bf16 decode throughput at 16 and 64 streams vs transformers' generate, and the
   fraction of the measured roofline (benchmarks/engine/engine_decode_throughput.py).

    python benchmarks/engine/engine_gpu_check.py [--model random:large] [--json gpu.json]

Exits non-zero on a correctness failure; prints one JSON line per result.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from stallfree.core import SamplingParams
from stallfree.engine import LLM
from stallfree.engine.random_models import random_spec
from stallfree.engine.tokenizer import random_tokenizer
from stallfree.engine.weights import build_random_model, save_pretrained

ATOL = 1e-3


def check_correctness(device: str) -> dict[str, object]:
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    spec = random_spec("tiny")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_pretrained(
            build_random_model(spec, torch.float32, "cpu", seed=5), random_tokenizer(spec.vocab_size), folder
        )
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
        llm = LLM(str(folder), dtype="float32", device=device, num_blocks=256, block_size=4, token_budget=7)
        prompts = ["Hello there", "kalo mefi tu ba " * 6, "a"]
        outputs = llm.generate(
            prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=True)
        )
        max_logprob_diff = 0.0
        greedy_equal = True
        for out in outputs:
            ids = list(out.prompt_token_ids) + list(out.token_ids)
            with torch.no_grad():
                logits = hf(torch.tensor([ids], device=device)).logits[0].float()
            start = len(out.prompt_token_ids) - 1
            hf_next = logits[start:-1].argmax(-1).tolist()
            greedy_equal &= hf_next == list(out.token_ids)
            hf_logprobs = torch.log_softmax(logits[start:-1], -1).gather(
                1, torch.tensor(out.token_ids, device=device)[:, None]
            )
            assert out.logprobs is not None
            diff = (hf_logprobs.squeeze(1).cpu() - torch.tensor(out.logprobs)).abs().max().item()
            max_logprob_diff = max(max_logprob_diff, diff)
    return {
        "check": "correctness",
        "device": device,
        "greedy_tokens_equal": greedy_equal,
        "max_logprob_diff": max_logprob_diff,
        "ok": greedy_equal and max_logprob_diff <= ATOL,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="random:large")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 1
    result = check_correctness("cuda")
    print(json.dumps(result))
    bench = Path(__file__).with_name("engine_decode_throughput.py")
    command = [sys.executable, str(bench), "--device", "cuda", "--model", args.model, "--streams", "16,64"]
    if args.json:
        command += ["--json", str(args.json)]
    speed = subprocess.run(command, check=False)
    return 0 if result["ok"] and speed.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
