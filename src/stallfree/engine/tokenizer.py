"""Text <-> token ids: Hugging Face ``tokenizer.json`` via ``tokenizers``, plus the chat template.

:class:`Tokenizer` wraps a ``tokenizers.Tokenizer``; encoding adds special tokens the way
the file's post-processor says (BOS for Llama, none for Qwen2). The chat template comes
from ``tokenizer_config.json`` (or ``chat_template.jinja``) when present and is rendered
with a sandboxed jinja2 environment.

:func:`random_tokenizer` builds the offline tokenizer of ``random:`` models: a byte-level
BPE trained in-process on a seeded pseudo-language (syllable words), exactly
``vocab_size`` tokens, so every id a random model emits decodes to text. Its alphabet is
printable ASCII plus newline (other bytes encode as ``<unk>``), so whatever a random
model emits is readable. Training is deterministic and cached per vocabulary size.

:func:`detokenize_incrementally` turns a growing id list into text deltas without
emitting half a multi-byte character.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2 in random tokenizers
RANDOM_BOS_ID = 1
RANDOM_EOS_ID = 2
RANDOM_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Byte-level BPE spells byte b as chr(b) when printable, else as a shifted code point
# (GPT-2's map): space is "Ġ" (U+0120), newline "Ċ" (U+010A).
_RANDOM_ALPHABET = ("\u0120", "\u010a", *(chr(b) for b in range(33, 127)))
_MIN_RANDOM_VOCAB = len(SPECIAL_TOKENS) + len(_RANDOM_ALPHABET)


class Tokenizer:
    """Encode/decode and the chat template of one model."""

    def __init__(
        self,
        inner: tokenizers.Tokenizer,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.inner = inner
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_folder(cls, folder: Path) -> Tokenizer:
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"no tokenizer.json in {folder} (only fast tokenizers are supported)")
        try:
            inner = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own exception type
            raise ValueError(f"cannot read {path}: {exc}") from None
        config = _read_json(folder / "tokenizer_config.json")
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja_file = folder / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        specials = {
            key: _token_text(config.get(key))
            for key in ("bos_token", "eos_token")
            if config.get(key) is not None
        }
        return cls(inner, template if isinstance(template, str) else None, specials)

    @property
    def vocab_size(self) -> int:
        return int(self.inner.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.inner.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` ([{"role", "content"}]) to the prompt text the model was tuned on."""
        if self.chat_template is None:
            raise ValueError("this model's tokenizer has no chat template")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ValueError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **self.special_tokens
        )

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """The prompt ids of a conversation: the one chat encoding path (``LLM.chat``,
        ``generate --chat`` and the server's chat endpoint all use it).

        The rendered text is encoded WITHOUT added special tokens, as transformers does: the
        template writes any BOS itself, and adding one again gives Llama-style models two.
        """
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text, add_special_tokens=False)

    def save(self, folder: Path, model_max_length: int) -> None:
        """Write ``tokenizer.json`` and a ``tokenizer_config.json`` transformers understands."""
        self.inner.save(str(folder / "tokenizer.json"))
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": model_max_length,
            **self.special_tokens,
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def random_tokenizer(vocab_size: int) -> Tokenizer:
    """The offline byte-level BPE of ``random:`` models, exactly ``vocab_size`` tokens."""
    if vocab_size < _MIN_RANDOM_VOCAB:
        raise ValueError(f"random tokenizer needs vocab_size >= {_MIN_RANDOM_VOCAB}, got {vocab_size}")
    inner = tokenizers.Tokenizer.from_str(_trained_bpe_json(vocab_size))
    specials = {
        "unk_token": SPECIAL_TOKENS[0],
        "bos_token": SPECIAL_TOKENS[1],
        "eos_token": SPECIAL_TOKENS[2],
    }
    return Tokenizer(inner, RANDOM_CHAT_TEMPLATE, specials)


@functools.lru_cache(maxsize=8)
def _trained_bpe_json(vocab_size: int) -> str:
    rng = random.Random(0)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    # ~100k words of 1-4 syllables: enough distinct pairs to learn 32k merges.
    words = [" " + "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(100_000)]
    inner = tokenizers.Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[0]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=list(_RANDOM_ALPHABET),
        limit_alphabet=len(_RANDOM_ALPHABET),
        show_progress=False,
    )
    inner.train_from_iterator(words, trainer)
    if inner.get_vocab_size() != vocab_size:
        raise ValueError(
            f"random tokenizer: the built-in corpus yields {inner.get_vocab_size()} tokens, not {vocab_size}"
        )
    bos = SPECIAL_TOKENS[RANDOM_BOS_ID]
    inner.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, RANDOM_BOS_ID)]
    )
    return str(inner.to_str())


def detokenize_incrementally(
    tokenizer: Tokenizer, token_ids: Sequence[int], prefix_offset: int, read_offset: int
) -> tuple[str, int, int]:
    """New text since ``read_offset``, and the offsets to pass next time.

    Decoding ``token_ids[prefix_offset:]`` against ``token_ids[prefix_offset:read_offset]``
    keeps a few tokens of left context (so tokenizers that strip a leading space decode
    words right) and holds back text that ends in an incomplete UTF-8 sequence.
    """
    prefix_text = tokenizer.decode(token_ids[prefix_offset:read_offset])
    full_text = tokenizer.decode(token_ids[prefix_offset:])
    if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
        return full_text[len(prefix_text) :], read_offset, len(token_ids)
    return "", prefix_offset, read_offset


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: object) -> str:
    # tokenizer_config.json stores special tokens as a string or an AddedToken dict.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value)
