"""The server's step log (``stallfree serve --step-log FILE``): one JSON line per engine step.

Each line: ``start_s`` and ``end_s`` (the engine thread's ``time.perf_counter()`` around
``LLMEngine.step()``), ``executor_s`` (the model's share: forward and sampling) and ``chunks``
(``[num_computed_tokens, num_tokens, num_known_tokens]`` per scheduled chunk, the plan's shape
without request ids). ``stallfree validate --measured RESULT --step-log FILE`` prices every
logged plan with the measured model against its wall time: the per-step error of a served run.
Imports nothing beyond the core, so a machine without the server extra reads a log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from stallfree.core import ScheduledChunk, StepPlan
from stallfree.core.step import TimedStep


def write_step(out: IO[str], plan: StepPlan, start_s: float, end_s: float, executor_s: float) -> None:
    chunks = [[c.num_computed_tokens, c.num_tokens, c.num_known_tokens] for c in plan.chunks]
    line = {"start_s": start_s, "end_s": end_s, "executor_s": executor_s, "chunks": chunks}
    out.write(json.dumps(line, separators=(",", ":")) + "\n")


def load_step_log(path: str | Path) -> list[TimedStep]:
    """The steps of a step log; ValueError (one line) on a file that is not one."""
    steps = []
    try:
        with Path(path).open() as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    chunks = tuple(
                        ScheduledChunk(f"r{i}", int(done), int(tokens), int(known))
                        for i, (done, tokens, known) in enumerate(row["chunks"])
                    )
                    steps.append(
                        TimedStep(
                            StepPlan(chunks),
                            float(row["start_s"]),
                            float(row["end_s"]),
                            float(row["executor_s"]),
                        )
                    )
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path}:{number}: not a step-log line ({exc})") from None
    except OSError as exc:
        raise ValueError(f"cannot read step log {path}: {exc.strerror or exc}") from None
    if not steps:
        raise ValueError(f"{path}: no steps logged")
    return steps
