"""Model specs: the shape of a Llama-family decoder LLM, from presets or a Hugging Face config.

Owns :class:`ModelSpec` (a frozen value read by the cost models and the PyTorch engine) and
:func:`load_model_spec`. Supported: ``LlamaForCausalLM``, ``MistralForCausalLM`` and
``Qwen2ForCausalLM`` with SiLU-gated MLPs, RMSNorm and RoPE (the engine runs these), and for the
simulator ``Qwen3ForCausalLM`` and the mixture-of-experts ``MixtralForCausalLM`` and
``Qwen3MoeForCausalLM`` (every layer's MLP is ``moe_num_experts`` gated experts of
``moe_intermediate_size``, ``moe_experts_per_token`` of them per token). Anything else (encoders,
encoder-decoders, shared experts, MLA, sliding-window attention, biased MLPs) is rejected with a
one-line ``ValueError`` rather than modelled wrongly.

Invariants: every size is positive; ``num_attention_heads`` is a multiple of ``num_kv_heads``;
``rope_scaling`` is a key-sorted tuple of scalar pairs (hashable), or ``None``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# architecture -> HF model_type. Qwen2 always has q/k/v biases; Llama/Mistral never do here.
ARCHITECTURES: Mapping[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
ENGINE_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# config.json's expert counts, by architecture: (experts, experts per token, expert MLP width)
_MOE_KEYS: Mapping[str, tuple[str, str, str]] = {
    "MixtralForCausalLM": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "Qwen3MoeForCausalLM": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
}
_ARCH_BY_MODEL_TYPE = {model_type: arch for arch, model_type in ARCHITECTURES.items()}

RopeScaling = tuple[tuple[str, float | str], ...]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A Llama-family decoder. Field names follow HF's, shortened where noted.

    ``num_layers`` is HF's ``num_hidden_layers``; ``num_kv_heads`` is ``num_key_value_heads``;
    ``attention_bias`` means the q/k/v projections carry biases (Qwen2); ``eos_token_ids``
    is HF's ``eos_token_id`` as a tuple.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "LlamaForCausalLM"
    moe_num_experts: int = 1  # a dense MLP is one expert that every token takes
    moe_experts_per_token: int = 1
    moe_intermediate_size: int | None = None  # None: intermediate_size (dense)

    def __post_init__(self) -> None:
        sizes = (
            "hidden_size",
            "num_layers",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        )
        bad = [f"{f}={getattr(self, f)!r}" for f in sizes if not _is_positive_int(getattr(self, f))]
        if bad:
            raise ValueError(f"model {self.name}: sizes must be positive integers, got {', '.join(bad)}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name}: num_attention_heads={self.num_attention_heads} is not a multiple "
                f"of num_kv_heads={self.num_kv_heads}"
            )
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"model {self.name}: unsupported architecture {self.architecture!r} "
                f"(supported: {', '.join(ARCHITECTURES)})"
            )
        if not (self.rms_norm_eps > 0 and self.rope_theta > 0):
            raise ValueError(f"model {self.name}: rms_norm_eps and rope_theta must be positive")
        experts, per_token = self.moe_num_experts, self.moe_experts_per_token
        if not (_is_positive_int(experts) and _is_positive_int(per_token) and per_token <= experts):
            raise ValueError(
                f"model {self.name}: experts per token ({per_token!r}) must be 1..{experts!r} experts"
            )

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str = "custom") -> ModelSpec:
        """Read a Hugging Face ``config.json`` dict; raise ``ValueError`` if it is not one we model."""
        architecture = _architecture(config, name)
        required = (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
        )
        missing = [key for key in required if config.get(key) is None]
        if missing:
            raise ValueError(f"model {name}: config is missing {', '.join(missing)}")
        for key, supported in (("hidden_act", "silu"), ("mlp_bias", False)):
            if key in config and config[key] != supported:
                raise ValueError(f"model {name}: {key}={config[key]!r} is not supported (need {supported!r})")
        if _uses_sliding_window(config, architecture):
            raise ValueError(
                f"model {name}: sliding-window attention (sliding_window={config['sliding_window']}) "
                "is not supported"
            )
        if architecture != "Qwen2ForCausalLM" and config.get("attention_bias", False):
            raise ValueError(
                f"model {name}: attention_bias on a {architecture} (o_proj bias) is not supported"
            )
        heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        divisible = _is_positive_int(hidden) and _is_positive_int(heads)
        head_dim = config.get("head_dim") or (hidden // heads if divisible else 0)
        bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else () if eos is None else (eos,)
        if not all(_is_token_id(t) for t in eos_ids) or not (bos is None or _is_token_id(bos)):
            raise ValueError(
                f"model {name}: bos_token_id/eos_token_id must be token ids, got {bos!r}/{eos!r}"
            )
        rope, scaling = _rope_fields(config, name)
        moe: dict[str, Any] = {}
        if architecture in _MOE_KEYS:
            experts_key, per_token_key, width_key = _MOE_KEYS[architecture]
            mixed = config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1
            if config.get("shared_expert_intermediate_size") or mixed:
                raise ValueError(
                    f"model {name}: shared experts or dense layers among MoE ones are not supported"
                )
            moe = {
                "moe_num_experts": config.get(experts_key),
                "moe_experts_per_token": config.get(per_token_key),
                "moe_intermediate_size": config.get(width_key),
            }
            if not all(_is_positive_int(v) for v in moe.values()):
                raise ValueError(
                    f"model {name}: {experts_key}, {per_token_key} and {width_key} must be positive"
                )
        return cls(
            name=name,
            hidden_size=hidden,
            num_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            rms_norm_eps=_number(config, "rms_norm_eps", 1e-6, name),
            rope_theta=_number(rope, "rope_theta", 10000.0, name),
            rope_scaling=_hashable_rope_scaling(scaling, name),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=architecture == "Qwen2ForCausalLM",
            bos_token_id=bos,
            eos_token_ids=eos_ids,
            architecture=architecture,
            **moe,
        )

    def to_hf_config(self) -> dict[str, Any]:
        """A ``config.json`` dict that :meth:`from_hf_config` (and transformers) reads back as this spec."""
        config: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": ARCHITECTURES[self.architecture],
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling_dict(),
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids)
            if len(self.eos_token_ids) != 1
            else self.eos_token_ids[0],
            "torch_dtype": "bfloat16",
        }
        if self.is_moe:
            experts_key, per_token_key, width_key = _MOE_KEYS[self.architecture]
            config[experts_key] = self.moe_num_experts
            config[per_token_key] = self.moe_experts_per_token
            config[width_key] = self.expert_intermediate_size
        if self.architecture == "Qwen2ForCausalLM":
            config["use_sliding_window"] = False
        else:
            config["attention_bias"] = False
        return config

    def rope_scaling_dict(self) -> dict[str, float | str] | None:
        """``rope_scaling`` in HF's dict form (``None`` when RoPE is unscaled)."""
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    # -- derived sizes ------------------------------------------------------------------------

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.moe_num_experts > 1

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP (gate, up and down projections) in one layer."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def params_per_layer(self) -> int:
        """q/k/v/o projections (+ q/k/v biases, + Qwen3's q/k norms), the gated MLP or every
        expert and the router, and the two RMSNorm weights."""
        attention = 2 * self.hidden_size * self.q_size + 2 * self.hidden_size * self.kv_size
        if self.attention_bias:
            attention += self.q_size + 2 * self.kv_size
        if self.architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            attention += 2 * self.head_dim
        router = self.hidden_size * self.moe_num_experts if self.is_moe else 0
        return attention + self.moe_num_experts * self.expert_params + router + 2 * self.hidden_size

    @property
    def num_active_non_embedding_params(self) -> int:
        """The weights one token's forward pass multiplies: its experts only (all of a dense MLP)."""
        idle = (self.moe_num_experts - self.moe_experts_per_token) * self.expert_params
        return self.num_non_embedding_params - self.num_layers * idle

    def expected_experts(self, num_tokens: float) -> float:
        """Distinct experts a layer reads for ``num_tokens`` tokens routed independently and
        uniformly (E x (1 - (1 - k / E)^N)): k at one token, every expert once N is large."""
        experts, per_token = self.moe_num_experts, self.moe_experts_per_token
        if not self.is_moe:
            return 1.0
        return float(experts * (1.0 - (1.0 - per_token / experts) ** num_tokens))

    def weights_read_params(self, num_tokens: float) -> float:
        """Non-embedding weights a step of ``num_tokens`` tokens reads: every weight of a dense
        model; the shared layers and the experts its tokens route to, for a MoE one."""
        unread = (self.moe_num_experts - self.expected_experts(num_tokens)) * self.expert_params
        return self.num_non_embedding_params - self.num_layers * unread

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Weights of the LM-head matmul; shared with the embedding when tied, but its FLOPs still run."""
        return self.vocab_size * self.hidden_size

    @property
    def num_non_embedding_params(self) -> int:
        """Every decoder layer plus the final norm: the weights each token's forward pass multiplies.

        Excludes the input embedding (a row lookup, no FLOPs) and the LM head, which runs only for
        tokens that produce a logit and so is counted separately (:attr:`lm_head_params`).
        """
        return self.num_layers * self.params_per_layer + self.hidden_size

    @property
    def num_active_params(self) -> int:
        """:attr:`num_params` less the experts a token does not take."""
        return self.num_params - self.num_non_embedding_params + self.num_active_non_embedding_params

    @property
    def num_params(self) -> int:
        """All stored parameters: embedding + layers + final norm + LM head unless tied."""
        lm_head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.embedding_params + self.num_non_embedding_params + lm_head

    def weight_bytes(self, dtype_bytes: int) -> int:
        return self.num_params * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token across all layers."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def kv_bytes_per_token_on(self, tp: int, dtype_bytes: int) -> float:
        """K and V of one token summed over ``tp`` GPUs: with fewer KV heads than GPUs, each KV
        head is replicated on ``tp / num_kv_heads`` of them (as vLLM does)."""
        return self.kv_bytes_per_token(dtype_bytes) * tp / min(tp, self.num_kv_heads)


def load_model_spec(name_or_path: str) -> ModelSpec:
    """A preset name, a ``config.json`` path, a folder holding ``config.json``, or a GGUF file
    (a ``.gguf`` path or a short name such as ``smollm2``)."""
    from stallfree.specs.gguf import hf_config_from_gguf, is_gguf_path, read_gguf, resolve_known_gguf
    from stallfree.specs.model_presets import MODEL_PRESETS

    if name_or_path in MODEL_PRESETS:
        return ModelSpec.from_hf_config(MODEL_PRESETS[name_or_path], name=name_or_path)
    known_gguf = resolve_known_gguf(name_or_path)
    if known_gguf is not None or is_gguf_path(name_or_path):
        gguf_path = known_gguf or Path(name_or_path).expanduser()
        if not gguf_path.is_file():
            raise ValueError(
                f"GGUF file not found: {gguf_path} (stallfree downloads nothing: give a local file)"
            )
        return ModelSpec.from_hf_config(hf_config_from_gguf(read_gguf(gguf_path)), name=gguf_path.stem)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    looks_like_path = path.suffix == ".json" or "/" in name_or_path or path.exists()
    if not looks_like_path:
        raise ValueError(f"unknown model {name_or_path!r}; presets: {', '.join(MODEL_PRESETS)}")
    if not path.is_file():
        raise ValueError(
            f"model config not found: {path} (stallfree downloads nothing: give a local config.json)"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read model config {path}: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"model config {path} is not a JSON object")
    return ModelSpec.from_hf_config(config, name=path.parent.name or path.stem)


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(config: Mapping[str, Any], key: str, default: float, name: str) -> float:
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"model {name}: {key}={value!r} is not a number")
    return float(value)


def _architecture(config: Mapping[str, Any], name: str) -> str:
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    model_type = config.get("model_type")
    if archs:
        arch = archs[0]
        if arch not in ARCHITECTURES:
            raise ValueError(
                f"model {name}: architecture {arch!r} is not a supported Llama-family decoder "
                f"(supported: {', '.join(ARCHITECTURES)})"
            )
        if model_type is not None and model_type != ARCHITECTURES[arch]:
            raise ValueError(f"model {name}: model_type {model_type!r} does not match architecture {arch}")
        return str(arch)
    if model_type in _ARCH_BY_MODEL_TYPE:
        return _ARCH_BY_MODEL_TYPE[model_type]
    if model_type is None:
        raise ValueError(f"model {name}: config has neither 'architectures' nor 'model_type'")
    raise ValueError(
        f"model {name}: model_type {model_type!r} is not a supported Llama-family decoder "
        f"(supported: {', '.join(_ARCH_BY_MODEL_TYPE)})"
    )


def _uses_sliding_window(config: Mapping[str, Any], architecture: str) -> bool:
    window = config.get("sliding_window")
    if window is None:
        return False
    if architecture.startswith(("Qwen2", "Qwen3")):
        # Qwen configs always carry a window; it is only used when this flag says so.
        return bool(config.get("use_sliding_window", False))
    return bool(window < config.get("max_position_embeddings", window + 1))


def _rope_fields(config: Mapping[str, Any], name: str) -> tuple[Mapping[str, Any], object]:
    """(where ``rope_theta`` lives, the scaling dict or None) in either HF layout.

    transformers < 5 writes top-level ``rope_theta`` and ``rope_scaling``; transformers 5 writes
    one ``rope_parameters`` dict holding ``rope_theta`` and, unless ``rope_type`` is
    ``default``, the scaling fields.
    """
    params = config.get("rope_parameters")
    if "rope_theta" in config or params is None:
        return config, config.get("rope_scaling")
    if not isinstance(params, Mapping):
        raise ValueError(f"model {name}: rope_parameters must be an object, got {params!r}")
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return params, None if scaling.get("rope_type", "default") == "default" else scaling


def _hashable_rope_scaling(value: object, name: str) -> RopeScaling | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"model {name}: rope_scaling must be an object, got {value!r}")
    items: list[tuple[str, float | str]] = []
    for key, item in sorted(value.items()):
        if isinstance(item, bool) or not isinstance(item, int | float | str):
            raise ValueError(f"model {name}: rope_scaling[{key!r}]={item!r} is not a number or string")
        items.append((str(key), item))
    return tuple(items)
