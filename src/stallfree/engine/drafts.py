"""Draft tokens for speculative decoding, from the request's own text: prompt lookup (n-gram).

The last ``n`` tokens (``n`` from ``max_n`` down to ``min_n``) are looked up earlier in the
prompt and output; the tokens that followed their latest earlier occurrence are the guess. It
costs a search, no model: it pays where the output repeats the prompt (summarising or editing
a document, code) and proposes nothing where it finds no match.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence


def propose_ngram(token_ids: Sequence[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``num_tokens`` tokens that followed the latest earlier occurrence of the sequence's
    longest suffix of ``min_n..max_n`` tokens seen before; [] if none is."""
    if num_tokens <= 0 or not 0 < min_n <= max_n:
        return []
    length = len(token_ids)
    if length <= min_n:
        return []
    text = array("i", token_ids).tobytes()  # 4 bytes a token: bytes.rfind does the search in C
    width = 4
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = text[(length - n) * width :]
        limit = (length - 1) * width  # an occurrence starts before the suffix does
        while (at := text.rfind(suffix, 0, limit)) >= 0:
            if at % width == 0:
                start = at // width + n
                return list(token_ids[start : start + num_tokens])
            limit = at + len(suffix) - 1  # straddles two tokens: look before it
    return []
