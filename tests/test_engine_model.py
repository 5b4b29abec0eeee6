"""The engine's model matches Hugging Face transformers on the same saved checkpoint.

Every variant is saved with ``save_pretrained`` and loaded back both by transformers and
by our loader. Our logits come from the runner fed ragged steps: random chunk splits of
several sequences interleaved (prefill, chunked prefill, decodes of uneven lengths, mixed
steps), with KV blocks drawn from a shuffled pool so block tables are non-contiguous.
Each chunk's last-token logits must equal transformers' logits at that position of the
full sequence (teacher forcing). Tolerance: max |difference| <= 1e-4 in fp32 (logits are
O(1-10)).
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch
import transformers

from stallfree.core import ScheduledChunk, StepPlan
from stallfree.engine import attention, batch
from stallfree.engine.kv_cache import KVCache
from stallfree.engine.model import LlamaModel
from stallfree.engine.model_runner import ModelRunner
from stallfree.engine.native import (
    BF16_DOT_ENV,
    LINEAR_ENV,
    ChunkKernel,
    DecodeKernel,
    bf16_dot_products,
    chunk_kernel_for,
    decode_attention_kernel,
)
from stallfree.engine.random_models import random_spec
from stallfree.engine.tokenizer import random_tokenizer
from stallfree.engine.weights import build_random_model, load_model, save_pretrained

ATOL = 1e-4
TINY = random_spec("tiny")
VARIANTS = {
    "llama-gqa-untied": TINY,
    "qwen2-bias-tied": dataclasses.replace(
        TINY, architecture="Qwen2ForCausalLM", attention_bias=True, tie_word_embeddings=True
    ),
    "llama3-rope-mha": dataclasses.replace(
        TINY,
        num_kv_heads=TINY.num_attention_heads,
        rope_theta=500000.0,
        rope_scaling=(
            ("factor", 8.0),
            ("high_freq_factor", 4.0),
            ("low_freq_factor", 1.0),
            ("original_max_position_embeddings", 64),
            ("rope_type", "llama3"),
        ),
    ),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = VARIANTS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    save_pretrained(
        build_random_model(spec, torch.float32, "cpu", seed=7), random_tokenizer(spec.vocab_size), folder
    )
    return folder


def hf_model(folder: Path) -> torch.nn.Module:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def teacher_forced_logits(
    model: LlamaModel,
    seqs: dict[str, list[int]],
    rng: random.Random,
    block_size: int = 4,
    decode_kernel: DecodeKernel | None = None,
    chunk_kernel: ChunkKernel | None = None,
) -> dict[tuple[str, int], torch.Tensor]:
    """Run random ragged steps over ``seqs``; logits keyed by (request, position)."""
    spec = model.spec
    total_blocks = sum(-(-len(s) // block_size) for s in seqs.values())
    pool = list(range(total_blocks + 5))
    rng.shuffle(pool)
    runner = ModelRunner(
        model, KVCache(spec, len(pool), block_size, model.dtype), decode_kernel, chunk_kernel
    )
    computed = dict.fromkeys(seqs, 0)
    held = dict.fromkeys(seqs, 0)
    out: dict[tuple[str, int], torch.Tensor] = {}
    while any(computed[r] < len(s) for r, s in seqs.items()):
        active = [r for r in seqs if computed[r] < len(seqs[r])]
        chosen = rng.sample(active, rng.randint(1, len(active)))
        chunks, new_blocks = [], {}
        for rid in chosen:
            start = computed[rid]
            left = len(seqs[rid]) - start
            # Long chunks early (prefill), mostly single tokens later (decodes).
            n = rng.randint(1, left) if start == 0 or rng.random() < 0.3 else 1
            chunks.append(ScheduledChunk(rid, start, n, start + n))
            need = -(-(start + n) // block_size) - held[rid]
            if need:
                new_blocks[rid] = tuple(pool.pop() for _ in range(need))
                held[rid] += need
            computed[rid] = start + n
        rids, logits = runner.execute(StepPlan(tuple(chunks), new_blocks), seqs)
        for rid, row in zip(rids, logits, strict=True):
            out[(rid, computed[rid] - 1)] = row
    return out


@pytest.mark.parametrize("kernels", ["torch", "compiled"])
def test_ragged_paged_steps_match_transformers(checkpoint: Path, kernels: str) -> None:
    """fp32 through torch's ops, then through the compiled decode attention and panel matmuls."""
    kernel = None
    ours, _ = load_model(str(checkpoint), torch.float32, "cpu")
    if kernels == "compiled":
        kernel = decode_attention_kernel()
        assert kernel is not None, "the compiled kernels did not build (see the log)"
        assert ours.prepack_cpu_weights() and ours.weights.kind == "panels"
    ref = hf_model(checkpoint)
    rng = random.Random(0)
    vocab = ours.spec.vocab_size
    seqs = {f"r{i}": [rng.randrange(vocab) for _ in range(rng.randint(2, 70))] for i in range(6)}
    got = teacher_forced_logits(ours, seqs, rng, decode_kernel=kernel)
    assert {pos for (_, pos) in got}  # every step produced logits
    for rid, ids in seqs.items():
        expected = hf_logits(ref, ids)
        positions = sorted(pos for (r, pos) in got if r == rid)
        assert positions[-1] == len(ids) - 1
        for pos in positions:
            diff = (got[(rid, pos)] - expected[pos]).abs().max().item()
            assert diff <= ATOL, f"{rid} position {pos}: max |logit diff| {diff}"


