"""Synthetic prompts of about N tokens on a server whose tokenizer the client does not know.

Text is random common English words (seeded, different per request, so no prefix cache helps).
Its length in tokens is a straight line in its length in characters; :func:`calibrate` measures
that line on the server itself: two non-streamed probes (``max_tokens=1``; 128 characters and
as many as the listed context surely holds, up to 4,096) and their ``usage.prompt_tokens``, so
the fixed part (BOS, templates) and the slope are both the server's.
Counts are approximate (words tokenize unevenly); the benchmark reports the server's real
counts from ``usage``. Where a length is a cap, :func:`fit_prompts` trims each prompt until the
server's own tokenizer (its ``/tokenize`` route) counts at most the requested tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from stallfree.bench.client import Endpoint, complete, count_tokens

_WORDS_TEXT = (
    "the of and to in is was that for on with as by at from his her they this have are be not but "
    "had one all were we when your can said there use each which she do how their if will up other "
    "about out many then them these so some would make like him into time has look two more write go "
    "see number no way could people my than first water been call who oil its now find long down day "
    "did get come made may part over new sound take only little work know place year live me back "
    "give most very after thing our just name good sentence man think say great where help through "
    "much before line right too mean old any same tell boy follow came want show also around form "
    "three small set put end does another well large must big even such because turn here why ask "
    "went men read need land different home us move try kind hand picture again change off play "
    "spell air away animal house point page letter mother answer found study still learn should "
    "world high every near add food between own below country plant last school father keep tree "
    "never start city earth eye light thought head under story saw left few while along might close "
    "something seem next hard open example begin life always those both paper together got group "
    "often run "
)
_WORDS = tuple(_WORDS_TEXT.split())

# Probe lengths in characters: the long one as long as the context surely holds (ASCII text is at
# most one token per character), so long prompts are sized by interpolation, not extrapolation.
_SHORT_PROBE_CHARS = 128
_LONG_PROBE_CHARS = 4096
_DEFAULT_CONTEXT = 1024


@dataclass(frozen=True, slots=True)
class PromptSizer:
    """``tokens = tokens_per_char * chars + fixed_tokens``, measured on one server."""

    tokens_per_char: float
    fixed_tokens: float = 0.0

    def __post_init__(self) -> None:
        if not self.tokens_per_char > 0:
            raise ValueError(f"tokens_per_char must be positive, got {self.tokens_per_char}")

    def num_chars(self, num_tokens: int) -> int:
        return max(1, round((num_tokens - self.fixed_tokens) / self.tokens_per_char))

    def num_tokens(self, num_chars: int) -> int:
        """About how many tokens ``num_chars`` characters are on the calibrated server."""
        return max(1, round(self.tokens_per_char * num_chars + self.fixed_tokens))

    def prompt(self, num_tokens: int, rng: random.Random) -> str:
        """Random words, about ``num_tokens`` tokens long on the calibrated server."""
        return synthetic_text(self.num_chars(num_tokens), rng)


def synthetic_text(num_chars: int, rng: random.Random) -> str:
    """Random words, exactly ``num_chars`` characters (the last word may be cut)."""
    words: list[str] = []
    length = 0
    while length < num_chars:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:num_chars]


async def calibrate(http: httpx.AsyncClient, endpoint: Endpoint, seed: int = 0) -> PromptSizer:
    """Fit the characters -> tokens line from two probes; ValueError if the server reports no usage."""
    rng = random.Random(seed)
    points: list[tuple[int, int]] = []
    context = endpoint.max_model_len or _DEFAULT_CONTEXT
    long_probe = max(2 * _SHORT_PROBE_CHARS, min(_LONG_PROBE_CHARS, context - 64))
    for num_chars in (_SHORT_PROBE_CHARS, long_probe):
        answer = await complete(http, endpoint, synthetic_text(num_chars, rng), max_tokens=1)
        tokens = (answer.get("usage") or {}).get("prompt_tokens")
        if not isinstance(tokens, int) or tokens <= 0:
            raise ValueError(
                "the server reports no usage.prompt_tokens; pass --chars-per-token to size prompts"
            )
        points.append((num_chars, tokens))
    (c1, t1), (c2, t2) = points
    slope = (t2 - t1) / (c2 - c1)
    if slope <= 0:
        raise ValueError(f"calibration probes of {c1} and {c2} characters gave {t1} and {t2} tokens")
    return PromptSizer(tokens_per_char=slope, fixed_tokens=max(0.0, t1 - slope * c1))


# Without a tokenize route a cap is kept by aiming this much short of it (the calibration line
# is off by a few percent and a few tokens at most on random words).
FALLBACK_MARGIN = 0.05
FALLBACK_TOKENS = 4


async def fit_prompts(
    http: httpx.AsyncClient, endpoint: Endpoint, texts: list[str], targets: list[int]
) -> tuple[list[str], bool]:
    """Trim each text until the server counts at most its target tokens; the texts and whether
    the server could count them (False: no tokenize route; the texts are returned unchanged and
    the caller must size with :data:`FALLBACK_MARGIN` instead)."""
    fitted = []
    for text, target in zip(texts, targets, strict=True):
        count = await count_tokens(http, endpoint, text)
        if count is None:
            return texts, False
        for _ in range(8):
            if count <= target or len(text) <= 1:
                break
            # Cut in proportion, at least one character, then ask again.
            text = text[: max(1, min(len(text) - 1, int(len(text) * target / count)))]
            new_count = await count_tokens(http, endpoint, text)
            if new_count is None:
                return texts, False
            count = new_count
        fitted.append(text)
    return fitted, True


def fallback_target(num_tokens: int) -> int:
    return max(1, int(num_tokens * (1 - FALLBACK_MARGIN)) - FALLBACK_TOKENS)
