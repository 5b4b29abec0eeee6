"""Model specs: the shape of a Llama-family decoder LLM, from presets or a Hugging Face config.

Owns :class:`ModelSpec` (a frozen value read by the cost models and the PyTorch engine) and
:func:`load_model_spec`. Supported: ``LlamaForCausalLM``, ``MistralForCausalLM`` and
``Qwen2ForCausalLM`` with SiLU-gated MLPs, RMSNorm and RoPE (the engine runs these), and for the
simulator ``Qwen3ForCausalLM`` and the mixture-of-experts ``MixtralForCausalLM``,
``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM``, ``DeepseekV3ForCausalLM`` (DeepSeek-V3/R1,
Kimi K2), ``GptOssForCausalLM`` and ``Llama4ForConditionalGeneration`` (its text model): a MoE
layer's MLP is ``moe_num_experts`` gated experts of ``moe_intermediate_size``,
``moe_experts_per_token`` of them per token, plus shared experts every token takes
(``moe_shared_intermediate_size`` wide in all); ``moe_dense_layers`` layers have a dense MLP of
``intermediate_size`` instead. DeepSeek's multi-head latent attention (MLA, ``kv_lora_rank`` > 0)
caches one compressed latent of ``kv_lora_rank + qk_rope_head_dim`` values a token and layer;
``num_sliding_layers`` layers attend over the last ``sliding_window`` tokens only (Mistral's,
gpt-oss's, Llama 4's chunked local attention taken as a window of its chunk). A checkpoint stored
in fp8 or MXFP4 (``quantization``) has its weights sized so. Anything else (encoders,
encoder-decoders, sparse attention, Qwen's sliding-window layers, biased MLPs but gpt-oss's) is
rejected with a one-line ``ValueError`` rather than modelled wrongly.

Invariants: every size is positive; ``num_attention_heads`` is a multiple of ``num_kv_heads``;
``rope_scaling`` is a key-sorted tuple of scalar pairs (hashable), or ``None``.
"""

from __future__ import annotations

