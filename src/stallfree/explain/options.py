"""Everything ``stallfree explain`` can be asked, as one frozen value: :class:`ExplainOptions`.

The command line builds one from its flags, the page from its query; :func:`~stallfree.explain.
backends.run_explain` runs it. An option left ``None`` takes its engine's default
(:data:`SCENARIO_DEFAULTS`): the seed's scenario on the roofline, a CPU-sized one on the real
engine. Construction refuses what cannot run, in the command line's own words (``--flag``);
what needs a model, a device or a file to check (a spec that does not load, weights that do not
fit, a ``--device`` torch lacks, a ``--dtype`` it cannot run) is refused when the options run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stallfree.costs.kv_transfer import DEFAULT_KV_LINK
from stallfree.costs.roofline import COST_MODEL_KINDS, cost_model_kind
from stallfree.explain.disaggregate import parse_pools
from stallfree.explain.scenario import DEFAULT_SWEEP, Scenario
from stallfree.sim.speculative import Acceptance

Engine = Literal["roofline", "torch"]
ENGINES: tuple[Engine, ...] = ("roofline", "torch")
# The step pricers explain takes: the roofline's kinds, and a profile's measured model.
EXPLAIN_COST_MODELS = (*COST_MODEL_KINDS, "measured")
ENGINE_SWEEP = (16, 32, 64, 128, 256, 512)  # --engine torch: every chunk is a real run
SEED = Scenario()  # the seed's scenario: its sizes are the roofline's defaults


@dataclass(frozen=True, slots=True)
class ScenarioDefaults:
    """An engine's scenario when the options leave its sizes out."""

    model: str
    prompt_tokens: int
    context_tokens: int
    chunk_tokens: int | None  # None: the timer's ridge point (measured, on the real engine)


SCENARIO_DEFAULTS: dict[Engine, ScenarioDefaults] = {
    "roofline": ScenarioDefaults("llama-3.1-70b", SEED.prompt_tokens, SEED.context_tokens, SEED.chunk_tokens),
    "torch": ScenarioDefaults("random:medium", 2048, 256, None),
}


