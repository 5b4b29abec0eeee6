"""GGUF checkpoints (llama.cpp's format) into the engine: spec, tokenizer and dequantized weights.

:func:`open_gguf` reads the spec from the header (:mod:`stallfree.specs.gguf`), the
tokenizer and chat template from the metadata (:mod:`stallfree.engine.gguf_tokenizer`), and
gives a reader of every tensor through the ``gguf`` package's dequantizer. The weights go in
through :func:`stallfree.engine.weights.load_hf_weights` under Hugging Face's names (fp32,
converted to the engine's dtype there), so one place knows our parameter layout.

Two things llama.cpp's converter does to a checkpoint are undone here: it renames tensors
(``blk.0.attn_q.weight``), and for llama-architecture models it permutes the rows of
``attn_q``/``attn_k`` within each head from HF's half-split RoPE layout to GGML's
interleaved one (pairs of rotated dimensions adjacent). Qwen2 is converted unpermuted. Llama
3.1's RoPE scaling is stored as a ``rope_freqs.weight`` tensor of per-frequency divisors,
applied to the model's inverse frequencies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stallfree.engine.gguf_tokenizer import gguf_tokenizer
from stallfree.engine.tokenizer import Tokenizer
from stallfree.specs import ModelSpec
from stallfree.specs.gguf import GGUFHeader, hf_config_from_gguf, read_gguf

# ggml types the engine dequantizes (llama.cpp's numbering; names as gguf.GGMLQuantizationType).
SUPPORTED_GGML_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    30: "BF16",
}
_ROPE_PERMUTED_ARCHS = ("llama", "mistral")

# HF name suffix -> GGUF name suffix, per decoder layer.
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


@dataclass(frozen=True, slots=True)
class GGUFCheckpoint:
    """What a GGUF file holds, ready for :func:`stallfree.engine.weights.load_model` to build
    the model from: ``read`` maps HF tensor names to fp32 tensors in HF's layout;
    ``rope_freq_divisors`` (Llama 3.1's ``rope_freqs.weight``) divide the inverse frequencies."""

    spec: ModelSpec
    tokenizer: Tokenizer
    read: Callable[[str], torch.Tensor]
    rope_freq_divisors: torch.Tensor | None


def open_gguf(path: Path) -> GGUFCheckpoint:
    """Spec, tokenizer and a tensor reader of a GGUF file; one-line ValueError for what it cannot run."""
    if not path.is_file():
        raise ValueError(f"GGUF file not found: {path}")
    header = read_gguf(path)
    spec = ModelSpec.from_hf_config(hf_config_from_gguf(header), name=path.stem)
    _check_types(header)
    tokenizer = gguf_tokenizer(header.metadata, path.name)
    divisors = None
    if "rope_freqs.weight" in header.tensors:
        divisors = read_gguf_tensor(header, "rope_freqs.weight")
        if tuple(divisors.shape) != (spec.head_dim // 2,):
            raise ValueError(f"{path.name}: rope_freqs.weight has shape {tuple(divisors.shape)}")
    return GGUFCheckpoint(spec, tokenizer, gguf_tensor_reader(header, spec), divisors)


def gguf_tensor_reader(header: GGUFHeader, spec: ModelSpec) -> Callable[[str], torch.Tensor]:
    """HF tensor name -> that tensor of the GGUF file, dequantized to fp32, in HF's layout."""
    permuted = header.architecture in _ROPE_PERMUTED_ARCHS

    def read(hf_name: str) -> torch.Tensor:
        name = gguf_name(hf_name)
        if name not in header.tensors:
            raise ValueError(f"{header.path.name} lacks tensor {name} ({hf_name})")
        tensor = read_gguf_tensor(header, name)
        if permuted and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = spec.num_attention_heads if "q_proj" in hf_name else spec.num_kv_heads
            tensor = unpermute_rope_rows(tensor, heads)
        return tensor

    return read


def gguf_name(hf_name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    prefix, _, rest = hf_name.partition("model.layers.")
    layer, _, suffix = rest.partition(".")
    if prefix or not layer.isdigit() or suffix not in _LAYER_NAMES:
        raise ValueError(f"no GGUF name for tensor {hf_name}")
    return f"blk.{layer}.{_LAYER_NAMES[suffix]}"


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: within each head, GGUF row ``2*j + i`` is HF row
    ``i * head_dim/2 + j`` (the converter interleaves the two rotated halves)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def _check_types(header: GGUFHeader) -> None:
    unsupported = {
        info.ggml_type: info.name
        for info in header.tensors.values()
        if info.ggml_type not in SUPPORTED_GGML_TYPES
    }
    if unsupported:
        import gguf

        kind, example = next(iter(unsupported.items()))
        try:
            kind_name = gguf.GGMLQuantizationType(kind).name
        except ValueError:
            kind_name = f"type {kind}"
        raise ValueError(
            f"{header.path.name}: GGUF quant type {kind_name} (e.g. tensor {example}) is not supported "
            f"(supported: {', '.join(SUPPORTED_GGML_TYPES.values())})"
        )


def read_gguf_tensor(header: GGUFHeader, name: str) -> torch.Tensor:
    """One tensor of the file as stored (GGUF row order), dequantized to fp32."""
    import gguf
    from gguf.quants import dequantize

    info = header.tensors[name]
    kind = gguf.GGMLQuantizationType(info.ggml_type)
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    count = int(np.prod(info.shape))
    if info.shape[-1] % block_size:
        raise ValueError(f"{header.path.name}: tensor {name} rows are not whole {kind.name} blocks")
    raw: Any = np.memmap(
        header.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(count // block_size * type_size,)
    )
    rows = raw.reshape(-1, info.shape[-1] // block_size * type_size)
    values = np.ascontiguousarray(dequantize(rows, kind).reshape(info.shape), dtype=np.float32)
    if not values.flags.writeable:  # F32 comes back as a view of the read-only map
        values = values.copy()
    return torch.from_numpy(values)
