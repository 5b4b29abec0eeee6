"""``LLM``: vLLM-style offline generation, ``LLM(model=...).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stallfree.core import SamplingParams
from stallfree.engine.config import EngineConfig
from stallfree.engine.engine import LLMEngine
from stallfree.engine.requests import RequestOutput


class LLM:
    """A thin batch wrapper: queue every prompt, step the engine until all finish."""

    def __init__(self, config: EngineConfig | str = "random:small", **options: Any) -> None:
        """``config`` and ``options`` as :class:`~stallfree.engine.engine.LLMEngine` takes them."""
        self.engine = LLMEngine(config, **options)

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Final outputs, in prompt order. Prompts are texts or lists of token ids."""
        items: list[str | Sequence[int]] = [prompts] if isinstance(prompts, str) else list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(items)
        else:
            params = list(sampling_params)
            if len(params) != len(items):
                raise ValueError(f"{len(params)} sampling params for {len(items)} prompts")
        request_ids = []
        try:
            for item, p in zip(items, params, strict=True):
                if isinstance(item, str):
                    request_ids.append(self.engine.add_request(prompt=item, sampling_params=p))
                else:
                    request_ids.append(
                        self.engine.add_request(prompt_token_ids=list(item), sampling_params=p)
                    )
        except ValueError:
            for rid in request_ids:  # leave nothing queued behind a bad prompt
                self.engine.abort_request(rid)
            raise
        final: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step().outputs:
                if out.finished:
                    final[out.request_id] = out
        return [final[rid] for rid in request_ids]

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling_params: SamplingParams | None = None,
    ) -> RequestOutput:
        """Reply to one conversation ([{"role", "content"}, ...]) through the model's chat template."""
        return self.generate([self.engine.tokenizer.encode_chat(messages)], sampling_params)[0]
