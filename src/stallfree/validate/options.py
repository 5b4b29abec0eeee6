"""Everything ``stallfree validate`` can be asked, as one frozen value: :class:`ValidationOptions`.

The command line builds one from its flags (the scheduler's from
:class:`~stallfree.core.serving.ServingConfig`, one per policy); :func:`~stallfree.validate.run.
validate` runs it. Construction refuses a combination that cannot run, in the command line's own
words (``--flag``); what needs a file to check (the profile, a bench result, a step log) is
refused when the options run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

from stallfree.core.serving import ServingConfig
from stallfree.sim.speculative import Acceptance

Sampling = Literal["greedy", "temperature", "top-p"]
SAMPLINGS: tuple[Sampling, ...] = ("greedy", "temperature", "top-p")
"""Every request's sampler: greedy; temperature: T=1; top-p: T=1, p=0.9."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationOptions:
    """One validation: the same requests through the real engine (or read from a measured run)
    and through the simulator priced by ``profile``.

    ``servings``: one scheduler configuration per policy compared, each the same on both sides.
    ``model``, ``dtype``, ``device``: the engine's (None: the profiled ones). ``measured``: a
    ``stallfree bench --save-result`` file as the measured side instead of an engine run (its
    requests and arrival times replace the workload; one policy, with the served engine's
    ``num_blocks``); ``step_log``: with it, the server's ``serve --step-log`` of that run, for the
    per-step error; ``acceptance``: with speculative decoding (``measured`` only), how the
    simulator's drafts fare. ``replicas`` > 1 (with ``measured``): the run went through a router in front of
    that many replicas, each as the profile; the prediction routes the same requests with ``router``.
    The workload: Poisson arrivals at ``qps`` (gamma with ``burstiness``),
    ``lengths``, ``num_requests``, ``seed`` (the step noise's too); with ``turns``, the arrivals
    start multi-turn chat sessions (:class:`~stallfree.workload.Sessions`, with a shared
    ``system_prompt_tokens`` and ``think_time_s``) and ``num_requests`` is sessions x turns: the
    engine's prompts repeat the conversation so far, its own answers included. ``step_noise``: also predict
    with each step varied as the profiled machine's steps varied. ``progress``: a progress bar
    on stderr while the engine runs.
    """

    profile: str
    servings: tuple[ServingConfig, ...] = (ServingConfig(),)
    model: str | None = None
    dtype: str | None = None
    device: str | None = None
    measured: str | None = None
    step_log: str | None = None
    sampling: Sampling | None = None  # None: the bench run's (``measured``), else greedy
    qps: float = 1.0
    burstiness: float | None = None
    lengths: str = "fixed:512,64"
    num_requests: int = 150
    seed: int = 0
    turns: int | None = None
    system_prompt_tokens: int = 0
    think_time_s: float = 0.0
    step_noise: bool = False
    progress: bool = False
    replicas: int = 1
    router: str = "round-robin"
    acceptance: Acceptance | None = None  # with speculative decoding: how the simulated drafts fare

    def __post_init__(self) -> None:
        if not self.servings:
            raise ValueError("validate needs at least one serving configuration (--policy)")
        policies = [s.policy for s in self.servings]
        if len(set(policies)) != len(policies):
            raise ValueError(f"policy listed twice: {', '.join(policies)}")
        if self.sampling is not None and self.sampling not in SAMPLINGS:
            raise ValueError(f"unknown sampling {self.sampling!r}; choose from: {', '.join(SAMPLINGS)}")
        if self.num_requests <= 0:
            raise ValueError(f"--num-requests must be positive, got {self.num_requests}")
        if self.measured and self.turns is not None:
            raise ValueError("--measured brings its own requests: drop --sessions")
        if self.step_log and not self.measured:
            raise ValueError(
                "--step-log goes with --measured (in process, validate times the engine's steps itself)"
            )
        if self.measured and len(self.servings) != 1:
            raise ValueError("--measured compares one run: give one --policy")
        if self.replicas > 1 and not self.measured:
            raise ValueError("a fleet is measured behind a real router: give --measured (its bench result)")
        if any(s.num_speculative_tokens for s in self.servings):
            if not self.measured:
                raise ValueError(
                    "speculative decoding is validated against a served run (--measured): the engine's own "
                    "drafts come from its text, the simulator's from the acceptance that run's counters report"
                )
            if self.acceptance is None:
                raise ValueError("speculative decoding needs the drafts' acceptance (--acceptance-rate)")
        if self.measured and self.servings[0].num_blocks is None:
            raise ValueError("--measured needs --num-blocks (the served engine's KV blocks)")

    @property
    def sampling_mode(self) -> Sampling:
        """``sampling``, or the bench run's (``measured``), else greedy."""
        return self.sampling or _measured_sampling(self.measured)


def _measured_sampling(path: str | None) -> Sampling:
    """How a bench run's requests sampled (greedy without a run)."""
    if path is None:
        return "greedy"
    from stallfree.workload.bench_result import load_bench_result

    return cast("Sampling", load_bench_result(path).sampling_mode)
