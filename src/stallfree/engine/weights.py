"""Weights in and out: Hugging Face folders (config.json + safetensors) and ``random:`` models.

:func:`load_model` is the one entry point the engine uses: ``random:<preset>`` builds a
seeded random model in process, a ``.gguf`` file (or a short name such as ``smollm2``) goes
to :mod:`stallfree.engine.gguf`, anything else must be a local Hugging Face folder with
``config.json``, ``model.safetensors`` (or shards listed in ``model.safetensors.index.json``)
and ``tokenizer.json``. :func:`save_pretrained` writes a model back in the same format,
with Hugging Face's parameter names, so transformers loads it unchanged.

Name mapping: HF keeps q/k/v and gate/up as separate matrices; our model fuses each
group into one matrix (one matmul per step), concatenated along the output dimension in
the order q, k, v and gate, up.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from stallfree.engine.model import LlamaModel, init_random_weights
from stallfree.engine.random_models import random_spec
from stallfree.engine.tokenizer import Tokenizer, random_tokenizer
from stallfree.specs import ModelSpec, load_model_spec
from stallfree.specs.gguf import is_gguf_path, resolve_known_gguf

RANDOM_PREFIX = "random:"
_INDEX_FILE = "model.safetensors.index.json"
_SINGLE_FILE = "model.safetensors"


def load_model(
    name_or_path: str, dtype: torch.dtype, device: torch.device | str, seed: int = 0
) -> tuple[LlamaModel, Tokenizer]:
    """``random:<preset>``, a GGUF file (path or short name like ``smollm2``) or a local HF folder
    -> (model, tokenizer); one-line ValueError on bad input."""
    if name_or_path.startswith(RANDOM_PREFIX):
        spec = random_spec(name_or_path[len(RANDOM_PREFIX) :])
        return build_random_model(spec, dtype, device, seed), random_tokenizer(spec.vocab_size)
    gguf_path = resolve_known_gguf(name_or_path)
    if gguf_path is not None or is_gguf_path(name_or_path):
        return _load_gguf(gguf_path or Path(name_or_path).expanduser(), dtype, device)
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        raise ValueError(
            f"model {name_or_path!r} is not random:<preset>, a GGUF file (a .gguf path or smollm2) "
            "nor a local HF folder"
        )
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{folder} has no config.json: not a Hugging Face model folder")
    spec = load_model_spec(str(config_path))  # the one config reader, shared with the simulator
    spec = dataclasses.replace(spec, eos_token_ids=_eos_token_ids(spec, folder / "generation_config.json"))
    tokenizer = Tokenizer.from_folder(folder)
    model = LlamaModel(spec, dtype, device)
    load_hf_weights(model, _tensor_reader(folder))
    return model, tokenizer


def _load_gguf(path: Path, dtype: torch.dtype, device: torch.device | str) -> tuple[LlamaModel, Tokenizer]:
    from stallfree.engine.gguf import open_gguf

    checkpoint = open_gguf(path)
    model = LlamaModel(checkpoint.spec, dtype, "cpu")  # filled on the CPU, then moved
    load_hf_weights(model, checkpoint.read)
    if checkpoint.rope_freq_divisors is not None:
        model.inv_freq.div_(checkpoint.rope_freq_divisors)
    return model.to(device), checkpoint.tokenizer


def build_random_model(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device | str, seed: int = 0
) -> LlamaModel:
    """A model with seeded random weights (the same seed gives the same weights on any device)."""
    model = LlamaModel(spec, dtype, "cpu")
    init_random_weights(model, seed)
    return model.to(device)


def hf_state_dict(model: LlamaModel) -> dict[str, torch.Tensor]:
    """Our parameters under Hugging Face's names, fused matrices split back apart."""
    if model.is_prepacked:
        raise ValueError("this model's weights are pre-packed for oneDNN and can no longer be saved")
    spec = model.spec
    out: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": model.embed_tokens,
        "model.norm.weight": model.norm,
    }
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head
    for i, layer in enumerate(model.decoder_layers()):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = layer.input_layernorm
        out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm
        q, k, v = torch.split(layer.qkv_proj, [spec.q_size, spec.kv_size, spec.kv_size])
        out |= {
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v,
        }
        if layer.qkv_bias is not None:
            qb, kb, vb = torch.split(layer.qkv_bias, [spec.q_size, spec.kv_size, spec.kv_size])
            out |= {
                p + "self_attn.q_proj.bias": qb,
                p + "self_attn.k_proj.bias": kb,
                p + "self_attn.v_proj.bias": vb,
            }
        out[p + "self_attn.o_proj.weight"] = layer.o_proj
        gate, up = layer.gate_up_proj.chunk(2)
        out |= {p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up}
        out[p + "mlp.down_proj.weight"] = layer.down_proj
    return {name: t.detach().contiguous().clone() for name, t in out.items()}


