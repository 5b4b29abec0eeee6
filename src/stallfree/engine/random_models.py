"""Presets of ``random:<preset>`` models: Llama-architecture specs for tests, demos and benchmarks.

Sizes (parameters): tiny ~1 M (unit tests), small ~28 M (demos), medium ~128 M and
large ~322 M (benchmarks). Token ids 0/1/2 are ``<unk>``/``<s>``/``</s>``, matching
:func:`stallfree.engine.tokenizer.random_tokenizer`.
"""

from __future__ import annotations

from stallfree.engine.tokenizer import RANDOM_BOS_ID, RANDOM_EOS_ID
from stallfree.specs import ModelSpec

# name: (hidden, layers, heads, kv_heads, intermediate, vocab, max_positions, tied)
_SHAPES: dict[str, tuple[int, int, int, int, int, int, int, bool]] = {
    "tiny": (128, 4, 4, 2, 384, 1024, 1024, False),
    "small": (512, 8, 8, 4, 1408, 8192, 2048, True),
    "medium": (768, 12, 12, 4, 3072, 32000, 4096, True),
    "large": (1024, 24, 16, 4, 3072, 32000, 4096, True),
}
RANDOM_PRESETS = tuple(_SHAPES)


def random_spec(preset: str) -> ModelSpec:
    if preset not in _SHAPES:
        raise ValueError(f"unknown random model preset {preset!r}; choose from: {', '.join(RANDOM_PRESETS)}")
    hidden, layers, heads, kv_heads, intermediate, vocab, max_positions, tied = _SHAPES[preset]
    return ModelSpec(
        name=f"random-{preset}",
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        bos_token_id=RANDOM_BOS_ID,
        eos_token_ids=(RANDOM_EOS_ID,),
    )
