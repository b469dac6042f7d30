"""The network team's page: open incidents, the fabric with what is blamed
in red, each incident's pairs as latency and loss charts, and (where the
controller is at hand) the job's skeleton. One JSON snapshot feeds it; the
page (analyzer/page.py) polls it. Stdlib HTTP: a handful of people, not a
fleet, look at this."""

from __future__ import annotations

import json
import logging
import math
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from analyzer.engine import Analyzer
from analyzer.page import PAGE
from netskel.model import Incident, as_likely
from netskel.security import Security, Tls, bearer_ok

log = logging.getLogger(__name__)
RECENT_S = 3600.0   # closed incidents stay on the page this long
CHART_PAIRS = 12    # charts drawn for at most this many pairs
SkeletonSource = Callable[[], dict[str, Any]]


def _blamed(incidents: list[Incident], topo_links: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """What open incidents blame, and (`suspect_links`) the links the probes
    could not tell from a blamed one: drawn apart, so nobody replaces one
    cable and calls the fault fixed."""
    links: set[str] = set()
    suspects: set[str] = set()
    switches: set[str] = set()
    others: list[dict[str, str]] = []
    for i in incidents:
        if i.end is not None:
            continue
        c = i.component
        if c.type == "link":
            links.add(c.id)
            suspects.update(as_likely(i.evidence))
        elif c.type == "switch":
            switches.add(c.id)
            links.update(k for k, ends in topo_links.items() if c.id in ends)
        else:
            others.append({"type": c.type, "id": c.id})
    return {"links": sorted(links), "suspect_links": sorted(suspects - links),
            "switches": sorted(switches), "others": others}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def snapshot(engine: Analyzer, now: float, skeleton: SkeletonSource | None = None
             ) -> dict[str, Any]:
    """Everything the page shows, as of `now` (call under the analyzer's lock)."""
    topo = engine.topo
    shown = engine.list_incidents(since=now - RECENT_S)
    open_pairs = list(dict.fromkeys(p for i in shown if i.end is None for p in i.pairs))
    return {
        "now": now,
        "incidents": [i.to_doc() for i in reversed(shown)],
        "blamed": _blamed(shown, topo.links),
        "topology": {
            "switches": [{"id": s.id, "tier": s.tier, "rail": s.rail}
                         for s in topo.switches.values()],
            "hosts": [{"id": h, "nics": sorted((n.id, n.rail) for n in topo.nics.values()
                                               if n.host == h)} for h in sorted(topo.hosts)],
            "links": [{"id": k, "a": a, "b": b} for k, (a, b) in sorted(topo.links.items())],
        },
        "charts": [{"pair": list(p), "points": pair_points(engine, p)}
                   for p in open_pairs[:CHART_PAIRS]],
        "skeleton": skeleton() if skeleton is not None else None,
    }


def pair_points(engine: Analyzer, pair: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"t": p.start, "size": p.size, "median_us": _finite(p.median_us),
             "loss": p.lost / p.sent if p.sent else None}
            for p in engine.history.points(pair)]


def _tls_context(tls: Tls) -> ssl.SSLContext:
    """Server certificate from the TLS files; a client certificate is asked
    for and checked against the CA, but may be missing (then a token must do)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as d:  # ssl loads chains from files only
        cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
        cert.write_bytes(tls.cert)
        key.write_bytes(tls.key)
        ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cadata=tls.ca.decode())
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


class WebServer:
    def __init__(self, address: tuple[str, int], engine: Analyzer, lock: threading.Lock,
                 skeleton: SkeletonSource | None = None, sec: Security | None = None) -> None:
        """With TLS the page is served over HTTPS and a client certificate
        from the CA admits; with a token, `Authorization: Bearer TOKEN` (or
        `?token=TOKEN`, for a browser's address bar) admits."""
        outer = self
        self.sec = sec or Security()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer._get(self)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("web: " + fmt, *args)

        self.engine, self.lock, self.skeleton = engine, lock, skeleton
        self.httpd = ThreadingHTTPServer(address, Handler)
        if self.sec.tls is not None:
            # The handshake happens in the request's thread (on its first
            # read), so a client that stalls there holds no one else up.
            self.httpd.socket = _tls_context(self.sec.tls).wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="web", daemon=True)

    def start(self) -> WebServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def _admitted(self, h: BaseHTTPRequestHandler, query: dict[str, list[str]]) -> bool:
        if self.sec.tls is None and not self.sec.token:
            return True
        if self.sec.tls is not None and h.connection.getpeercert():
            return True
        if self.sec.token:
            given = [("authorization", h.headers.get("Authorization", ""))]
            given += [("authorization", "Bearer " + t) for t in query.get("token", [])]
            return bearer_ok(given, self.sec.token)
        return False

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        if not self._admitted(h, parse_qs(url.query)):
            self._send(h, 401, "text/plain", b"a client certificate or a bearer token is "
                                             b"required\n")
        elif url.path == "/":
            self._send(h, 200, "text/html; charset=utf-8", PAGE.encode())
        elif url.path == "/api/state":
            with self.lock:
                doc = snapshot(self.engine, time.time(), self.skeleton)
            self._send(h, 200, "application/json", json.dumps(doc).encode())
        elif url.path == "/api/pair":
            q = parse_qs(url.query)
            a, b = q.get("a", [""])[0], q.get("b", [""])[0]
            with self.lock:
                known = a in self.engine.known_endpoints and b in self.engine.known_endpoints
                doc = {"pair": [a, b], "points": pair_points(self.engine, (a, b))} if known \
                    else {"error": f"unknown pair '{a}', '{b}'"}
            self._send(h, 200 if known else 404, "application/json", json.dumps(doc).encode())
        else:
            self._send(h, 404, "text/plain", b"not found\n")

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, code: int, ctype: str, body: bytes) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Cache-Control", "no-store")
        h.end_headers()
        h.wfile.write(body)
