"""A traced route, and the namespace switch a trace needs.

The agent lives in the container's namespace, but the underlay is the
host's: sockets that must hear the underlay are opened inside the host
namespace (setns on one thread, then back) and keep working there after
the thread returns. The tracing itself: probe_agent/flowtrace.py."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class Trace:
    src_ip: str
    dst_ip: str
    hops: tuple[str | None, ...]  # router addresses in order; None: no answer
    reached: bool                  # the destination itself answered
    error: str = ""
    tunnel_sport: int = 0          # flow traces through a tunnel: its source port (flowtrace)

    def route(self, names: dict[str, str]) -> str:
        """Switch ids joined by '>' (contract section 3), or '' unless every
        router on the way answered and is known: a partial route would
        accuse the wrong links."""
        if not self.reached or self.error:
            return ""
        ids = [names.get(h or "") for h in self.hops]
        if not ids or any(i is None for i in ids):
            return ""
        return ">".join(i for i in ids if i is not None)


@contextlib.contextmanager
def in_netns(path: str | None) -> Iterator[None]:
    """This thread in the network namespace at `path`, for the block only.
    setns moves the calling thread alone, so threads need no lock between
    them; threads started inside the block start in `path` too."""
    if not path:
        yield
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {path}: {os.strerror(e)}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:  # pragma: no cover - cannot fail back
                e = ctypes.get_errno()
                raise OSError(e, f"setns back: {os.strerror(e)}")
    finally:
        os.close(target)
        os.close(home)