@pytest.mark.parametrize("quantization", [None, "q8_0", "bf16"])
def test_the_whole_decoder_call_gives_the_layer_by_layer_numbers(
    checkpoint: Path, quantization: str | None
) -> None:
    """All-decode steps through csrc/decoder.cpp: bit for bit the logits of the layers run one by one."""
    kernel = decode_attention_kernel()
    assert kernel is not None, "the compiled kernels did not build (see the log)"
    models = []
    for _ in range(2):
        model, _ = load_model(str(checkpoint), torch.float32, "cpu")
        assert model.prepack_cpu_weights(quantization)
        models.append(model)
    decoder = models[0].native_decoder
    assert decoder is not None
    calls = []
    real_kernel = decoder.kernel

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return real_kernel(*args)

    decoder.kernel = counted
    models[1].native_decoder = None
    rng = random.Random(4)
    vocab = models[0].spec.vocab_size
    seqs = {f"r{i}": [rng.randrange(vocab) for _ in range(rng.randint(2, 50))] for i in range(5)}
    got = [teacher_forced_logits(m, seqs, random.Random(5), decode_kernel=kernel) for m in models]
    assert calls, "no step was all decodes"
    assert got[0].keys() == got[1].keys()
    for key in got[0]:
        assert torch.equal(got[0][key], got[1][key]), key