@torch.no_grad()
def load_hf_weights(model: LlamaModel, read: Callable[[str], torch.Tensor]) -> None:
    """Fill ``model`` from tensors named as Hugging Face names them (``read`` raises if absent)."""

    def put(target: torch.Tensor, *names: str) -> None:
        parts = [read(name) for name in names]
        source = parts[0] if len(parts) == 1 else torch.cat(parts)
        if source.shape != target.shape:
            raise ValueError(
                f"checkpoint tensor {'+'.join(names)} has shape {tuple(source.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(source.to(target.dtype))

    put(model.embed_tokens, "model.embed_tokens.weight")
    put(model.norm, "model.norm.weight")
    if model.lm_head is not None:
        put(model.lm_head, "lm_head.weight")
    for i, layer in enumerate(model.decoder_layers()):
        p = f"model.layers.{i}."
        put(layer.input_layernorm, p + "input_layernorm.weight")
        put(layer.post_attention_layernorm, p + "post_attention_layernorm.weight")
        put(layer.qkv_proj, *(p + f"self_attn.{x}_proj.weight" for x in "qkv"))
        if layer.qkv_bias is not None:
            put(layer.qkv_bias, *(p + f"self_attn.{x}_proj.bias" for x in "qkv"))
        put(layer.o_proj, p + "self_attn.o_proj.weight")
        put(layer.gate_up_proj, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        put(layer.down_proj, p + "mlp.down_proj.weight")


def save_pretrained(model: LlamaModel, tokenizer: Tokenizer, folder: Path) -> None:
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json."""
    from safetensors.torch import save_file

    tensors = hf_state_dict(model)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.spec.to_hf_config()
    config["torch_dtype"] = str(model.dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(folder / _SINGLE_FILE), metadata={"format": "pt"})
    tokenizer.save(folder, model.spec.max_position_embeddings)


def _tensor_reader(folder: Path) -> Callable[[str], torch.Tensor]:
    """name -> tensor over a single file or an index of shards; checks every shard exists first."""
    from safetensors import safe_open

    index_path = folder / _INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"cannot read {index_path}: {exc!r}") from None
        files = {name: folder / shard for name, shard in weight_map.items()}
    elif (folder / _SINGLE_FILE).is_file():
        with safe_open(str(folder / _SINGLE_FILE), framework="pt") as handle:
            files = {name: folder / _SINGLE_FILE for name in handle.keys()}  # noqa: SIM118 - not a dict
    else:
        raise ValueError(
            f"{folder} has no {_SINGLE_FILE} or {_INDEX_FILE} (only safetensors weights are supported)"
        )
    missing = sorted({p.name for p in files.values() if not p.is_file()})
    if missing:
        raise ValueError(f"{folder} is missing safetensors shard(s): {', '.join(missing)}")
    handles: dict[Path, Any] = {}

    def read(name: str) -> torch.Tensor:
        path = files.get(name)
        if path is None:
            raise ValueError(f"checkpoint in {folder} lacks tensor {name}")
        if path not in handles:
            handles[path] = safe_open(str(path), framework="pt")
        tensor: torch.Tensor = handles[path].get_tensor(name)
        return tensor

    return read


def _eos_token_ids(spec: ModelSpec, generation_config: Path) -> tuple[int, ...]:
    """config.json's EOS ids plus generation_config.json's (chat models list their
    end-of-turn token only there, e.g. Llama 3 Instruct's <|eot_id|>)."""
    try:
        eos = json.loads(generation_config.read_text()).get("eos_token_id")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return spec.eos_token_ids
    extra = (
        [eos]
        if isinstance(eos, int)
        else [e for e in eos if isinstance(e, int)]
        if isinstance(eos, list)
        else []
    )
    return tuple(dict.fromkeys([*spec.eos_token_ids, *extra]))
