"""Mutual TLS and tokens on real servers (port 0), with certificates made
here: an agent acts only as its own container, the report feed is the
analyzer's, NetDiag wants a certificate or a token."""

from __future__ import annotations

import dataclasses
import queue
import threading

import grpc
import pytest

from analyzer.server import start_analyzer
from controller.server import start_controller
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc
from netskel.config import AnalyzerConfig, ControllerConfig
from netskel.errors import InputError
from netskel.security import Security, Tls, aio_channel, channel, from_flags, make_certs, safe_stem
from probe_agent.agent import Agent
from tests.helpers import wait_for
from tests.test_agent_loopback import agent_cfg

TOKEN = "s3cret-token-0123456789"


@pytest.fixture
def certs(tmp_path, topo_doc):
    names = [c["id"] for c in topo_doc["containers"]]
    make_certs(tmp_path / "pki", names, hosts=("localhost", "127.0.0.1"))
    return tmp_path / "pki"


def sec(pki, stem: str, token: str | None = None) -> Security:
    return Security(Tls.load(str(pki / f"{stem}.pem"), str(pki / f"{stem}.key"),
                             str(pki / "ca.pem")), token)


def agent_sec(pki, container: str) -> Security:
    return sec(pki, f"agent-{safe_stem(container)}")


@pytest.fixture
def controller(topo_file, certs):
    c = start_controller(ControllerConfig(topology=str(topo_file), listen=("127.0.0.1:0",),
                                          db=":memory:", heartbeat_timeout_s=5),
                         sec(certs, "controller"))
    yield f"127.0.0.1:{c.ports[0]}"
    c.stop(0)


def register(stub, topo_doc, h: int, as_container: str | None = None):
    c = topo_doc["containers"][h]
    return stub.Register(pb.RegisterRequest(
        container=as_container or c["id"], job=c["job"], host=c["host"], probe_port=7100,
        endpoints=[pb.EndpointInfo(id=e["id"], nic=e["nic"], ip=e["ip"])
                   for e in c["endpoints"]]), timeout=5)


