"""Agent sessions: turns that wait for others to finish, and the synthetic coding agents.

An agent resends its whole context every turn: a long prefix every agent shares (system prompt
and tool schemas), then the session so far, then what its last tool call returned. The turn
after an answer is sent only once that answer is back and the tool has run: a turn *arrives*
``delay_s`` after the last of the turns it ``wait_for`` has *finished* (closed loop). A turn
that waits for nothing arrives at its request's ``arrival_time_s`` (open loop: the session
starts). Sub-agents fan out after a turn (each waits for it) and the parent's next turn waits
for all of them (a join).

- :class:`AgentTurn` / :class:`AgentTurns`: the turns and their dependencies, checked once (ids
  unique, every ``wait_for`` id known, no cycle); the synthetic generator (:class:`Agents`) and
  the trace readers (:mod:`.agent_traces`) both make them.
- :class:`TurnQueue`: the turns as a simulation's arrivals (a
  :class:`~stallfree.sim.driver.ArrivalQueue`): a turn is released when its last dependency
  finishes (:meth:`TurnQueue.finished`), at that time plus its delay. A turn whose dependency
  never finishes (a rejected request) never arrives, as a client would stop that agent.

Synthetic prompts name their content for the prefix cache (:class:`~stallfree.core.request.
PromptBlocks`, one id per :data:`ID_TOKENS` tokens): an id names a position in one agent's
conversation, and the positions inside the shared prefix have the same ids in every agent, so
the prefix cache shares exactly the prefix and each agent's own history. Ids go on into the
answer, which the next turn's prompt repeats. Stdlib + numpy + core only.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass, field, replace

import numpy as np

from stallfree.core.request import PromptBlocks, Request
from stallfree.workload.arrivals import AllAtOnce, Arrivals, GammaArrivals
from stallfree.workload.lengths import Lengths, LognormalLengths

ID_TOKENS = 16
"""Tokens each synthetic prompt id names (a divisor of every usual KV block size)."""
DEFAULT_AGENT_LENGTHS = LognormalLengths(1000, 200)
"""Each turn's tool output (median 1,000 tokens) and answer (median 200), lognormal, sigma 1."""
ALL_AT_ONCE = AllAtOnce()
_STREAM_SHIFT = 32  # id = (conversation number << 32) + position in it; conversation 0: the shared prefix


@dataclass(frozen=True, slots=True)
class AgentTurn:
    """One request of an agent. ``extends``: the turn whose prompt and answer this prompt
    repeats before its new tokens (the session so far; None: a fresh context), what ``bench``
    sends as text."""

    request: Request
    wait_for: tuple[str, ...] = ()
    delay_s: float = 0.0
    extends: str | None = None

    def __post_init__(self) -> None:
        if not (np.isfinite(self.delay_s) and self.delay_s >= 0):
            raise ValueError(f"request {self.request.request_id}: delay must be >= 0 s, got {self.delay_s}")


@dataclass(frozen=True, slots=True, eq=False)
class AgentTurns:
    """A workload of agent turns, checked (see :func:`check_dependencies`). ``description``: a
    line for a report's header; ``shared_prefix_tokens``: the prefix every agent starts with
    (0: unknown, a trace's); ``ids_tokens``: tokens a prompt id names."""

    turns: tuple[AgentTurn, ...]
    description: str
    shared_prefix_tokens: int = 0
    by_id: dict[str, AgentTurn] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError("an agent workload needs at least one turn")
        object.__setattr__(self, "by_id", check_dependencies(self.turns))

    def __len__(self) -> int:
        return len(self.turns)

    @property
    def num_sessions(self) -> int:
        """Conversations (sub-agents count as their own)."""
        return len({t.request.session_id or t.request.request_id for t in self.turns})

    def queue(self) -> TurnQueue:
        """A fresh queue of these turns (one per simulated run: it keeps what has finished)."""
        return TurnQueue(self.turns)


def check_dependencies(turns: Sequence[AgentTurn]) -> dict[str, AgentTurn]:
    """The turns by request id; ValueError (one line) for a repeated id, a ``wait_for`` or
    ``extends`` id that no turn has, or a cycle of waits (which would never start)."""
    by_id: dict[str, AgentTurn] = {}
    for turn in turns:
        rid = turn.request.request_id
        if rid in by_id:
            raise ValueError(f"request id {rid!r} appears twice")
        by_id[rid] = turn
    for turn in turns:
        for other in (*turn.wait_for, *((turn.extends,) if turn.extends is not None else ())):
            if other not in by_id:
                raise ValueError(f"request {turn.request.request_id!r} waits for unknown request {other!r}")
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    for start in by_id:
        if state.get(start):
            continue
        path, stack = [start], [iter(by_id[start].wait_for)]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt]
                raise ValueError(f"requests wait for each other in a cycle: {' -> '.join(cycle)}")
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(by_id[nxt].wait_for))
    return by_id


