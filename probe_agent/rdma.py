"""RDMA probing through pyverbs, used where an RDMA device exists.

The prober needs a real device; where there is none it reports why and the
agent falls back to UDP. It never invents results."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RdmaAvailability:
    available: bool
    reason: str
    devices: tuple[str, ...] = ()


def rdma_availability() -> RdmaAvailability:
    try:
        from pyverbs import device as d
    except ImportError as e:
        return RdmaAvailability(False, f"pyverbs is not installed ({e}); install rdma-core's "
                                       "python3-pyverbs")
    try:
        devices = d.get_device_list()
    except Exception as e:  # pyverbs raises its own PyverbsRDMAError without a device
        return RdmaAvailability(False, f"no RDMA device: {e}")
    if not devices:
        return RdmaAvailability(False, "no RDMA device found")
    names = tuple(dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
                  for dev in devices)
    return RdmaAvailability(True, "ok", names)


def open_device_context(name: str) -> object:
    """A verbs context on the named device (queried, so a dead device fails
    here, before any probe is counted)."""
    from pyverbs.device import Context

    ctx = Context(name=name)
    ctx.query_device()
    return ctx