def code_of(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code()


def test_an_agent_acts_only_as_its_own_container(controller, certs, topo_doc):
    a, b = topo_doc["containers"][0]["id"], topo_doc["containers"][1]["id"]
    with channel(controller, agent_sec(certs, a)) as ch:
        stub = pb_grpc.ControllerStub(ch)
        register(stub, topo_doc, 0)  # as itself: fine
        denied = grpc.StatusCode.PERMISSION_DENIED
        assert code_of(lambda: register(stub, topo_doc, 1)) == denied
        assert code_of(lambda: stub.Heartbeat(pb.HeartbeatRequest(container=b, ready=True),
                                              timeout=5)) == denied
        assert code_of(lambda: stub.Deregister(pb.DeregisterRequest(container=b),
                                               timeout=5)) == denied
        assert code_of(lambda: next(stub.WatchPingList(
            pb.WatchPingListRequest(container=b), timeout=5))) == denied
        forged = pb.AgentReport(container=b, windows=pb.WindowBatch())
        assert code_of(lambda: stub.Report(iter([forged]), timeout=5)) == denied
        # The feed of every report is the analyzer's, not an agent's.
        assert code_of(lambda: next(stub.WatchReports(pb.WatchReportsRequest(),
                                                      timeout=5))) == denied
        # Its own list it may read.
        first = next(stub.WatchPingList(pb.WatchPingListRequest(container=a), timeout=5))
        assert first.full
        assert stub.Heartbeat(pb.HeartbeatRequest(container=a, ready=True), timeout=5).known


def test_no_certificate_no_connection(controller, certs):
    ca = (certs / "ca.pem").read_bytes()
    with grpc.secure_channel(controller, grpc.ssl_channel_credentials(ca)) as ch:
        code = code_of(lambda: pb_grpc.ControllerStub(ch).Heartbeat(
            pb.HeartbeatRequest(container="x"), timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(controller) as ch:  # plaintext against TLS
        assert code_of(lambda: pb_grpc.ControllerStub(ch).Heartbeat(
            pb.HeartbeatRequest(container="x"), timeout=5)) == grpc.StatusCode.UNAVAILABLE


def test_a_certified_agent_registers_and_its_list_arrives(controller, certs, topo_doc):
    """The real agent over mutual TLS, and the analyzer's certificate on the feed."""
    events: queue.Queue = queue.Queue()
    feed_ch = channel(controller, sec(certs, "analyzer"))
    feed = pb_grpc.ControllerStub(feed_ch).WatchReports(pb.WatchReportsRequest())

    def follow() -> None:
        try:
            for e in feed:
                events.put(e)
        except grpc.RpcError:  # cancelled at the end
            pass

    threading.Thread(target=follow, daemon=True).start()
    agents = [Agent(dataclasses.replace(agent_cfg(topo_doc, h, controller), probe_port=0), agent_sec(
        certs, topo_doc["containers"][h]["id"])) for h in (0, 1)]
    try:
        for ag in agents:
            ag.start()
        wait_for(lambda: all(ag.list_version > 0 and ag.targets for ag in agents), 20,
                 "both agents' lists over TLS")
        wait_for(lambda: not events.empty(), 20, "the analyzer's feed over TLS")
    finally:
        for ag in agents:
            ag.stop(deregister=True)
        feed.cancel()
        feed_ch.close()
    assert all(not ag.registered for ag in agents)  # deregistered as themselves


def _analyzer(topo_file, security):
    return start_analyzer(AnalyzerConfig(topology=str(topo_file), controller="unix:/nonexistent",
                                         listen=("127.0.0.1:0",)), sec=security)


def list_incidents(target: str, security: Security) -> None:
    with channel(target, security) as ch:
        dpb_grpc.NetDiagStub(ch).ListIncidents(dpb.ListIncidentsRequest(), timeout=5)


def test_netdiag_wants_a_token_or_a_certificate(topo_file, certs):
    ca_only = Tls.load("", "", str(certs / "ca.pem"))
    # TLS with a token: a client without a certificate needs the token.
    ana = _analyzer(topo_file, sec(certs, "analyzer", TOKEN))
    try:
        target = f"localhost:{ana.ports[0]}"
        assert code_of(lambda: list_incidents(target, Security(ca_only))) == \
            grpc.StatusCode.UNAUTHENTICATED
        assert code_of(lambda: list_incidents(target, Security(ca_only, "wrong-token-0123456"))) \
            == grpc.StatusCode.UNAUTHENTICATED
        list_incidents(target, Security(ca_only, TOKEN))
    finally:
        ana.stop(0)
    # TLS without a token: the operator's certificate admits, nothing else connects.
    ana = _analyzer(topo_file, sec(certs, "analyzer"))
    try:
        target = f"localhost:{ana.ports[0]}"
        list_incidents(target, sec(certs, "operator"))
        assert code_of(lambda: list_incidents(target, Security(ca_only))) == \
            grpc.StatusCode.UNAVAILABLE
    finally:
        ana.stop(0)
    # Plaintext with a token (the testbed): still no answer without it.
    ana = _analyzer(topo_file, Security(None, TOKEN))
    try:
        target = f"127.0.0.1:{ana.ports[0]}"
        assert code_of(lambda: list_incidents(target, Security())) == \
            grpc.StatusCode.UNAUTHENTICATED
        list_incidents(target, Security(None, TOKEN))
    finally:
        ana.stop(0)


def test_flags_say_tls_or_insecure_in_one_clear_error(certs, tmp_path):
    with pytest.raises(InputError, match="or --insecure"):
        from_flags("", "", "", False, "controller")
    with pytest.raises(InputError, match="go together"):
        from_flags(str(certs / "controller.pem"), "", "", False, "controller")
    with pytest.raises(InputError, match="exclude each other"):
        from_flags(str(certs / "controller.pem"), str(certs / "controller.key"),
                   str(certs / "ca.pem"), True, "controller")
    with pytest.raises(InputError, match="not a PEM file"):
        from_flags(str(certs / "controller.pem"), str(certs / "controller.key"),
                   str(_write(tmp_path / "junk", b"junk")), False, "controller")
    short = _write(tmp_path / "tok", b"short\n")
    with pytest.raises(InputError, match="16 or more"):
        from_flags("", "", "", True, "analyzer", str(short))
    assert from_flags("", "", "", True, "analyzer").insecure
    # The agent's asyncio channel: a token is never sent in the clear.
    with pytest.raises(InputError, match="needs TLS"):
        aio_channel("localhost:1", Security(None, TOKEN))


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _get(url: str, headers: dict[str, str] | None = None, context=None) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=5, context=context) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_web_page_wants_a_token_or_a_certificate(topo_file, certs):
    import ssl

    def web(security):
        return start_analyzer(AnalyzerConfig(topology=str(topo_file), controller="unix:/none",
                                             listen=("127.0.0.1:0",), web_listen="127.0.0.1:0"),
                              sec=security)

    ana = web(Security(None, TOKEN))
    try:
        base = f"http://127.0.0.1:{ana.web.port}/api/state"
        assert _get(base) == 401
        assert _get(base, {"Authorization": "Bearer nope-nope-nope-nope"}) == 401
        assert _get(base, {"Authorization": f"Bearer {TOKEN}"}) == 200
        assert _get(f"{base}?token={TOKEN}") == 200
    finally:
        ana.stop(0)
    ana = web(sec(certs, "analyzer"))
    try:
        base = f"https://localhost:{ana.web.port}/api/state"
        anonymous = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        assert _get(base, context=anonymous) == 401
        operator = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        operator.load_cert_chain(certs / "operator.pem", certs / "operator.key")
        assert _get(base, context=operator) == 200
    finally:
        ana.stop(0)
