"""2,000 simulated agents (four processes of 500, real gRPC over a Unix
socket) against one controller process: every agent registers, gets its list,
turns ready, reports; nothing is lost and health answers throughout."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from netskel import serde
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from testbed import simagents
from tests.helpers import wait_for

AGENTS = 2000


def test_two_thousand_agents_one_controller(tmp_path):
    doc = simagents.topology(AGENTS)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    target = f"unix:{tmp_path}/c.sock"
    with open(tmp_path / "c.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "netskel.cli", "controller", "--topology",
                                 str(tmp_path / "t.json"), "--listen", target, "--db",
                                 str(tmp_path / "c.sqlite"), "--heartbeat-timeout", "600", "--insecure"],
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(lambda: simagents.healthy(target), 60, "the controller to serve")
        want = simagents.expected_lists(doc)
        assert sum(len(v) for v in want.values()) > AGENTS  # every agent has work

        async def main() -> tuple[list[dict], int, int]:
            """The fleet in worker processes; here, the analyzer's feed and
            a health probe, both for the whole run."""
            windows = health_failed = 0
            ch = grpc.aio.insecure_channel(target)
            feed = pb_grpc.ControllerStub(ch).WatchReports(pb.WatchReportsRequest())
            stop = asyncio.Event()

            async def count() -> None:
                nonlocal windows
                async for ev in feed:
                    if ev.HasField("windows"):
                        windows += len(serde.window_batch_from_pb(ev.windows))

            async def health() -> None:
                nonlocal health_failed
                stub = health_pb2_grpc.HealthStub(ch)
                while not stop.is_set():
                    try:
                        await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    except grpc.aio.AioRpcError:
                        health_failed += 1
                    await asyncio.sleep(0.25)

            tasks = [asyncio.create_task(count()), asyncio.create_task(health())]
            try:
                parts = await asyncio.to_thread(simagents.run_fleet, target, doc, 2, 120.0,
                                                simagents.PER_PROCESS, 400.0)
                sent = sum(p.get("sent", 0) for p in parts)
                deadline = time.monotonic() + 60
                while windows < sent and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
            finally:
                stop.set()
                feed.cancel()
                for t in tasks:
                    t.cancel()
                await ch.close()
            return parts, windows, health_failed

        parts, windows, health_failed = asyncio.run(main())
        failed = [p for p in parts if "error" in p]
        assert failed == [], failed[0].get("tb", "") if failed else ""
        assert sum(p["agents"] for p in parts) == AGENTS
        sent = sum(p["sent"] for p in parts)
        assert sent > 0 and sum(p["accepted"] for p in parts) == sent
        assert windows == sent, "windows lost between agents and the analyzer's feed"
        assert [p["wrong"] for p in parts] == [0] * len(parts), "lists that did not converge"
        assert sum(p["stream_errors"] for p in parts) == 0
        assert health_failed == 0 and all(p["health_failed"] == 0 for p in parts)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
