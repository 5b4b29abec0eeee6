"""Write small GGUF files from stallfree models, the way llama.cpp's converter lays them out.

The tests' own writer (through ``gguf.GGUFWriter``): HF tensors renamed to GGUF's names,
llama-architecture q/k rows permuted into GGML's interleaved RoPE order, matrices stored in
the chosen ggml type, norms and biases in F32, the tokenizer as a ``gpt2`` BPE vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import quantize

from stallfree.engine.gguf import gguf_name
from stallfree.engine.model import LlamaModel
from stallfree.engine.tokenizer import Tokenizer
from stallfree.engine.weights import hf_state_dict

GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


def permute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """HF's half-split q/k rows -> GGML's interleaved order (what the converter writes)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(
    path: Path,
    model: LlamaModel,
    tokenizer: Tokenizer,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    arch: str | None = None,
) -> Path:
    spec = model.spec
    arch = arch or GGUF_ARCH[spec.architecture]
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(spec.num_layers)
    writer.add_context_length(spec.max_position_embeddings)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_feed_forward_length(spec.intermediate_size)
    writer.add_head_count(spec.num_attention_heads)
    writer.add_head_count_kv(spec.num_kv_heads)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_norm_eps)
    writer.add_vocab_size(spec.vocab_size)
    _add_tokenizer(writer, tokenizer, spec.bos_token_id, spec.eos_token_ids)
    for hf_name, tensor in hf_state_dict(model).items():
        values = tensor.float().numpy()
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = spec.num_attention_heads if "q_proj" in hf_name else spec.num_kv_heads
            values = permute_rope_rows(values, heads)
        name = gguf_name(hf_name)
        if values.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            writer.add_tensor(name, _quantized(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _quantized(values: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """``values`` in ``qtype``; zero blocks for types the gguf package cannot quantize to
    (enough for the tests that expect such a file to be refused)."""
    try:
        return np.asarray(quantize(values, qtype))
    except NotImplementedError:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return np.zeros((*values.shape[:-1], values.shape[-1] // block * size), dtype=np.uint8)


def _add_tokenizer(
    writer: gguf.GGUFWriter, tokenizer: Tokenizer, bos: int | None, eos: tuple[int, ...]
) -> None:
    bpe = json.loads(tokenizer.inner.to_str())["model"]
    vocab: dict[str, int] = bpe["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]]
    special = {t.content for t in tokenizer.inner.get_added_tokens_decoder().values() if t.special}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    if bos is not None:
        writer.add_bos_token_id(bos)
        writer.add_add_bos_token(True)
    writer.add_eos_token_id(eos[0])
    if tokenizer.chat_template is not None:
        writer.add_chat_template(tokenizer.chat_template)


def randomize_norms(model: LlamaModel, seed: int = 1) -> None:
    """Random models have unit norm weights; make them differ so a mix-up would show."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 and not name.endswith("bias"):
                param.add_(torch.randn(param.shape, generator=generator).to(param.dtype) * 0.1)
