"""Moving a request's KV cache from a prefill GPU group to a decode group (disaggregated serving).

The bytes are the model's: K and V of every token and layer (a latent and a rotary key under
MLA), a sliding-window layer holding only its window. A :class:`KvLink` carries them: each GPU of
the smaller group sends its shard over its own link (NVLink within a node; one RDMA NIC a GPU
between nodes: InfiniBand, RoCE, or plain Ethernet), so ``min(tp_prefill, tp_decode)`` links run in
parallel, after a fixed latency. With ``overlap`` the layers go as they are computed (Mooncake's
and LMCache's layer-wise send), so only what outlasts the prefill's compute stays on the clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stallfree.specs import HardwareSpec, ModelSpec

_GBIT = 1e9 / 8  # bytes a second in one Gb/s

LINKS: dict[str, tuple[float | None, float, str]] = {
    # name: (bytes/s per GPU, or None for the hardware's NVLink figure; latency s; what it is)
    "nvlink": (None, 10e-6, "NVLink within a node: the hardware's GPU-to-GPU bandwidth"),
    "ib-400": (400 * _GBIT, 5e-6, "InfiniBand NDR, 400 Gb/s a GPU (one NIC each)"),
    "roce-200": (200 * _GBIT, 10e-6, "RoCE, 200 Gb/s a GPU"),
    "ethernet-100": (100 * _GBIT, 50e-6, "TCP over 100 Gb/s Ethernet a GPU"),
}
"""The ``--kv-link`` presets; a number instead names a link of that many GB/s a GPU."""
DEFAULT_KV_LINK = "nvlink"
DEFAULT_HOST_LINK = "pcie5"  # a host KV tier's, each GPU to its host's memory
DEFAULT_SHARED_LINK = "ib-400"  # a shared KV store's, each GPU to the store

HOST_LINKS: dict[str, tuple[float, float, str]] = {
    # name: (bytes/s per GPU, one direction; latency s; what it is)
    "pcie4": (32e9, 10e-6, "PCIe 4.0 x16 between a GPU and host memory: 32 GB/s nominal a direction"),
    "pcie5": (64e9, 10e-6, "PCIe 5.0 x16 between a GPU and host memory: 64 GB/s nominal a direction"),
}
"""The ``--kv-host-link`` presets (a KV host tier's loads); a number instead names GB/s a GPU."""

KV_CONNECTORS = {
    "nixl": "every prompt token's KV moves (vLLM's NixlConnector; SGLang's transfer backends)",
    "shared-storage": "the prompt's full blocks short of its last token move through files, the rest is "
    "computed again (vLLM's ExampleConnector)",
}
"""What crosses the link (``--kv-connector``); the first is the default."""


@dataclass(frozen=True, slots=True)
class KvLink:
    """One GPU's link to its peer in the other pool: ``bytes_per_s`` one way, ``latency_s`` a transfer."""

    name: str
    bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0 or not self.latency_s >= 0:
            raise ValueError(f"link {self.name}: bandwidth must be positive and latency >= 0")


def kv_link(name: str, hardware: HardwareSpec) -> KvLink:
    """A preset of :data:`LINKS` (``nvlink``: ``hardware``'s figure) or ``GBPS``, GB/s a GPU."""
    if name in LINKS:
        rate, latency_s, _ = LINKS[name]
        return KvLink(
            name, rate if rate is not None else hardware.interconnect_bandwidth_bytes_per_s, latency_s
        )
    try:
        gb_per_s = float(name)
    except ValueError:
        raise ValueError(
            f"unknown KV link {name!r}; choose from {', '.join(LINKS)} or give GB/s a GPU"
        ) from None
    if not gb_per_s > 0:
        raise ValueError(f"a KV link's bandwidth must be positive, got {name} GB/s")
    return KvLink(f"{gb_per_s:g} GB/s", gb_per_s * 1e9, LINKS["ib-400"][1])


def tier_link(name: str, *, host: bool) -> KvLink:
    """A KV tier's link: to host memory (``host``: :data:`HOST_LINKS`) or to a shared store over
    the network (:data:`LINKS` but NVLink), or ``GBPS``, GB/s a GPU."""
    presets = {
        n: (rate, latency_s)
        for n, (rate, latency_s, _) in (HOST_LINKS if host else LINKS).items()
        if rate is not None
    }
    if name in presets:
        rate, latency_s = presets[name]
        return KvLink(name, rate, latency_s)
    try:
        gb_per_s = float(name)
    except ValueError:
        raise ValueError(
            f"unknown {'host' if host else 'shared store'} link {name!r}; choose from "
            f"{', '.join(presets)} or give GB/s a GPU"
        ) from None
    if not 0 < gb_per_s < float("inf"):
        raise ValueError(f"a KV tier link's bandwidth must be a positive number of GB/s, got {name}")
    return KvLink(f"{gb_per_s:g} GB/s", gb_per_s * 1e9, next(iter(presets.values()))[1])


def kv_transfer_bytes(model: ModelSpec, num_tokens: int, dtype_bytes: int) -> int:
    """The KV cache of ``num_tokens`` tokens: every layer's K and V (MLA: latent + rotary key),
    a sliding-window layer's capped at its window."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    per_layer = model.kv_bytes_per_token(dtype_bytes) // model.num_layers
    sliding = model.num_sliding_layers
    full_layers = model.num_layers - sliding
    return per_layer * (full_layers * num_tokens + sliding * min(num_tokens, model.sliding_window))


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """One request's move: its bytes, the links in parallel, the time on the wire, and the part
    of it left after the prefill (``exposed_s``)."""

    num_bytes: int
    num_links: int
    wire_s: float
    exposed_s: float


def kv_transfer(
    model: ModelSpec,
    num_tokens: int,
    dtype_bytes: int,
    link: KvLink,
    *,
    tp_prefill: int = 1,
    tp_decode: int = 1,
    prefill_s: float = 0.0,
    overlap: bool = False,
) -> KvTransfer:
    """The KV of ``num_tokens`` tokens over ``link``: ``min(tp_prefill, tp_decode)`` GPUs send their
    shards at once. ``overlap`` (layer by layer during a prefill of ``prefill_s``): each layer
    goes once computed, so the transfer outlasts the prefill by the larger of one layer's share and
    what the wire needs beyond the compute of the other layers."""
    if tp_prefill <= 0 or tp_decode <= 0:
        raise ValueError("tensor parallelism must be positive")
    num_bytes = kv_transfer_bytes(model, num_tokens, dtype_bytes)
    links = min(tp_prefill, tp_decode)
    wire_s = link.latency_s + num_bytes / (link.bytes_per_s * links)
    if not overlap:
        return KvTransfer(num_bytes, links, wire_s, wire_s)
    layers = model.num_layers
    exposed_s = max(wire_s / layers, wire_s - prefill_s * (layers - 1) / layers)
    return KvTransfer(num_bytes, links, wire_s, exposed_s)


_SHAPE = re.compile(r"([1-9]\d*)P([1-9]\d*)D")


@dataclass(frozen=True, slots=True)
class PoolShape:
    """``num_prefill`` prefill replicas of ``tp_prefill`` GPUs and ``num_decode`` decode replicas of
    ``tp_decode`` ("xPyD")."""

    num_prefill: int
    num_decode: int
    tp_prefill: int = 1
    tp_decode: int = 1

    def __post_init__(self) -> None:
        if min(self.num_prefill, self.num_decode, self.tp_prefill, self.tp_decode) < 1:
            raise ValueError(f"{self}: every pool needs a replica and every replica a GPU")

    @classmethod
    def parse(cls, text: str, tp_prefill: int = 1, tp_decode: int = 1) -> PoolShape:
        """``2P4D`` -> 2 prefill and 4 decode replicas."""
        match = _SHAPE.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"give prefill and decode replicas as xPyD (1P1D, 2P4D), got {text!r}")
        return cls(int(match[1]), int(match[2]), tp_prefill, tp_decode)

    @property
    def num_gpus(self) -> int:
        return self.num_prefill * self.tp_prefill + self.num_decode * self.tp_decode

    def __str__(self) -> str:
        return f"{self.num_prefill}P{self.num_decode}D"