class TurnQueue:
    """Agent turns as a run's arrivals: ``head`` is the earliest released turn not yet handed
    over, :meth:`advance` hands it over, :meth:`finished` releases what waited for a request."""

    __slots__ = ("_heap", "_left", "_number", "_waiters", "head")

    def __init__(self, turns: Sequence[AgentTurn]) -> None:
        self._waiters: dict[str, list[AgentTurn]] = {}
        self._left: dict[str, tuple[int, float]] = {}  # request id -> (dependencies left, last finish)
        self._heap: list[tuple[float, int, Request]] = []
        for turn in turns:
            rid = turn.request.request_id
            if not turn.wait_for:
                self._heap.append((turn.request.arrival_time_s, len(self._heap), turn.request))
                continue
            self._left[rid] = (len(set(turn.wait_for)), 0.0)
            for other in set(turn.wait_for):
                self._waiters.setdefault(other, []).append(turn)
        heapq.heapify(self._heap)
        self._number = len(turns)  # tie-breaker after the roots: release order
        self.head: Request | None = self._heap[0][2] if self._heap else None

    @property
    def num_waiting(self) -> int:
        """Turns still waiting for a request to finish."""
        return len(self._left)

    def advance(self) -> None:
        heapq.heappop(self._heap)
        self.head = self._heap[0][2] if self._heap else None

    def finished(self, request_id: str, end_s: float) -> None:
        """``request_id`` finished at ``end_s``: release the turns it was the last wait of."""
        for turn in self._waiters.pop(request_id, ()):
            rid = turn.request.request_id
            count, last_s = self._left[rid]
            if count > 1:
                self._left[rid] = (count - 1, max(last_s, end_s))
                continue
            del self._left[rid]
            arrival_s = max(last_s, end_s) + turn.delay_s
            self._number += 1
            heapq.heappush(
                self._heap, (arrival_s, self._number, replace(turn.request, arrival_time_s=arrival_s))
            )
        self.head = self._heap[0][2] if self._heap else None


@dataclass(frozen=True, slots=True)
class Agents:
    """Synthetic coding agents; every parameter is a documented knob (see ``docs/agents.md``).

    - ``num_agents``: main agents (sessions), starting as ``arrivals`` says (default all at 0 s).
    - ``turns``: turns each main agent takes; ``subagent_turns``: each sub-agent's.
    - ``shared_prefix_tokens``: system prompt + tool schemas, the same for every agent and
      sub-agent (the prefix cache's shared part).
    - ``lengths``: each turn's new prompt tokens (the tool output it appends; turn 1's: the task)
      and its answer tokens, drawn per turn (default lognormal, medians 1,000 and 200, sigma 1).
    - ``tool_wait_s``: mean seconds between an answer and the next turn (the tool running),
      exponential; 0: none.
    - ``subagent_probability``: after each main turn but the last, the chance it fans out
      ``subagent_width`` sub-agents; each starts from the shared prefix and a task (a drawn
      message) once that turn finishes, and the main agent's next turn waits for all of them.
    """

    num_agents: int
    turns: int = 8
    shared_prefix_tokens: int = 16_000
    lengths: Lengths = DEFAULT_AGENT_LENGTHS
    tool_wait_s: float = 2.0
    subagent_probability: float = 0.1
    subagent_width: int = 3
    subagent_turns: int = 3
    arrivals: Arrivals = ALL_AT_ONCE

    def __post_init__(self) -> None:
        for name in ("num_agents", "turns", "subagent_width", "subagent_turns"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}")
        if isinstance(self.shared_prefix_tokens, bool) or self.shared_prefix_tokens < 0:
            raise ValueError(f"shared_prefix_tokens must be >= 0, got {self.shared_prefix_tokens}")
        if not (np.isfinite(self.tool_wait_s) and self.tool_wait_s >= 0):
            raise ValueError(f"tool_wait_s must be >= 0 s, got {self.tool_wait_s}")
        if not 0 <= self.subagent_probability <= 1:
            raise ValueError(f"subagent_probability must be in [0, 1], got {self.subagent_probability}")

    def describe(self) -> str:
        fan = (
            f"; after a turn, {self.subagent_width} sub-agents of {self.subagent_turns} turns with "
            f"probability {self.subagent_probability:g}"
            if self.subagent_probability
            else ""
        )
        starts = self.arrivals
        when = (
            "all at once"
            if not isinstance(starts, GammaArrivals)
            else f"at {starts.qps:g}/s"
            if starts.burstiness == 1
            else f"at {starts.qps:g}/s (gamma, burstiness {starts.burstiness:g})"
        )
        return (
            f"{self.num_agents} agents of {self.turns} turns starting {when}; shared prefix {self.shared_prefix_tokens} "
            f"tokens; each turn's tool output and answer {_named(self.lengths)}; tool wait "
            f"{self.tool_wait_s:g} s mean{fan}"
        )


