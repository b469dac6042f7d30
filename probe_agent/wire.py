"""The UDP probe packet. Fixed header, zero padding up to the probe size.

The responder adds how long the probe sat with it, so the prober can
subtract the responder's own delay from the RTT. The reply can only carry
the time up to just before its own send (user time): the rest of the
responder's send path, a system call from Python that takes 3-70 us on
this machine (more under a busy GIL), would count as network. So, as
PTP's two-step clocks do, the responder then sends a follow-up: the
reply's header again, kind FOLLOW_UP, with the dwell from its kernel
receive stamp to the kernel's stamp of the reply leaving (hardware stamps
where the NIC took both). A prober that reads both uses the follow-up's;
one that never sees it keeps the reply's (an upper bound on the RTT); an
old prober drops the unknown kind."""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"NSKP"
VERSION = 1
KIND_PROBE = 1
KIND_REPLY = 2
KIND_FOLLOW_UP = 3
_KINDS = (KIND_PROBE, KIND_REPLY, KIND_FOLLOW_UP)
_HEADER = struct.Struct("!4sBBHQQQI")
HEADER_SIZE = _HEADER.size  # 36
_START = struct.Struct("!4sBBH")  # magic, version, kind, size: the header's start
_KIND, _DWELL = struct.Struct("!B"), struct.Struct("!I")
_KEY = struct.Struct("!QQQ")  # seq, token, t_send_ns: what names a probe, from byte 8
_KEY_AT = 8
MIN_SIZE = 64
# (seq, token, t_send_ns): what names one probe; its reply and follow-up
# carry it unchanged.
Key = tuple[int, int, int]


@dataclass(frozen=True)
class Probe:
    kind: int
    size: int
    seq: int
    token: int
    t_send_ns: int
    dwell_ns: int = 0


def encode(p: Probe) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, p.kind, p.size, p.seq, p.token, p.t_send_ns, p.dwell_ns)
    return head + bytes(p.size - HEADER_SIZE)


def decode(data: bytes) -> Probe | None:
    """None for anything that is not one of our probes: garbage is dropped,
    never raised."""
    p = header(data)
    return p if p is not None and p.size == len(data) else None


def header(data: bytes) -> Probe | None:
    """The header alone (a packet the kernel handed back from the error
    queue may be cut or carry more than the probe): None if not ours (too
    short, other magic, version or kind). `sent_fields` and `reply_fields`
    read the same header without building a Probe: the prober's hot path."""
    if len(data) < HEADER_SIZE:
        return None
    magic, version, kind, size, seq, token, t_send, dwell = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or kind not in _KINDS:
        return None
    return Probe(kind=kind, size=size, seq=seq, token=token, t_send_ns=t_send, dwell_ns=dwell)


def sent_fields(data: bytes, want: int = KIND_PROBE) -> Key | None:
    """(seq, token, t_send_ns) of our packet of kind `want` inside a packet
    the kernel handed back from the error queue (behind the lower headers,
    maybe cut after ours); None if none is there."""
    at = data.find(MAGIC)
    if at < 0 or len(data) - at < HEADER_SIZE:
        return None
    _, version, kind, _, seq, token, t_send, _ = _HEADER.unpack_from(data, at)
    if version != VERSION or kind != want:
        return None
    return seq, token, t_send


def probe_key(probe: bytes) -> Key:
    """(seq, token, t_send_ns) of a probe `is_probe` accepted: what its
    reply and follow-up carry unchanged."""
    seq, token, t_send = _KEY.unpack_from(probe, _KEY_AT)
    return seq, token, t_send


def follow_up(key: Key, dwell_ns: int) -> bytes:
    """The follow-up of the reply to probe `key`: header only."""
    return _HEADER.pack(MAGIC, VERSION, KIND_FOLLOW_UP, HEADER_SIZE, *key,
                        max(0, min(dwell_ns, 0xFFFFFFFF)))


def probe_buffer(size: int) -> bytearray:
    """A probe of `size` bytes whose header `fill_probe` rewrites in place:
    the prober's hot path builds no object per probe."""
    return bytearray(encode(Probe(kind=KIND_PROBE, size=size, seq=0, token=0, t_send_ns=0)))


def fill_probe(buf: bytearray, seq: int, token: int, t_send_ns: int) -> None:
    _HEADER.pack_into(buf, 0, MAGIC, VERSION, KIND_PROBE, len(buf), seq, token, t_send_ns, 0)


def answer_fields(data: bytes) -> tuple[int, int, int, int, int] | None:
    """(kind, seq, token, t_send_ns, dwell_ns) of a well-formed reply or
    follow-up, else None: `decode` without building a Probe (the prober
    reads every answer through it)."""
    if len(data) < HEADER_SIZE:
        return None
    magic, version, kind, size, seq, token, t_send, dwell = _HEADER.unpack_from(data)
    if (magic != MAGIC or version != VERSION or size != len(data)
            or (kind != KIND_REPLY and kind != KIND_FOLLOW_UP)):
        return None
    return kind, seq, token, t_send, dwell


def is_probe(data: bytes) -> bool:
    """Whether `data` is one well-formed probe (what a responder answers):
    `decode` without building a Probe, once per probe answered."""
    if len(data) < HEADER_SIZE:
        return False
    magic, version, kind, size = _START.unpack_from(data)
    return bool(magic == MAGIC and version == VERSION and kind == KIND_PROBE
                and size == len(data))


def reply_to(data: bytes, dwell_ns: int) -> bytearray:
    """The echo of a probe: same bytes, kind and dwell changed."""
    reply = bytearray(data)
    _KIND.pack_into(reply, 5, KIND_REPLY)
    _DWELL.pack_into(reply, HEADER_SIZE - 4, max(0, min(dwell_ns, 0xFFFFFFFF)))
    return reply
