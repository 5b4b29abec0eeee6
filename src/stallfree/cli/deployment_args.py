"""``--deployment FILE`` and ``--deployment-out FILE``: a :class:`~stallfree.sim.deployment.Deployment`
kept as YAML, so what a command ran (or what tune found) is a file a user runs again.

A file read is the deployment flags' values (:func:`deployment_flags`): the command then builds its
deployment from its flags as always, in one place, and a flag given beside the file wins over it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallfree.cli.common import UsageError
from stallfree.cli.cost_args import ROOFLINE_DTYPE_BYTES

if TYPE_CHECKING:
    from stallfree.sim.deployment import Deployment

_DTYPE_NAMES = {size: name for name, size in reversed(ROOFLINE_DTYPE_BYTES.items())}  # 2: bf16


def add_deployment_file_arg(parser: argparse._ActionsContainer, flags_win: bool = True) -> None:
    """``--deployment FILE``; ``flags_win``: the command reads its flags beside the file (else the
    file is the whole deployment and the pricing and scheduling flags are not read)."""
    beside = (
        "flags given beside it win" if flags_win else "the pricing and scheduling flags are then not read"
    )
    parser.add_argument(
        "--deployment",
        metavar="FILE",
        help="a deployment as YAML (what --deployment-out or `tune --deployment-out` wrote): its model, "
        f"hardware, pricing, scheduling, fleet, pools and drafts; {beside}",
    )


def add_deployment_out_arg(parser: argparse._ActionsContainer, what: str) -> None:
    parser.add_argument(
        "--deployment-out", metavar="FILE", help=f"write {what} as YAML (--deployment reads it)"
    )


def read_deployment(path: str) -> Deployment:
    """The deployment in a YAML file; anything wrong with it is one line."""
    import yaml  # only where a file is read: a plain run never loads it

    from stallfree.sim.deployment import Deployment

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"--deployment {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--deployment {path}: not YAML ({str(exc).splitlines()[0]})") from None
    try:
        return Deployment.from_dict(data if data is not None else {})
    except ValueError as exc:
        raise UsageError(f"--deployment {path}: {exc}") from None


def write_deployment(deployment: Deployment, path: str) -> None:
    import yaml

    try:
        text = yaml.safe_dump(deployment.to_dict(), sort_keys=False)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--deployment-out {path}: {exc}") from None


def apply_deployment_file(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    """Set ``args`` from ``--deployment`` where a flag was left at its default (``defaults``)."""
    if args.deployment is None:
        return
    from stallfree.sim.deployment import Deployment

    plain = deployment_flags(Deployment())
    for dest, value in deployment_flags(read_deployment(args.deployment)).items():
        if dest not in defaults:
            if value != plain.get(dest):
                raise UsageError(f"--deployment {args.deployment}: this command cannot set {dest}")
        elif getattr(args, dest) == defaults[dest]:
            setattr(args, dest, value)


def deployment_flags(d: Deployment) -> dict[str, Any]:
    """The flag values (argparse dests) that build ``d`` again."""
    c = d.costs
    if c.dtype_bytes is not None and c.dtype_bytes not in _DTYPE_NAMES:
        raise UsageError(f"--deployment: no --dtype is {c.dtype_bytes} bytes")
    flags: dict[str, Any] = {
        "cost_model": c.kind,
        "model": c.model,
        "hardware": c.hardware,
        "tp": c.tp,
        "profile": c.profile,
        "dtype": None if c.dtype_bytes is None else _DTYPE_NAMES[c.dtype_bytes],
        "sampling": c.sampling,
        "step_overhead_ms": c.step_overhead_s * 1000,
        "gpu_tables": c.gpu_tables,
        "framework": c.framework,
        "framework_version": c.framework_version,
        "expert_parallel": c.expert_parallel,
        **{name: getattr(d.serving, name) for name in d.serving.__dataclass_fields__},
        "gpu_memory_utilization": d.gpu_memory_utilization,
        "replicas": d.replicas,
        "fleet": ",".join(str(g) for g in d.fleet) or None,
        "router": d.router,
        "route_delay_ms": d.route_delay_ms,
    }
    if (p := d.disaggregate) is not None:
        flags.update(
            disaggregate=f"{p.shape.num_prefill}P{p.shape.num_decode}D",
            prefill_tp=p.shape.tp_prefill,
            decode_tp=p.shape.tp_decode,
            kv_link=p.kv_link,
            kv_connector=p.kv_connector,
            prefill_token_budget=p.prefill_token_budget,
            prefill_profile=p.prefill_profile,
        )
    if (a := d.autoscale) is not None:
        flags.update(
            autoscale=a.rule,
            min_replicas=a.min_replicas,
            max_replicas=a.max_replicas,
            startup_s=a.startup_s,
            scrape_s=a.scrape_s,
        )
        if a.scale_down_window_s != 300.0:  # only simulate has the flag; the default goes unsaid
            flags["scale_down_window_s"] = a.scale_down_window_s
    if (r := d.shed) is not None:
        flags.update(shed_priority=r.min_priority, shed_waiting=r.max_waiting)
    if (t := d.kv_tiers) is not None:
        flags.update(
            kv_host_gb=t.host_gb,
            kv_host_link=t.host_link,
            kv_shared_gb=t.shared_gb,
            kv_shared_link=t.shared_link,
        )
    if (s := d.speculation) is not None:
        flags.update(
            acceptance_rate=",".join(repr(r) for r in s.acceptance.rates),
            draft_rate=s.acceptance.proposal_rate,
            draft=s.draft,
        )
    return flags