import json
import math
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
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "Llama4ForConditionalGeneration": "llama4",
}
# other model_types a config may give with these architectures (Kimi K2 is DeepSeek-V3's shape)
_MODEL_TYPE_ALIASES: Mapping[str, tuple[str, ...]] = {"DeepseekV3ForCausalLM": ("kimi_k2",)}
ENGINE_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# config.json's expert counts, by architecture: (experts, experts per token, expert MLP width)
_MOE_KEYS: Mapping[str, tuple[str, str, str]] = {
    "MixtralForCausalLM": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "Qwen2MoeForCausalLM": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "Qwen3MoeForCausalLM": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "DeepseekV3ForCausalLM": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "GptOssForCausalLM": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "Llama4ForConditionalGeneration": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
}
# a checkpoint's quant_method -> (its experts', its other decoder weights') bytes a parameter;
# None: the dtype's. DeepSeek's fp8 checkpoints hold every decoder matmul in fp8 (128 x 128 block
# scales, negligible); gpt-oss's MXFP4 its experts only (4 bits + an 8-bit scale per 32 values).
QUANTIZED_BYTES: Mapping[str, tuple[float | None, float | None]] = {
    "fp8": (1.0, 1.0),
    "mxfp4": (4.25 / 8, None),
}
# q/k/v biases always (gpt-oss: and o_proj's, and a learned attention sink a head)
_BIASED_ATTENTION = ("Qwen2ForCausalLM", "GptOssForCausalLM")
_MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
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
    moe_shared_intermediate_size: int = 0  # shared experts' width, all of them (every token takes them)
    moe_dense_layers: int = 0  # layers of a MoE model whose MLP is dense (intermediate_size)
    kv_lora_rank: int = 0  # MLA: > 0; head_dim is then the query/key head (nope + rope dims)
    q_lora_rank: int = 0  # MLA: the queries' low-rank projection (0: a full one)
    qk_rope_head_dim: int = 0  # MLA: the rotary part of a query/key head, cached beside the latent
    v_head_dim: int = 0  # MLA: a value head (0: head_dim)
    sliding_window: int = 0  # > 0: num_sliding_layers layers attend to the last this many tokens only
    num_sliding_layers: int = 0
    quantization: str = ""  # the checkpoint's quant_method: fp8 and mxfp4 weights are sized so

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
        counts: tuple[str, ...] = ("moe_shared_intermediate_size", "moe_dense_layers", *_MLA_KEYS[:3])
        counts += ("v_head_dim", "sliding_window", "num_sliding_layers")
        bad = [f"{f}={getattr(self, f)!r}" for f in counts if not _is_count(getattr(self, f))]
        if bad or self.moe_dense_layers >= self.num_layers:
            raise ValueError(
                f"model {self.name}: {', '.join(bad) or f'moe_dense_layers={self.moe_dense_layers}'} "
                f"must be >= 0 (and fewer dense layers than the {self.num_layers} layers)"
            )
        if self.num_sliding_layers > self.num_layers or bool(self.sliding_window) != bool(
            self.num_sliding_layers
        ):
            raise ValueError(
                f"model {self.name}: {self.num_sliding_layers} sliding-window layers of {self.num_layers} "
                f"with a window of {self.sliding_window}: give both or neither"
            )
        if self.is_mla and not 0 < self.qk_rope_head_dim < self.head_dim:
            raise ValueError(
                f"model {self.name}: MLA's qk_rope_head_dim={self.qk_rope_head_dim} must be inside "
                f"the query/key head of {self.head_dim}"
            )

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str = "custom") -> ModelSpec:
        """Read a Hugging Face ``config.json`` dict; raise ``ValueError`` if it is not one we model."""
        architecture = _architecture(config, name)
        if architecture == "Llama4ForConditionalGeneration":  # the language model's config is nested
            text = config.get("text_config")
            if not isinstance(text, Mapping):
                raise ValueError(f"model {name}: a Llama 4 config needs its text_config")
            config = {**text, "architectures": [architecture], "model_type": "llama4"}
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
        window = _sliding_window(config, architecture, name)
        if architecture not in _BIASED_ATTENTION and config.get("attention_bias", False):
            raise ValueError(
                f"model {name}: attention_bias on a {architecture} (o_proj bias) is not supported"
            )
        heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        divisible = _is_positive_int(hidden) and _is_positive_int(heads)
        head_dim = config.get("head_dim") or (hidden // heads if divisible else 0)
        mla = _mla_fields(config, name)
        if mla:
            head_dim = mla.pop("qk_nope_head_dim") + mla["qk_rope_head_dim"]
        bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else () if eos is None else (eos,)
        if not all(_is_count(t) for t in eos_ids) or not (bos is None or _is_count(bos)):
            raise ValueError(
                f"model {name}: bos_token_id/eos_token_id must be token ids, got {bos!r}/{eos!r}"
            )
        rope, scaling = _rope_fields(config, name)
        moe = _moe_fields(config, architecture, name) if architecture in _MOE_KEYS else {}
        return cls(
            name=name,
            hidden_size=hidden,
            num_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            intermediate_size=moe.pop("dense_intermediate_size", config["intermediate_size"]),
            vocab_size=config["vocab_size"],
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            rms_norm_eps=_number(config, "rms_norm_eps", 1e-6, name),
            rope_theta=_number(rope, "rope_theta", 10000.0, name),
            rope_scaling=_hashable_rope_scaling(scaling, name),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=architecture in _BIASED_ATTENTION,
            bos_token_id=bos,
            eos_token_ids=eos_ids,
            architecture=architecture,
            **moe,
            **mla,
            **window,
            quantization=_quantization(config),
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
            if self.architecture == "DeepseekV3ForCausalLM":
                config["first_k_dense_replace"] = self.moe_dense_layers
                config["n_shared_experts"] = (
                    self.moe_shared_intermediate_size // self.expert_intermediate_size
                )
            elif self.architecture == "Llama4ForConditionalGeneration":
                config["intermediate_size_mlp"] = self.intermediate_size
                config["interleave_moe_layer_step"] = self.num_layers // self.num_moe_layers
            elif self.architecture in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
                config["mlp_only_layers"] = list(range(self.moe_dense_layers))
                config["shared_expert_intermediate_size"] = self.moe_shared_intermediate_size
        if self.is_mla:
            config |= {key: getattr(self, key) for key in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim")}
            config["qk_nope_head_dim"] = self.head_dim - self.qk_rope_head_dim
            config["v_head_dim"] = self.value_head_dim
        sliding, full = self.num_sliding_layers, self.num_layers - self.num_sliding_layers
        if self.architecture == "Llama4ForConditionalGeneration":
            config |= {
                "attention_chunk_size": self.sliding_window,
                "no_rope_layers": [1] * sliding + [0] * full,
            }
        elif self.architecture == "GptOssForCausalLM":
            config["sliding_window"] = self.sliding_window
            config["layer_types"] = ["sliding_attention"] * sliding + ["full_attention"] * full
        elif sliding:
            config["sliding_window"] = self.sliding_window
        if self.architecture == "Qwen2ForCausalLM":
            config["use_sliding_window"] = False
        else:
            config["attention_bias"] = self.attention_bias
        if self.quantization:
            config["quantization_config"] = {"quant_method": self.quantization}
        if self.architecture == "Llama4ForConditionalGeneration":
            top = ("architectures", "model_type", "torch_dtype")
            text = {k: v for k, v in config.items() if k not in top} | {"model_type": "llama4_text"}
            config = {k: config[k] for k in top} | {"text_config": text}
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
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is experts (all of them in a dense model: its one expert)."""
        return self.num_layers - self.moe_dense_layers

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP (gate, up and down projections; gpt-oss's biases too) in one layer."""
        h, width = self.hidden_size, self.expert_intermediate_size
        biases = 2 * width + h if self.architecture == "GptOssForCausalLM" else 0
        return 3 * h * width + biases

    @property
    def attention_params(self) -> int:
        """One layer's attention: q/k/v/o projections (+ q/k/v biases, + Qwen3's q/k norms), or
        MLA's query, latent and up-projections with their norms; and the layer's two RMSNorms."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.is_mla:
            q = self.q_lora_rank
            query = h * q + q + q * self.q_size if q else h * self.q_size
            nope = self.head_dim - self.qk_rope_head_dim
            latent = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            up = self.kv_lora_rank * heads * (nope + self.value_head_dim)
            return query + latent + up + heads * self.value_head_dim * h + 2 * h
        attention = 2 * h * self.q_size + 2 * h * self.kv_size
        if self.attention_bias:
            attention += self.q_size + 2 * self.kv_size
        if self.architecture == "GptOssForCausalLM":
            attention += h + heads  # o_proj's bias, and a learned sink a head
        if self.architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            attention += 2 * self.head_dim
        return attention + 2 * h

    @property
    def moe_mlp_params(self) -> int:
        """A MoE layer's MLP: every expert, the router, the shared experts (and Qwen2-MoE's gate on
        them); a dense model's one MLP."""
        h = self.hidden_size
        shared = 3 * h * self.moe_shared_intermediate_size
        if shared and self.architecture == "Qwen2MoeForCausalLM":
            shared += h  # a sigmoid gate on the shared expert's output
        router = h * self.moe_num_experts if self.is_moe else 0
        if self.architecture == "GptOssForCausalLM":
            router += self.moe_num_experts  # its bias
        return self.moe_num_experts * self.expert_params + router + shared

    @property
    def params_per_layer(self) -> int:
        """A MoE layer (any layer of a dense model): attention, norms and its MLP."""
        return self.attention_params + self.moe_mlp_params

    @property
    def num_active_non_embedding_params(self) -> int:
        """The weights one token's forward pass multiplies: its experts only (all of a dense MLP)."""
        idle = (self.moe_num_experts - self.moe_experts_per_token) * self.expert_params
        return self.num_non_embedding_params - self.num_moe_layers * idle

    def expected_experts(self, num_tokens: float) -> float:
        """Distinct experts a layer reads for ``num_tokens`` tokens routed independently and
        uniformly (E x (1 - (1 - k / E)^N)): k at one token, every expert once N is large."""
        experts, per_token = self.moe_num_experts, self.moe_experts_per_token
        if not self.is_moe:
            return 1.0
        return float(experts * (1.0 - (1.0 - per_token / experts) ** num_tokens))

    def busiest_experts(self, num_tokens: float, num_gpus: int) -> float:
        """With the experts split over ``num_gpus`` GPUs (expert parallelism, E / G each): the
        expected distinct experts a layer reads on the GPU that reads the most, for ``num_tokens``
        tokens routed as in :meth:`expected_experts`. Each GPU's count is Binomial(E / G, p), p the
        chance a step routes to a given expert, taken as independent across GPUs; the maximum of G
        of them is sum over m of 1 - F(m)^G. At one GPU, :meth:`expected_experts`; at one token on
        DeepSeek-V3's 256 experts over 8 GPUs, 2.5 where an even split would read 1 (a Monte Carlo of the
        routing agrees within 0.2%)."""
        if num_gpus == 1 or not self.is_moe:
            return self.expected_experts(num_tokens)
        experts = self.moe_num_experts
        if num_gpus < 1 or experts % num_gpus:
            raise ValueError(f"{experts} experts do not split evenly over {num_gpus} GPUs")
        held = experts // num_gpus
        p = self.expected_experts(num_tokens) / experts
        cdf, expected_max = 0.0, 0.0
        for m in range(held):
            cdf += math.comb(held, m) * p**m * (1.0 - p) ** (held - m)
            expected_max += 1.0 - min(1.0, cdf) ** num_gpus
        return expected_max

    def decoder_bytes_per_param(self, dtype_bytes: float) -> tuple[float, float]:
        """(experts', the other decoder weights') bytes a parameter: ``dtype_bytes``, or less where
        the checkpoint stores them quantised (:data:`QUANTIZED_BYTES`), as servers load them."""
        experts, rest = QUANTIZED_BYTES.get(self.quantization, (None, None))
        return (
            dtype_bytes if experts is None else min(dtype_bytes, experts),
            dtype_bytes if rest is None else min(dtype_bytes, rest),
        )

    def decoder_weight_bytes(
        self, dtype_bytes: float, num_tokens: float | None = None, expert_gpus: int = 1
    ) -> float:
        """Bytes of the non-embedding weights a step of ``num_tokens`` tokens reads: every weight
        of a dense model; the shared layers and the experts its tokens route to
        (:meth:`expected_experts`), for a MoE one. None: all of them. ``expert_gpus`` > 1: the
        experts split over that many GPUs, each read as the busiest GPU reads
        (:meth:`busiest_experts` x ``expert_gpus``), as the step waits for it."""
        experts_bytes, rest_bytes = self.decoder_bytes_per_param(dtype_bytes)
        experts = self.num_moe_layers * self.moe_num_experts * self.expert_params
        routed = (
            self.moe_num_experts
            if num_tokens is None
            else self.busiest_experts(num_tokens, expert_gpus) * expert_gpus
        )
        read = self.num_moe_layers * routed * self.expert_params
        return (self.num_non_embedding_params - experts) * rest_bytes + read * experts_bytes

    @property
    def attention_flops_per_key(self) -> float:
        """FLOPs of one query-key pair over all layers: a query/key head's dot product (QK^T) and
        a value head's axpy (AV), 2 FLOPs a multiply-add, in every head. (MLA's decode kernels
        run it on the latent instead, more FLOPs per pair and fewer bytes; they stay memory-bound.)"""
        heads_dims = self.num_attention_heads * (self.head_dim + self.value_head_dim)
        return 2.0 * heads_dims * self.num_layers

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
        (DeepSeek's multi-token-prediction layer is left out: it serves speculative decoding.)
        """
        dense_mlp = 3 * self.hidden_size * self.intermediate_size
        layers = self.num_layers * self.attention_params + self.num_moe_layers * self.moe_mlp_params
        return layers + self.moe_dense_layers * dense_mlp + self.hidden_size

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
        """Every stored weight: the embedding and LM head at ``dtype_bytes``, the decoder's as
        :meth:`decoder_weight_bytes` sizes them."""
        embeddings = self.num_params - self.num_non_embedding_params
        return round(embeddings * dtype_bytes + self.decoder_weight_bytes(dtype_bytes))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token across all layers (MLA: its latent and rotary key)."""
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def kv_bytes_per_token_on(self, tp: int, dtype_bytes: int) -> float:
        """K and V of one token summed over ``tp`` GPUs: with fewer KV heads than GPUs, each KV
        head is replicated on ``tp / num_kv_heads`` of them (as vLLM does); MLA's one latent is
        held whole by every GPU."""
        copies = tp if self.is_mla else tp / min(tp, self.num_kv_heads)
        return self.kv_bytes_per_token(dtype_bytes) * copies


def load_model_spec(name_or_path: str) -> ModelSpec:
    """A preset name, a ``config.json`` path, a folder holding ``config.json``, or a GGUF file
    (a ``.gguf`` path or a short name such as ``smollm2``)."""
    from stallfree.specs.model_presets import MODEL_PRESETS

    if name_or_path in MODEL_PRESETS:
        return ModelSpec.from_hf_config(MODEL_PRESETS[name_or_path], name=name_or_path)
    from stallfree.specs.gguf import hf_config_from_gguf, is_gguf_path, read_gguf, resolve_known_gguf

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
        raise ValueError(
            f"unknown model {name_or_path!r}; give a preset ({', '.join(MODEL_PRESETS)}), a GGUF file, a "
            "Hugging Face config.json or a folder holding one, or (simulate, explain, tune, specs) a Hugging "
            'Face id whose config aiconfigurator-core ships (pip install "stallfree[gpu]")'
        )
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


def _moe_fields(config: Mapping[str, Any], architecture: str, name: str) -> dict[str, Any]:
    """The expert counts and widths, the shared experts and the dense layers of a MoE config."""
    experts_key, per_token_key, width_key = _MOE_KEYS[architecture]
    moe: dict[str, Any] = {
        "moe_num_experts": config.get(experts_key),
        "moe_experts_per_token": config.get(per_token_key),
        "moe_intermediate_size": config.get(width_key),
    }
    if not all(_is_positive_int(v) for v in moe.values()):
        raise ValueError(f"model {name}: {experts_key}, {per_token_key} and {width_key} must be positive")
    layers = config["num_hidden_layers"]
    if architecture == "DeepseekV3ForCausalLM":
        # the first k layers dense, then every layer a MoE one
        if config.get("moe_layer_freq", 1) != 1:
            raise ValueError(f"model {name}: moe_layer_freq={config['moe_layer_freq']!r} is not supported")
        dense, shared = config.get("first_k_dense_replace", 0), config.get("n_shared_experts") or 0
        if not (_is_count(dense) and _is_count(shared)):
            raise ValueError(f"model {name}: first_k_dense_replace and n_shared_experts must be counts")
        moe["moe_dense_layers"] = dense
        moe["moe_shared_intermediate_size"] = shared * moe["moe_intermediate_size"]
    elif architecture in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        # layer i is a MoE one unless listed in mlp_only_layers or (i + 1) % decoder_sparse_step != 0
        step, dense_only = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers") or []
        if not (_is_positive_int(step) and isinstance(dense_only, list) and isinstance(layers, int)):
            raise ValueError(f"model {name}: decoder_sparse_step and mlp_only_layers are malformed")
        sparse = [i for i in range(layers) if i not in dense_only and (i + 1) % step == 0]
        moe["moe_dense_layers"] = layers - len(sparse)
        shared = config.get("shared_expert_intermediate_size") or 0
        if not _is_count(shared):
            raise ValueError(f"model {name}: shared_expert_intermediate_size must be a count")
        moe["moe_shared_intermediate_size"] = shared
    elif architecture == "Llama4ForConditionalGeneration":
        # every step-th layer a MoE one with a shared expert as wide as a routed one; the others
        # dense, intermediate_size_mlp wide
        step = config.get("interleave_moe_layer_step", 1)
        if not (_is_positive_int(step) and isinstance(layers, int)):
            raise ValueError(f"model {name}: interleave_moe_layer_step must be a positive integer")
        moe["moe_dense_layers"] = layers - len(range(step - 1, layers, step))
        moe["moe_shared_intermediate_size"] = moe["moe_intermediate_size"]
        moe["dense_intermediate_size"] = config.get("intermediate_size_mlp") or config["intermediate_size"]
    return moe


def _quantization(config: Mapping[str, Any]) -> str:
    quant = config.get("quantization_config")
    return str(quant.get("quant_method") or "") if isinstance(quant, Mapping) else ""


def _mla_fields(config: Mapping[str, Any], name: str) -> dict[str, int]:
    """DeepSeek's multi-head latent attention sizes (empty: not MLA)."""
    if not config.get("kv_lora_rank"):
        return {}
    fields = {key: config.get(key) or 0 for key in _MLA_KEYS}
    if not all(_is_count(v) for v in fields.values()) or not fields["qk_rope_head_dim"]:
        raise ValueError(f"model {name}: MLA sizes {', '.join(_MLA_KEYS)} must be counts")
    return fields


def _is_count(value: object) -> bool:
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
        if model_type is not None and model_type not in (
            ARCHITECTURES[arch],
            *_MODEL_TYPE_ALIASES.get(arch, ()),
        ):
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


def _sliding_window(config: Mapping[str, Any], architecture: str, name: str) -> dict[str, int]:
    """The window and how many layers use it (empty: every layer attends to the whole context).

    Mistral's window is on every layer; gpt-oss lists each layer's kind; Llama 4's chunked local
    attention (on every layer but each ``no_rope_layer_interval``-th) is taken as a window of its
    chunk size: a token attends to at most that many, so its cost is bounded by the window's.
    """
    layers = config["num_hidden_layers"]
    if architecture == "Llama4ForConditionalGeneration":
        window = config.get("attention_chunk_size") or 0
        flags = config.get("no_rope_layers") or [
            int((i + 1) % config.get("no_rope_layer_interval", 4) != 0) for i in range(layers)
        ]
        sliding = sum(bool(f) for f in flags) if window else 0
    elif architecture == "GptOssForCausalLM":
        window = config.get("sliding_window") or 0
        sliding = sum(kind == "sliding_attention" for kind in config.get("layer_types") or [])
    else:
        window = config.get("sliding_window") or 0
        if architecture.startswith(("Qwen2", "Qwen3")) and window and config.get("use_sliding_window"):
            # Qwen configs always carry a window; it is only used when this flag says so
            raise ValueError(
                f"model {name}: Qwen's sliding-window layers (use_sliding_window) are not supported"
            )
        full_length = not window or window >= config.get("max_position_embeddings", window + 1)
        sliding = 0 if architecture.startswith(("Qwen2", "Qwen3")) or full_length else layers
    if not (_is_count(window) and _is_count(sliding)):
        raise ValueError(f"model {name}: sliding_window={window!r} is not a count")
    return {"sliding_window": window, "num_sliding_layers": sliding} if sliding else {}


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
        if not isinstance(item, int | float | str):  # a bool is an int (gpt-oss's yarn has "truncate")
            raise ValueError(f"model {name}: rope_scaling[{key!r}]={item!r} is not a number or string")
        items.append((str(key), item))
    return tuple(items)
