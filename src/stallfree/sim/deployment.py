"""What is deployed, as one value: :class:`Deployment`.

A deployment is a replica (how it schedules: a :class:`~stallfree.core.serving.ServingConfig`;
how its steps are priced: a :class:`~stallfree.costs.choice.CostChoice`; how much of the GPU's
memory it may fill), how many of them behind which router (or a mixed fleet of replica groups, or
prefill and decode pools joined by KV links), and speculative decoding's drafts. Every part but the
replica is optional; :func:`~stallfree.sim.api.simulate`, tune's trials, validate, the page and
the command line all build this one value, and it is checked once, when it is made.

It reads and writes as a plain mapping (:meth:`Deployment.to_dict`, :meth:`Deployment.from_dict`),
which the command line keeps as YAML (``--deployment FILE``, ``--deployment-out FILE``): a tuned
answer is a file a user runs again. Invariant: a deployment whose cost choice names its model,
hardware and profile by preset or path is hashable and pickles (tune sends it to worker processes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stallfree.core.autoscale import (
    Autoscaler,
    DynamoLoadAutoscaler,
    DynamoLoadRule,
    HpaAutoscaler,
    HpaRule,
    SlaAutoscaler,
    SlaRule,
)
from stallfree.core.config import ShedRule
from stallfree.core.router import ROUTER_NAMES
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.costs.kv_transfer import DEFAULT_KV_LINK, KV_CONNECTORS, PoolShape
from stallfree.sim.disagg import Disaggregation
from stallfree.sim.kv_tiers import KvTierConfig
from stallfree.sim.speculative import DRAFT_METHODS, Acceptance

ROOFLINE = CostChoice(kind="full")  # simulate's default: the full roofline of the default model


@dataclass(frozen=True, slots=True)
class ReplicaGroup:
    """``count`` replicas on ``hardware`` (a preset or a JSON file), ``tp`` GPUs each: one part of
    a fleet whose replicas differ (``4xh100-sxm:tp2``)."""

    count: int
    hardware: str
    tp: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or self.tp < 1:
            raise ValueError(f"{self}: a replica group needs at least one replica of at least one GPU")

    def __str__(self) -> str:
        return f"{self.count}x{self.hardware}" + (f":tp{self.tp}" if self.tp != 1 else "")

    @classmethod
    def parse_fleet(cls, text: str) -> tuple[ReplicaGroup, ...]:
        """``4xh100-sxm:tp2,2xa100-80gb`` -> two groups."""
        groups = []
        for part in (p.strip() for p in text.split(",") if p.strip()):
            count, x, rest = part.partition("x")
            hardware, _, tp = rest.partition(":tp")
            if not (
                x
                and count.isdigit()
                and int(count) > 0
                and hardware
                and (not tp or (tp.isdigit() and int(tp) > 0))
            ):
                raise ValueError(f"{part!r} is not NxHARDWARE or NxHARDWARE:tpK (e.g. 4xh100-sxm:tp2)")
            groups.append(cls(int(count), hardware, int(tp) if tp else 1))
        if not groups:
            raise ValueError("give at least one NxHARDWARE")
        return tuple(groups)


@dataclass(frozen=True, slots=True)
class Speculation:
    """Speculative decoding's drafts (their number is the serving config's
    ``num_speculative_tokens``): how often they are right, and what guessing costs (``ngram``
    nothing, ``eagle`` a layer's share of a decode step, ``model:NAME`` that model's decode step:
    :func:`~stallfree.sim.speculative.draft_pricer`)."""

    acceptance: Acceptance
    draft: str = "ngram"

    def __post_init__(self) -> None:
        if self.draft not in ("ngram", "eagle") and not (
            self.draft.startswith("model:") and len(self.draft) > len("model:")
        ):
            raise ValueError(f"unknown draft method {self.draft!r}; choose from: {', '.join(DRAFT_METHODS)}")


# KEDA drives the HPA: one rule; sla forecasts the rate; dynamo-load is Dynamo Planner 1.4.2's load rule
AUTOSCALERS = ("hpa", "keda", "sla", "dynamo-load")


@dataclass(frozen=True, slots=True)
class Autoscale:
    """An autoscaler in front of the fleet: ``rule`` ``hpa:METRIC=TARGET`` (or ``keda:``, the same
    HPA rule as KEDA drives it: :class:`~stallfree.core.autoscale.HpaRule`), or
    ``sla:qps=CAPACITY[,interval=S][,window=N]`` (a forecast of the rate:
    :class:`~stallfree.core.autoscale.SlaRule`), or ``dynamo-load:[throughput|latency]`` /
    ``dynamo-load:up=PCT,down=PCT`` (Dynamo Planner's load-based rule:
    :class:`~stallfree.core.autoscale.DynamoLoadRule`), between
    ``min_replicas`` and ``max_replicas``, deciding every ``scrape_s``; a replica it adds is
    routable ``startup_s`` later (its GPUs held from the decision on). ``scale_down_window_s`` is
    the HPA's scale-down stabilization window (KEDA's ``advanced.horizontalPodAutoscalerConfig.
    behavior.scaleDown.stabilizationWindowSeconds``; the Kubernetes default 300 s)."""

    rule: str
    min_replicas: int = 1
    max_replicas: int = 8
    startup_s: float = 120.0
    scrape_s: float = 15.0
    scale_down_window_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("startup_s", "scrape_s", "scale_down_window_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value}")
        self.make()  # the rule parses, the bounds hold
        if self.scrape_s <= 0:
            raise ValueError(f"scrape_s must be positive, got {self.scrape_s}")

    def make(self) -> Autoscaler:
        """A fresh autoscaler (it keeps its recommendations over a run)."""
        kind, _, rule = self.rule.partition(":")
        if kind not in AUTOSCALERS:
            raise ValueError(
                f"unknown autoscaler {kind!r}; choose from {', '.join(AUTOSCALERS)} (e.g. keda:waiting=8)"
            )
        if kind == "sla":
            return SlaAutoscaler(SlaRule.parse(rule), self.min_replicas, self.max_replicas)
        if kind == "dynamo-load":
            return DynamoLoadAutoscaler(DynamoLoadRule.parse(rule), self.min_replicas, self.max_replicas)
        parsed = dataclasses.replace(HpaRule.parse(rule), scale_down_window_s=self.scale_down_window_s)
        return HpaAutoscaler(parsed, self.min_replicas, self.max_replicas)


@dataclass(frozen=True, slots=True, kw_only=True)
class Deployment:
    """What is deployed (see the module's docstring). ``replicas`` copies of the replica behind
    ``router`` (one of :data:`~stallfree.core.router.ROUTER_NAMES`), each request reaching its
    replica ``route_delay_ms`` after it arrives; or ``fleet``: groups of replicas that differ in
    hardware and TP, priced as ``costs`` says otherwise; or ``disaggregate``: prefill and decode
    pools (the pools' TPs are its shape's; ``router`` picks a replica in each pool).
    ``speculation`` goes with ``serving.num_speculative_tokens`` > 0 and only with it. ``kv_tiers``:
    a host tier per replica and a store the fleet shares, below each GPU's prefix cache
    (:mod:`stallfree.sim.kv_tiers`; one replica or a fleet). ``shed``: sheddable requests are
    refused while enough wait for a first token (at the replica; in a fleet, anywhere in it: the
    gateway's view; one replica or a fleet)."""

    costs: CostChoice = ROOFLINE
    serving: ServingConfig = field(default_factory=ServingConfig)
    gpu_memory_utilization: float = 0.9
    replicas: int = 1
    fleet: tuple[ReplicaGroup, ...] = ()
    router: str = "round-robin"
    route_delay_ms: float = 0.0
    disaggregate: Disaggregation | None = None
    speculation: Speculation | None = None
    autoscale: Autoscale | None = None
    kv_tiers: KvTierConfig | None = None
    shed: ShedRule | None = None

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.replicas < 1:
            raise ValueError(f"replicas must be positive, got {self.replicas}")
        if self.fleet and self.replicas != 1:
            raise ValueError("give replicas or a fleet of replica groups, not both")
        if self.router not in ROUTER_NAMES:
            raise ValueError(f"unknown router {self.router!r}; choose from {', '.join(ROUTER_NAMES)}")
        if not (math.isfinite(self.route_delay_ms) and self.route_delay_ms >= 0):
            raise ValueError(f"route_delay_ms must be >= 0, got {self.route_delay_ms}")
        k = self.serving.num_speculative_tokens
        if k and self.speculation is None:
            raise ValueError(
                "speculative decoding needs an acceptance rate: the share of draft tokens verified right "
                "(a server's spec-decode metrics say it)"
            )
        if self.speculation is not None and not k:
            raise ValueError("drafts' acceptance applies with num_speculative_tokens > 0")
        if self.disaggregate is not None:
            if self.replicas != 1 or self.fleet or self.route_delay_ms:
                raise ValueError(
                    "a disaggregated deployment's replicas are its pools (xPyD): no replicas, fleet or "
                    "route delay beside them"
                )
            if k or self.serving.policy != "chunked":
                raise ValueError("a disaggregated run's pools schedule as the chunked policy, without drafts")

        if self.shed is not None and (self.disaggregate is not None or self.autoscale is not None):
            raise ValueError(
                "shedding runs on one replica or a fleet: not with disaggregation or an autoscaler yet"
            )
        if self.kv_tiers is not None and (self.disaggregate is not None or self.autoscale is not None):
            raise ValueError(
                "KV tiers run on one replica or a fleet: not with disaggregation or an autoscaler yet"
            )
        if (a := self.autoscale) is not None:
            if self.fleet or self.disaggregate is not None:
                raise ValueError("an autoscaled fleet is of one kind of replica: no replica groups or pools")
            if not a.min_replicas <= self.replicas <= a.max_replicas:
                raise ValueError(
                    f"an autoscaled fleet starts with {self.replicas} replicas, outside its bounds "
                    f"[{a.min_replicas}, {a.max_replicas}]"
                )

    @property
    def num_replicas(self) -> int:
        """Replicas behind the router (a disaggregated deployment's: both pools')."""
        if self.disaggregate is not None:
            shape = self.disaggregate.shape
            return shape.num_prefill + shape.num_decode
        return sum(g.count for g in self.fleet) if self.fleet else self.replicas

    @property
    def num_gpus(self) -> int:
        if self.disaggregate is not None:
            return self.disaggregate.shape.num_gpus
        return sum(g.count * g.tp for g in self.fleet) if self.fleet else self.replicas * self.costs.tp

    @property
    def label(self) -> str:
        """The policy's name in a table: the serving policy, or ``disagg:xPyD``."""
        return self.serving.policy if self.disaggregate is None else f"disagg:{self.disaggregate.shape}"

    def to_dict(self) -> dict[str, Any]:
        """The deployment as plain values (what ``--deployment-out`` writes as YAML); parts that
        are not there are left out. Costs named by objects, not presets or paths, cannot be."""
        costs = {f.name: getattr(self.costs, f.name) for f in dataclasses.fields(self.costs)}
        for name in ("model", "hardware", "profile"):
            if not isinstance(costs[name], str | None):
                raise ValueError(f"a deployment written to a file names its {name} by preset or path")
        out: dict[str, Any] = {
            "costs": costs,
            "serving": dataclasses.asdict(self.serving),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "replicas": self.replicas,
            "router": self.router,
            "route_delay_ms": self.route_delay_ms,
        }
        if self.fleet:
            del out["replicas"]
            out["fleet"] = [dataclasses.asdict(g) for g in self.fleet]
        if (d := self.disaggregate) is not None:
            del out["replicas"], out["route_delay_ms"]
            out["disaggregate"] = {
                "pools": str(d.shape),
                "prefill_tp": d.shape.tp_prefill,
                "decode_tp": d.shape.tp_decode,
                "kv_link": d.kv_link,
                "kv_connector": d.kv_connector,
                "prefill_token_budget": d.prefill_token_budget,
                "prefill_profile": d.prefill_profile,
            }
        if self.autoscale is not None:
            out["autoscale"] = dataclasses.asdict(self.autoscale)
        if self.kv_tiers is not None:
            out["kv_tiers"] = dataclasses.asdict(self.kv_tiers)
        if self.shed is not None:
            out["shed"] = dataclasses.asdict(self.shed)
        if (s := self.speculation) is not None:
            out["speculation"] = {
                "acceptance_rates": list(s.acceptance.rates),
                "draft_rate": s.acceptance.proposal_rate,
                "draft": s.draft,
            }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Deployment:
        """The inverse of :meth:`to_dict`; a missing part takes its default, an unknown key or a
        wrong value is a one-line ``ValueError``."""
        _known(data, "deployment", (*(f.name for f in dataclasses.fields(cls)),))
        fields: dict[str, Any] = {k: v for k, v in data.items() if k not in ("costs", "serving")}
        try:
            if "costs" in data:
                fields["costs"] = CostChoice(**_section(data, "costs", CostChoice))
            if "serving" in data:
                fields["serving"] = ServingConfig(**_section(data, "serving", ServingConfig))
            if "fleet" in data:
                groups = data["fleet"]
                if not isinstance(groups, list):
                    raise ValueError("deployment fleet: give a list of {count, hardware, tp}")
                fields["fleet"] = tuple(
                    ReplicaGroup(**_section({"fleet": g}, "fleet", ReplicaGroup)) for g in groups
                )
            if data.get("autoscale") is not None:
                fields["autoscale"] = Autoscale(**_section(data, "autoscale", Autoscale))
            if data.get("kv_tiers") is not None:
                fields["kv_tiers"] = KvTierConfig(**_section(data, "kv_tiers", KvTierConfig))
            if data.get("shed") is not None:
                fields["shed"] = ShedRule(**_section(data, "shed", ShedRule))
            if (d := data.get("disaggregate")) is not None:
                fields["disaggregate"] = _disaggregation(d)
            if (s := data.get("speculation")) is not None:
                _known(s, "deployment speculation", ("acceptance_rates", "draft_rate", "draft"))
                rates = s.get("acceptance_rates")
                if not isinstance(rates, list) or not all(isinstance(r, int | float) for r in rates):
                    raise ValueError("deployment speculation: acceptance_rates is a list of numbers")
                fields["speculation"] = Speculation(
                    Acceptance(tuple(float(r) for r in rates), float(s.get("draft_rate", 1.0))),
                    str(s.get("draft", "ngram")),
                )
            return cls(**fields)
        except TypeError as exc:  # a value of the wrong type inside a config's own checks
            raise ValueError(f"deployment: {exc}") from None


def _known(data: Any, where: str, names: tuple[str, ...]) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(names)}")


def _section(data: Mapping[str, Any], name: str, kind: type) -> dict[str, Any]:
    """``data[name]``, checked to hold only ``kind``'s field names, and whole numbers where a field
    is an ``int`` (a compiled class refuses another type before its own checks could say which)."""
    section = data[name]
    fields = dataclasses.fields(kind)
    _known(section, f"deployment {name}", tuple(f.name for f in fields))
    for f in fields:
        value = section.get(f.name)
        if (
            f.type in ("int", int)
            and f.name in section
            and (isinstance(value, bool) or not isinstance(value, int))
        ):
            raise ValueError(f"deployment {name}: {f.name} must be an integer, got {value!r}")
    return dict(section)


def _disaggregation(data: Any) -> Disaggregation:
    _known(
        data,
        "deployment disaggregate",
        (
            "pools",
            "prefill_tp",
            "decode_tp",
            "kv_link",
            "kv_connector",
            "prefill_token_budget",
            "prefill_profile",
        ),
    )
    if "pools" not in data:
        raise ValueError("deployment disaggregate: give its pools as xPyD (1P1D, 2P4D)")
    shape = PoolShape.parse(str(data["pools"]), int(data.get("prefill_tp", 1)), int(data.get("decode_tp", 1)))
    return Disaggregation(
        shape,
        str(data.get("kv_link", DEFAULT_KV_LINK)),
        data.get("prefill_token_budget"),
        str(data.get("kv_connector", next(iter(KV_CONNECTORS)))),
        data.get("prefill_profile"),
    )
