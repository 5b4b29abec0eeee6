"""Model presets: the architecture fields of each model's Hugging Face ``config.json``.

Values are the published configs of the base (non-instruct) checkpoints; keys that do not
change the architecture (dropout, initializer_range, torch_dtype, ...) are left out. Presets
go through :meth:`ModelSpec.from_hf_config` like any user config, so they are validated the
same way.
"""

from __future__ import annotations

from typing import Any

_LLAMA3_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def _llama(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": 1e-5,
        "rope_scaling": None,
        "tie_word_embeddings": False,
    }
    return base | fields


def _llama3(**fields: Any) -> dict[str, Any]:
    return _llama(vocab_size=128256, rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001) | fields


def _llama2(**fields: Any) -> dict[str, Any]:
    return (
        _llama(
            vocab_size=32000, max_position_embeddings=4096, rope_theta=10000.0, bos_token_id=1, eos_token_id=2
        )
        | fields
    )


def _qwen25(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    }
    return base | fields


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # meta-llama/Meta-Llama-3-8B
    "llama-3-8b": _llama3(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        max_position_embeddings=8192,
    ),
    # meta-llama/Meta-Llama-3-70B
    "llama-3-70b": _llama3(
        hidden_size=8192,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        intermediate_size=28672,
        max_position_embeddings=8192,
    ),
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": _llama3(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        max_position_embeddings=131072,
        rope_scaling=_LLAMA3_ROPE_SCALING,
    ),
    # meta-llama/Llama-3.1-70B
    "llama-3.1-70b": _llama3(
        hidden_size=8192,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        intermediate_size=28672,
        max_position_embeddings=131072,
        rope_scaling=_LLAMA3_ROPE_SCALING,
    ),
    # meta-llama/Llama-3.1-405B
    "llama-3.1-405b": _llama3(
        hidden_size=16384,
        num_hidden_layers=126,
        num_attention_heads=128,
        num_key_value_heads=8,
        intermediate_size=53248,
        max_position_embeddings=131072,
        rope_scaling=_LLAMA3_ROPE_SCALING,
    ),
    # meta-llama/Llama-2-7b-hf
    "llama-2-7b": _llama2(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=11008,
    ),
    # meta-llama/Llama-2-13b-hf
    "llama-2-13b": _llama2(
        hidden_size=5120,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=40,
        intermediate_size=13824,
    ),
    # meta-llama/Llama-2-70b-hf
    "llama-2-70b": _llama2(
        hidden_size=8192,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        intermediate_size=28672,
    ),
    # mistralai/Mistral-7B-v0.3: v0.3 rather than v0.1 because v0.1 uses a 4096-token sliding
    # window, which these specs do not model; v0.3 attends to its full 32K context.
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_act": "silu",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "vocab_size": 32768,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    # Qwen/Qwen2.5-7B
    "qwen2.5-7b": _qwen25(
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        rms_norm_eps=1e-6,
    ),
    # Qwen/Qwen2.5-72B
    "qwen2.5-72b": _qwen25(
        hidden_size=8192,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        intermediate_size=29568,
        rms_norm_eps=1e-5,
    ),
    # 01-ai/Yi-34B
    "yi-34b": _llama(
        hidden_size=7168,
        num_hidden_layers=60,
        num_attention_heads=56,
        num_key_value_heads=8,
        intermediate_size=20480,
        vocab_size=64000,
        max_position_embeddings=4096,
        rope_theta=5000000.0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    # codellama/CodeLlama-34b-hf
    "codellama-34b": _llama(
        hidden_size=8192,
        num_hidden_layers=48,
        num_attention_heads=64,
        num_key_value_heads=8,
        intermediate_size=22016,
        vocab_size=32000,
        max_position_embeddings=16384,
        rope_theta=1000000.0,
        bos_token_id=1,
        eos_token_id=2,
    ),
}

# The Hugging Face repository of each preset, for the launch lines tools print.
HF_REPOS: dict[str, str] = {
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "mistral-7b": "mistralai/Mistral-7B-v0.3",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B",
    "yi-34b": "01-ai/Yi-34B",
    "codellama-34b": "codellama/CodeLlama-34b-hf",
}
