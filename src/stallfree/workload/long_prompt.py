"""The seed's experiment as one type: ``streams`` streams decoding at ``context_tokens`` of context,
then one ``prompt_tokens``-token prompt arrives after ``lead_steps`` steps, measured until
``tail_steps`` steps after its first token.

``stallfree explain`` runs it on one clock (:class:`~stallfree.explain.scenario.Scenario` adds how
prompts are cut); ``stallfree bench --scenario long-prompt`` against a live server
(:class:`~stallfree.bench.scenarios.LongPromptOptions` adds the requests' output lengths). Both
read these fields; their defaults here are the seed's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class LongPrompt:
    prompt_tokens: int = 16384
    streams: int = 16
    context_tokens: int = 1024
    lead_steps: int = 4  # steps every stream decodes before the prompt arrives
    tail_steps: int = 4  # steps measured after the prompt's first token

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "streams", "context_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.lead_steps < 2 or self.tail_steps < 0:
            raise ValueError("lead_steps must be >= 2 (so every run has a gap) and tail_steps >= 0")