@dataclass(frozen=True, slots=True)
class ExplainOptions:
    """One ``stallfree explain`` run: which clock prices the steps, and the scenario's sizes.

    ``model``, ``prompt_tokens``, ``context_tokens``, ``chunk_tokens`` and ``sweep``: None takes
    the engine's default. ``hardware``, ``tp`` and ``cost_model`` are the roofline's; ``device``
    and ``dtype`` the real engine's; ``gpu_tables``, ``framework`` and ``framework_version`` pick
    measured GPU tables, ``expert_parallel`` splits a MoE model's experts whole over the ``tp``
    GPUs (:class:`~stallfree.costs.choice.CostChoice`'s). ``profile`` (a ``stallfree profile`` file): on the roofline it
    prices every step (as ``cost_model="measured"``, which needs it); with ``engine="torch"`` it
    prices the same scenario beside the measured run, and predicts the steps of a
    ``step_budget_ms`` (which the real engine needs it for). ``speculative_tokens`` (priced steps
    only): the streams verify up to that many drafts a step, accepted as ``acceptance_rate`` says.
    ``disaggregate`` (``xPyD``, priced GPU deployments only): a row with the prompt on prefill GPUs
    and its KV shipped over ``kv_link`` to the streams' decode GPUs.
    """

    engine: Engine = "roofline"
    model: str | None = None
    hardware: str = "a100-40gb"
    tp: int = 4
    cost_model: str = "weights-only"  # aliases (seed) are resolved
    profile: str | None = None
    gpu_tables: str = "auto"
    framework: str | None = None
    framework_version: str | None = None
    expert_parallel: bool = False
    device: str | None = None
    dtype: str = "auto"
    prompt_tokens: int | None = None
    streams: int = SEED.streams
    context_tokens: int | None = None
    chunk_tokens: int | None = None
    step_budget_ms: float | None = None
    sweep: tuple[int, ...] | None = None
    cached_prefix_tokens: int = 0
    cached_prefix_link: str | None = None
    speculative_tokens: int = 0
    acceptance_rate: str = "0.7"
    disaggregate: str | None = None
    kv_link: str = DEFAULT_KV_LINK

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost_model", cost_model_kind(self.cost_model))  # frozen: normalise
        if self.sweep is not None:
            object.__setattr__(self, "sweep", tuple(self.sweep))  # a list from a parser is fine
        _choose("engine", self.engine, ENGINES)
        _choose("cost-model", self.cost_model, EXPLAIN_COST_MODELS)
        for name in ("tp", "prompt_tokens", "streams", "context_tokens", "chunk_tokens"):
            _positive(name, getattr(self, name), whole=True)
        for chunk in self.sweep or ():
            _positive("sweep", chunk, whole=True)
        _positive("step_budget_ms", self.step_budget_ms, whole=False)
        if self.cached_prefix_tokens:
            _positive("cached_prefix_tokens", self.cached_prefix_tokens, whole=True)
            if self.engine == "torch":
                raise ValueError("--cached-prefix-tokens runs on the roofline engine (or a --profile) only")
        if self.cached_prefix_link is not None and (
            not self.cached_prefix_tokens or self.is_priced_by_profile or self.engine == "torch"
        ):
            raise ValueError(
                "--cached-prefix-link says where a cached prefix is loaded from: give --cached-prefix-tokens, "
                "on a priced GPU deployment (not --profile or the torch engine)"
            )
        if self.step_budget_ms and self.engine == "torch" and self.profile is None:
            # The engine's timer runs plans; a time budget needs a prediction before running one.
            raise ValueError(
                "--engine torch --step-budget-ms needs --profile FILE (a `stallfree profile` of this "
                "machine): its measured model predicts each candidate step"
            )
        if self.speculative_tokens:
            _positive("speculative_tokens", self.speculative_tokens, whole=True)
            if self.engine == "torch":
                raise ValueError(
                    "--speculative-tokens runs on priced steps (the roofline, GPU tables or a --profile): the "
                    "real engine's drafts come from its own text (stallfree generate/serve --speculative-tokens)"
                )
            if self.step_budget_ms:
                raise ValueError("--speculative-tokens does not combine with --step-budget-ms")
            try:
                Acceptance.parse(self.acceptance_rate, self.speculative_tokens)
            except ValueError as exc:
                raise ValueError(f"argument --acceptance-rate: {exc}") from None
        if self.disaggregate is not None:
            parse_pools(self.disaggregate)
            if self.engine == "torch" or self.profile is not None:
                raise ValueError(
                    "--disaggregate prices a deployment's GPUs and links: the roofline or GPU tables, not "
                    "--engine torch or --profile"
                )
        if self.framework is not None and (self.engine == "torch" or self.profile is not None):
            raise ValueError("--framework prices steps by GPU tables: not with --engine torch or --profile")
        if self.expert_parallel and (self.engine == "torch" or self.profile is not None):
            raise ValueError("--expert-parallel prices GPU deployments: not with --engine torch or --profile")

    @property
    def acceptance(self) -> Acceptance:
        """How often drafts are accepted, by position (``acceptance_rate``: one rate a token, or
        one a position)."""
        return Acceptance.parse(self.acceptance_rate, max(self.speculative_tokens, 1))

    @property
    def is_priced_by_profile(self) -> bool:
        """Roofline engine, but every step priced by the profile's measured model."""
        return self.engine == "roofline" and self.profile is not None

    @property
    def is_priced_by_gpu_tables(self) -> bool:
        """Roofline engine, no profile, but measured GPU tables asked for (``--cost-model measured``
        or a ``--framework``)."""
        measured = self.cost_model == "measured" or self.framework is not None
        return self.engine == "roofline" and self.profile is None and measured

    @property
    def scenario_defaults(self) -> ScenarioDefaults:
        """The sizes left out take these. A profile is of the engine: its defaults are the engine's,
        for a like-for-like run."""
        return SCENARIO_DEFAULTS["torch" if self.is_priced_by_profile else self.engine]

    @property
    def sweep_chunks(self) -> tuple[int, ...]:
        """The chunk sizes to sweep (given, or the engine's default)."""
        return self.sweep or (DEFAULT_SWEEP if self.engine == "roofline" else ENGINE_SWEEP)


def _choose(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"argument --{flag}: invalid choice: {value!r} (choose from {listed})")


def _positive(name: str, value: object, *, whole: bool) -> None:
    """None, or a positive number (``whole``: an int), refused as the command line's
    ``positive_int`` / ``positive_float`` say it."""
    if value is None:
        return
    flag = f"argument --{name.replace('_', '-')}"
    types = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, types):
        raise ValueError(f"{flag}: expected a {'whole number' if whole else 'number'}, got {value!r}")
    if not value > 0:
        raise ValueError(f"{flag}: must be positive, got {value}")