def _named(lengths: Lengths) -> str:
    kind = type(lengths).__name__.removesuffix("Lengths").lower()
    return f"{kind}({', '.join(str(v) for v in astuple(lengths))})"


def agent_turns(agents: Agents, seed: int = 0) -> AgentTurns:
    """Draw ``agents``' turns: the same (agents, seed), the same turns. Start times and the rest
    draw from separate streams, so changing the arrival rate keeps every agent's turns."""
    arrival_seed, shape_seed = np.random.SeedSequence(seed).spawn(2)
    starts_s = agents.arrivals.times_s(agents.num_agents, np.random.default_rng(arrival_seed))
    builder = _Builder(agents, np.random.default_rng(shape_seed))
    for a, start_s in enumerate(starts_s.tolist()):
        builder.main_agent(a, start_s)
    return AgentTurns(tuple(builder.turns), agents.describe(), agents.shared_prefix_tokens)


@dataclass(slots=True)
class _Conversation:
    """One agent's context as it grows: its number (ids), length and last turn."""

    number: int
    session_id: str
    num_tokens: int
    last: str | None = None


class _Builder:
    """Lays out agents turn by turn, drawing lengths, waits and fan-outs from one generator."""

    def __init__(self, agents: Agents, rng: np.random.Generator) -> None:
        self.agents, self.rng = agents, rng
        self.turns: list[AgentTurn] = []
        self._numbers = iter(range(1, 1 << 30))

    def main_agent(self, a: int, start_s: float) -> None:
        agents = self.agents
        chat = self._conversation(f"agent-{a}")
        joins: tuple[str, ...] = ()
        for t in range(agents.turns):
            waits = () if chat.last is None else (chat.last, *joins)
            rid = self._turn(chat, f"{a}.{t}", waits, start_s if t == 0 else self._wait())
            joins = ()
            if t + 1 < agents.turns and self.rng.random() < agents.subagent_probability:
                joins = tuple(self._subagent(f"{a}.{t}.{k}", rid) for k in range(agents.subagent_width))

    def _subagent(self, name: str, parent: str) -> str:
        """A sub-agent started by ``parent``'s answer; its last turn's id (what the join waits for)."""
        chat = self._conversation(f"agent-{name}")
        for j in range(self.agents.subagent_turns):
            waits = (parent,) if chat.last is None else (chat.last,)
            self._turn(chat, f"{name}.{j}", waits, 0.0 if chat.last is None else self._wait())
        assert chat.last is not None
        return chat.last

    def _conversation(self, session_id: str) -> _Conversation:
        return _Conversation(next(self._numbers), session_id, self.agents.shared_prefix_tokens)

    def _wait(self) -> float:
        mean_s = self.agents.tool_wait_s
        return float(self.rng.exponential(mean_s)) if mean_s > 0 else 0.0

    def _turn(self, chat: _Conversation, rid: str, waits: tuple[str, ...], when_s: float) -> str:
        """Append a turn to ``chat``: ``when_s`` is its start (no waits) or its delay after them."""
        new, answer = (int(x[0]) for x in self.agents.lengths.sample(1, self.rng))
        num_prompt = chat.num_tokens + new
        total = num_prompt + answer
        request = Request(
            request_id=rid,
            num_prompt_tokens=num_prompt,
            max_tokens=answer,
            arrival_time_s=0.0 if waits else when_s,
            prompt_blocks=PromptBlocks(
                tuple(_ids(chat.number, self.agents.shared_prefix_tokens, total)), ID_TOKENS, total
            ),
            session_id=chat.session_id,
        )
        self.turns.append(AgentTurn(request, waits, when_s if waits else 0.0, chat.last))
        chat.num_tokens, chat.last = total, rid
        return rid


def _ids(conversation: int, prefix_tokens: int, num_tokens: int) -> Iterator[int]:
    """Ids of the first ``num_tokens`` tokens of a conversation: positions wholly inside the
    shared prefix are the same in every conversation, the rest its own."""
    shared = prefix_tokens // ID_TOKENS
    own = conversation << _STREAM_SHIFT
    for unit in range(-(-num_tokens // ID_TOKENS)):
        yield unit if unit < shared else own + unit
