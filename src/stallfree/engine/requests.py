"""What the engine knows about each request beyond the scheduler: token ids, text, stops.

The core's requests hold no token ids; :class:`RequestState` keeps the prompt and
generated ids, the request's sampling generator, and the incrementally detokenized text.
:class:`RequestOutput` is the immutable snapshot callers see (vLLM's field names,
flattened to the one completion a request has here).
"""

from __future__ import annotations

import torch

from stallfree.core import SamplingParams
from stallfree.core.outputs import RequestOutput as RequestOutput  # the engine's outputs, re-exported
from stallfree.engine.drafts import DraftHistory
from stallfree.engine.tokenizer import Tokenizer, detokenize_incrementally

# Prompt tokens kept as left context when detokenizing the first generated tokens.
_DETOKENIZE_CONTEXT = 5


class RequestState:
    """Mutable per-request state, owned by one engine."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        generator: torch.Generator,
        eos_token_ids: tuple[int, ...],
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.num_prompt_tokens = len(prompt_token_ids)
        self.prompt_token_ids = tuple(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)  # prompt + generated: what the runner reads
        self.params = params
        self.generator = generator
        self.drafts: list[int] = []  # draft tokens proposed for its next step (speculative decoding)
        self.draft_history = DraftHistory()
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops.update(eos_token_ids)
        self._stop_token_ids = frozenset(stops)
        self.text = ""
        self.logprobs: list[float] = []
        self.top_logprobs: list[tuple[tuple[int, float], ...]] = []
        self._prefix_offset = max(0, self.num_prompt_tokens - _DETOKENIZE_CONTEXT)
        self._read_offset = self.num_prompt_tokens
        self._stopped_by_string = False
        self._emitted_tokens = 0
        self._emitted_chars = 0
        # The last characters of an unfinished text may begin a stop string that a later token
        # completes and cuts away: streamed deltas hold them back until the text moves past them.
        self._stop_holdback = max((len(s) for s in params.stop), default=1) - 1

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    def append(
        self,
        token_id: int,
        logprob: float | None,
        tokenizer: Tokenizer,
        top_logprobs: tuple[tuple[int, float], ...] = (),
    ) -> bool:
        """Record a sampled token; True if it ends the request (stop token or stop string)."""
        self.token_ids.append(token_id)
        if logprob is not None:
            self.logprobs.append(logprob)
            if self.params.top_logprobs:
                self.top_logprobs.append(top_logprobs)
        if token_id in self._stop_token_ids:
            return True
        if self.params.stop:
            return self.update_text(tokenizer)
        return False

    def update_text(self, tokenizer: Tokenizer) -> bool:
        """Detokenize new tokens into ``text``; True if a stop string appeared (text cut before it)."""
        if self._stopped_by_string:
            return True
        new_text, self._prefix_offset, self._read_offset = detokenize_incrementally(
            tokenizer, self.token_ids, self._prefix_offset, self._read_offset
        )
        if not new_text:
            return False
        search_from = max(0, len(self.text) - max((len(s) for s in self.params.stop), default=0) + 1)
        self.text += new_text
        hits = [i for i in (self.text.find(s, search_from) for s in self.params.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self._stopped_by_string = True
        return self._stopped_by_string

    def snapshot(self, finish_reason: str | None) -> RequestOutput:
        """The output now, with what changed since the previous snapshot."""
        output_ids = self.output_token_ids
        finished = finish_reason is not None
        visible = (
            len(self.text) if finished else max(self._emitted_chars, len(self.text) - self._stop_holdback)
        )
        out = RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            text=self.text,
            token_ids=tuple(output_ids),
            finished=finished,
            finish_reason=finish_reason,
            new_text=self.text[self._emitted_chars : visible],
            new_token_ids=tuple(output_ids[self._emitted_tokens :]),
            logprobs=tuple(self.logprobs) if self.params.logprobs else None,
            top_logprobs=tuple(self.top_logprobs)
            if self.params.logprobs and self.params.top_logprobs
            else None,
        )
        self._emitted_tokens = len(output_ids)
        self._emitted_chars = visible
        return out
