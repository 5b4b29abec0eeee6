"""Multi-turn chat sessions: prompts that repeat the conversation so far, for the prefix cache.

A :class:`Sessions` workload turns a workload's arrivals into session starts and its lengths into
turns: each drawn (prompt, output) pair is one turn's new user message and its answer. Turn ``k``
of a session asks with ``system prompt + (message, answer) of turns 1..k-1 + message k`` and
answers with turn ``k``'s answer, so its prompt is the previous turn's prompt and answer plus one
new message: a prefix cache that kept the previous turn's blocks computes only the new message.
The system prompt (``system_prompt_tokens``, may be 0) is the same for every session.

Each request carries token ids (:class:`~stallfree.core.request.PromptBlocks`) for its prompt
and its answer, so the simulator caches answer blocks as vLLM does. Turns arrive open loop:
``think_time_s`` after the previous turn *arrived*, whatever its latency (``stallfree bench``
runs sessions closed loop, each turn sent once the previous answer is back, and ``validate
--measured`` replays those arrival times).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stallfree.core.request import PromptBlocks

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_SEGMENT_BITS = 32  # token ids: (segment number << 32) + position in it; the system prompt is segment 0


@dataclass(frozen=True, slots=True)
class Sessions:
    """``turns`` requests a session (see the module docstring)."""

    turns: int
    system_prompt_tokens: int = 0
    think_time_s: float = 0.0

    def __post_init__(self) -> None:
        if self.turns <= 0:
            raise ValueError(f"turns must be positive, got {self.turns}")
        if self.system_prompt_tokens < 0:
            raise ValueError(f"system_prompt_tokens must be >= 0, got {self.system_prompt_tokens}")
        if not (np.isfinite(self.think_time_s) and self.think_time_s >= 0):
            raise ValueError(f"think_time_s must be >= 0 s, got {self.think_time_s}")

    def num_sessions(self, num_requests: int) -> int:
        if num_requests % self.turns:
            raise ValueError(f"{num_requests} requests are not whole sessions of {self.turns} turns")
        return num_requests // self.turns


@dataclass(frozen=True, slots=True, eq=False)
class SessionTurns:
    """Sessions laid out as requests ordered by arrival: row ``i``'s session, turn, arrival time,
    prompt length, answer length and token ids (prompt, then answer)."""

    session: IntArray
    turn: IntArray
    arrival_time_s: FloatArray
    num_prompt_tokens: IntArray
    max_tokens: IntArray
    prompt_blocks: tuple[PromptBlocks, ...]


def session_turns(
    sessions: Sessions, starts_s: FloatArray, messages: IntArray, answers: IntArray
) -> SessionTurns:
    """Lay out ``len(starts_s)`` sessions; ``messages`` and ``answers`` hold their turns' lengths,
    session by session (turn 1 of session 1, turn 2 of session 1, ...)."""
    turns = sessions.turns
    rows: list[tuple[float, int, int, int, int, PromptBlocks]] = []
    for s, start_s in enumerate(starts_s.tolist()):
        lengths = slice(s * turns, (s + 1) * turns)
        conversation = conversation_blocks(
            sessions.system_prompt_tokens, s, messages[lengths].tolist(), answers[lengths].tolist()
        )
        for t, (num_prompt, blocks) in enumerate(conversation):
            answer = int(answers[s * turns + t])
            rows.append((start_s + t * sessions.think_time_s, s, t, num_prompt, answer, blocks))
    rows.sort(key=lambda row: row[0])  # stable: equal times keep session order
    return SessionTurns(
        session=np.array([r[1] for r in rows], dtype=np.int64),
        turn=np.array([r[2] for r in rows], dtype=np.int64),
        arrival_time_s=np.array([r[0] for r in rows], dtype=np.float64),
        num_prompt_tokens=np.array([r[3] for r in rows], dtype=np.int64),
        max_tokens=np.array([r[4] for r in rows], dtype=np.int64),
        prompt_blocks=tuple(r[5] for r in rows),
    )


def conversation_blocks(
    system_prompt_tokens: int, session: int, messages: list[int], answers: list[int]
) -> list[tuple[int, PromptBlocks]]:
    """One session's turns as (prompt length, token ids of prompt and answer): the system prompt's
    ids are the same in every session, each message's and answer's are its own."""
    history: tuple[int, ...] = tuple(range(system_prompt_tokens))
    out = []
    for t, (num_message, num_answer) in enumerate(zip(messages, answers, strict=True)):
        segment = ((session << 16) + t + 1) << (_SEGMENT_BITS + 1)
        message = tuple(range(segment, segment + num_message))
        answer = tuple(range(segment + (1 << _SEGMENT_BITS), segment + (1 << _SEGMENT_BITS) + num_answer))
        prompt = history + message
        out.append((len(prompt), PromptBlocks(prompt + answer)))
        history = prompt + answer
    return out


def renumbered(blocks: PromptBlocks, first_session: int) -> PromptBlocks:
    """A turn's token ids (:func:`conversation_blocks`) with the sessions numbered from
    ``first_session``: session ``s`` becomes ``first_session + s`` and the system prompt moves into
    session ``first_session``'s unused turn-0 slot, so conversations renumbered apart share no id
    (traffic classes of sessions)."""
    if first_session == 0:
        return blocks
    offset = first_session << (16 + _SEGMENT_BITS + 1)
    return PromptBlocks(tuple(offset + i for i in blocks.ids), blocks.tokens_per_id, blocks.num_tokens)


def measured_conversation(
    system_prompt_tokens: int, session: int, prompts: list[int], outputs: list[int]
) -> list[tuple[int, PromptBlocks]]:
    """:func:`conversation_blocks` for a session as a server counted it (its turns' prompt and
    output tokens, in turn order): each message is what its prompt adds to the previous turn's
    prompt and answer (at least one token: a server may tokenize the joins a little apart)."""
    messages, before = [], system_prompt_tokens
    for num_prompt, num_output in zip(prompts, outputs, strict=True):
        messages.append(max(1, num_prompt - before))
        before = num_prompt + num_output
    return conversation_blocks(system_prompt_tokens, session, messages, outputs)
