"""The tokenizer stored in a GGUF file's metadata, rebuilt as a ``tokenizers`` tokenizer.

Two vocabularies, as llama.cpp names them:

- ``gpt2``: byte-level BPE (Llama 3, Qwen2, SmolLM, ...): ``tokenizer.ggml.tokens`` and
  ``tokenizer.ggml.merges``; the pre-tokenizer's split regex is chosen by
  ``tokenizer.ggml.pre`` from a small table (an unknown one is refused: a wrong split would
  tokenize silently differently from the model's training).
- ``llama``: SentencePiece BPE (Llama 2, Mistral): pieces and their scores, with ``▁`` for
  a space and ``<0xNN>`` byte pieces as fallback. SentencePiece merges the adjacent pair whose
  merged piece scores highest, so the merges are every split of every piece into two pieces,
  ranked by the merged piece's score.

Control tokens (token type 3) become special added tokens (matched in text, skipped when
decoding); user-defined ones (4) plain added tokens. BOS/EOS are added the way
``tokenizer.ggml.add_bos_token``/``add_eos_token`` say (default: BOS for ``llama`` vocabs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from stallfree.engine.tokenizer import Tokenizer

_CONTROL, _USER_DEFINED = 3, 4
_SPACE = "\u2581"  # SentencePiece's visible space

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
# tokenizer.ggml.pre -> the split regex of llama.cpp's pre-tokenizer (None: GPT-2's, built in
# ByteLevel), and whether digits are first split one by one.
_PRE_TOKENIZERS: Mapping[str, tuple[str | None, bool]] = {
    "default": (None, False),
    "gpt2": (None, False),
    "smollm": (None, True),
    "starcoder": (None, True),
    "llama-bpe": (
        _CONTRACTIONS
        + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        False,
    ),
    "qwen2": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        False,
    ),
}


def gguf_tokenizer(metadata: Mapping[str, Any], source: str) -> Tokenizer:
    """The tokenizer (and chat template) of a GGUF file's metadata; ``source`` names it in errors."""
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"{source}: GGUF file has no tokenizer.ggml.tokens")
    types: Sequence[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if kind == "gpt2":
        inner = _byte_level_bpe(metadata, tokens, source)
        add_bos_default = False
    elif kind == "llama":
        inner = _sentencepiece_bpe(metadata, tokens, types)
        add_bos_default = True
    else:
        raise ValueError(f"{source}: GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    specials = [
        AddedToken(tokens[i], special=t == _CONTROL, normalized=False)
        for i, t in enumerate(types)
        if t in (_CONTROL, _USER_DEFINED)
    ]
    inner.add_special_tokens([t for t in specials if t.special])
    inner.add_tokens([t for t in specials if not t.special])
    bos, eos = _id_and_text(metadata, tokens, "bos"), _id_and_text(metadata, tokens, "eos")
    _set_post_processor(inner, metadata, bos=bos, eos=eos, add_bos_default=add_bos_default)
    # the texts chat templates refer to as bos_token / eos_token
    names = {f"{role}_token": found[1] for role, found in (("bos", bos), ("eos", eos)) if found is not None}
    template = metadata.get("tokenizer.chat_template")
    return Tokenizer(inner, template if isinstance(template, str) else None, names)


def _byte_level_bpe(metadata: Mapping[str, Any], tokens: list[str], source: str) -> tokenizers.Tokenizer:
    merges = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise ValueError(f"{source}: a gpt2 (BPE) GGUF tokenizer needs tokenizer.ggml.merges")
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"{source}: GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(_PRE_TOKENIZERS)})"
        )
    regex, split_digits = _PRE_TOKENIZERS[pre]
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    inner = tokenizers.Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs, fuse_unk=False)
    )
    steps: list[Any] = [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    if regex is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(regex), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    inner.pre_tokenizer = pre_tokenizers.Sequence(steps)
    inner.decoder = decoders.ByteLevel()
    return inner


def _sentencepiece_bpe(
    metadata: Mapping[str, Any], tokens: list[str], types: Sequence[int]
) -> tokenizers.Tokenizer:
    scores: Sequence[float] = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, score, kind in zip(tokens, scores, types, strict=True):
        if kind in (_CONTROL, _USER_DEFINED) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id", 0)
    inner = tokenizers.Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[(left, right) for *_, left, right in ranked],
            unk_token=tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    # llama.cpp puts the space prefix before each run of text (the start, and after a special
    # token): a normalizer does the same, since added tokens are split off before it runs.
    norm: list[Any] = [normalizers.Prepend(_SPACE)] if add_space_prefix else []
    inner.normalizer = normalizers.Sequence([*norm, normalizers.Replace(" ", _SPACE)])
    steps: list[Any] = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    inner.decoder = decoders.Sequence(steps)
    return inner


def _id_and_text(metadata: Mapping[str, Any], tokens: list[str], role: str) -> tuple[int, str] | None:
    token_id = metadata.get(f"tokenizer.ggml.{role}_token_id")
    if isinstance(token_id, int) and 0 <= token_id < len(tokens):
        return token_id, tokens[token_id]
    return None


def _set_post_processor(
    inner: tokenizers.Tokenizer,
    metadata: Mapping[str, Any],
    *,
    bos: tuple[int, str] | None,
    eos: tuple[int, str] | None,
    add_bos_default: bool,
) -> None:
    add_bos = bos is not None and bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos_default))
    add_eos = eos is not None and bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    if not (add_bos or add_eos):
        return
    single, specials = "$A", []
    if add_bos and bos is not None:
        single = f"{bos[1]} {single}"
        specials.append((bos[1], bos[0]))
    if add_eos and eos is not None:
        single = f"{single} {eos[1]}"
        specials.append((eos[1], eos[0]))
    pair = f"{single} {single.replace('$A', '$B')}"
    inner.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=list(dict.fromkeys(specials))
    )