@pytest.mark.parametrize("dot", ["0", "1"])
def test_bf16_weights_of_a_bf16_checkpoint_give_the_fp32_logits(
    checkpoint: Path, dot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--quantization bf16 keeps half the bytes of a checkpoint whose weights are bf16 values and
    computes in fp32: those values' logits run as fp32 panels, to the summation order (with
    AVX512-BF16's pair dot products, to bf16 rounding of the activations of prefill rows and of
    their attention's inputs: the chunk kernel the engine then uses)."""
    monkeypatch.setenv(BF16_DOT_ENV, dot)
    kernel = decode_attention_kernel()
    assert kernel is not None, "the compiled kernels did not build (see the log)"
    models = []
    for quantization in (None, "bf16"):
        model, _ = load_model(str(checkpoint), torch.float32, "cpu")
        for param in model.parameters():
            param.data = param.data.bfloat16().float()  # a bf16 checkpoint, loaded in fp32
        assert model.prepack_cpu_weights(quantization)
        models.append(model)
    assert models[1].weights.kind == "bf16"
    assert models[1].weights.packed(models[1].layers[0].qkv_proj)[0].dtype == torch.bfloat16
    rng = random.Random(6)
    vocab = models[0].spec.vocab_size
    seqs = {f"r{i}": [rng.randrange(vocab) for _ in range(rng.randint(2, 50))] for i in range(5)}
    cpu, head_dim = torch.device("cpu"), models[0].spec.head_dim
    chunk_kernels = [chunk_kernel_for(cpu, torch.float32, m.weights.kind, head_dim) for m in models]
    assert chunk_kernels[0] is None and (chunk_kernels[1] is not None) == bf16_dot_products()
    got = [
        teacher_forced_logits(m, seqs, random.Random(7), decode_kernel=kernel, chunk_kernel=chunk)
        for m, chunk in zip(models, chunk_kernels, strict=True)
    ]
    assert got[0].keys() == got[1].keys()
    tolerance = 0.05 if bf16_dot_products() else ATOL
    for key in got[0]:
        diff = (got[0][key] - got[1][key]).abs().max().item()
        assert diff <= tolerance, f"{key}: max |logit diff| {diff}"


def test_a_chunk_after_earlier_context_merges_two_flash_calls_into_the_masked_numbers(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU a chunk after earlier context attends by two flash calls merged by their
    log-sum-exps, with no mask: the logits of attending under the mask."""
    assert attention.merges_chunk_attention(torch.device("cpu"))
    model, _ = load_model(str(checkpoint), torch.float32, "cpu")
    rng = random.Random(8)
    vocab = model.spec.vocab_size
    seqs = {f"r{i}": [rng.randrange(vocab) for _ in range(rng.randint(20, 60))] for i in range(4)}
    calls = []
    flash = attention._cpu_flash

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return flash(*args, **kwargs)

    monkeypatch.setattr(attention, "_cpu_flash", counted)
    merged = teacher_forced_logits(model, seqs, random.Random(9))
    assert calls, "no chunk after earlier context"
    monkeypatch.setattr(batch, "merges_chunk_attention", lambda device: False)
    masked = teacher_forced_logits(model, seqs, random.Random(9))
    assert merged.keys() == masked.keys()
    for key in merged:
        assert (merged[key] - masked[key]).abs().max().item() <= 1e-5, key


def test_whole_prompt_logits_match_transformers(checkpoint: Path) -> None:
    ours, tokenizer = load_model(str(checkpoint), torch.float32, "cpu")
    ids = tokenizer.encode("the quick brown fox jumps over the lazy dog " * 3)
    runner = ModelRunner(ours, KVCache(ours.spec, 16, 16, torch.float32))
    chunk = ScheduledChunk("a", 0, len(ids), len(ids))
    _, logits = runner.execute(StepPlan((chunk,), {"a": tuple(range(-(-len(ids) // 16)))}), {"a": ids})
    expected = hf_logits(hf_model(checkpoint), ids)[-1]
    assert (logits[0] - expected).abs().max().item() <= ATOL
    assert logits[0].argmax().item() == expected.argmax().item()


def test_bf16_model_runs_close_to_fp32(tmp_path: Path) -> None:
    fp32 = build_random_model(TINY, torch.float32, "cpu", seed=3)
    bf16 = build_random_model(TINY, torch.bfloat16, "cpu", seed=3)
    ids = list(range(3, 40))
    results = []
    for model in (fp32, bf16):
        runner = ModelRunner(model, KVCache(TINY, 4, 16, model.dtype))
        _, logits = runner.execute(
            StepPlan((ScheduledChunk("a", 0, len(ids), len(ids)),), {"a": (0, 1, 2)}), {"a": ids}
        )
        results.append(logits[0])
    assert results[1].dtype == torch.float32  # logits are always returned in fp32
    assert torch.corrcoef(torch.stack(results))[0, 1].item() > 0.99


def test_saved_checkpoint_is_a_plain_hf_folder(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"][0] in ("LlamaForCausalLM", "Qwen2ForCausalLM")
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    _, ours = load_model(str(checkpoint), torch.float32, "cpu")
    text = "Hello kalo mefi, 42!"
    assert hf_tokenizer(text)["input_ids"] == ours.encode(text)


@pytest.mark.parametrize(
    ("variant", "dtype", "kind"),
    [
        ("llama-gqa-untied", torch.bfloat16, "onednn"),
        ("qwen2-bias-tied", torch.bfloat16, "onednn"),
        ("llama-gqa-untied", torch.float32, "onednn"),
        ("llama-gqa-untied", torch.float32, "panels"),
        ("qwen2-bias-tied", torch.float32, "panels"),
    ],
)
def test_prepacked_weights_give_the_plain_logits(
    variant: str, dtype: torch.dtype, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16: bit for bit. fp32's packed kernels sum in another order: within rounding, same argmax."""
    if kind == "onednn":
        monkeypatch.setenv(LINEAR_ENV, "0")
    spec = VARIANTS[variant]
    plain = build_random_model(spec, dtype, "cpu", seed=2)
    packed = build_random_model(spec, dtype, "cpu", seed=2)
    if not packed.prepack_cpu_weights():
        pytest.skip("no oneDNN weight packing in this torch build")
    assert packed.weights.kind == kind
    rng = random.Random(1)
    seqs = {f"r{i}": [rng.randrange(spec.vocab_size) for _ in range(rng.randint(2, 40))] for i in range(4)}
    got = [teacher_forced_logits(m, seqs, random.Random(3)) for m in (plain, packed)]
    assert got[0].keys() == got[1].keys()
    for key in got[0]:
        if dtype == torch.bfloat16:
            assert torch.equal(got[0][key], got[1][key])
        else:
            assert (got[0][key] - got[1][key]).abs().max().item() <= 1e-4
            assert got[0][key].argmax() == got[1][key].argmax()
