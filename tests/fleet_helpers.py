"""Starting daemons and agent processes on loopback for fleet tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import grpc

from measure_agent.device import detect_device
from measure_agent.engine import MeasureResult, MeasureStatus
from measure_agent.protocol import V1_PROTOCOL_VERSION
from measure_agent.protocol.convert import capabilities_to_proto, result_to_proto
from measure_agent.protocol.v1 import fleet_pb2 as pb
from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc
from measure_agent.templates import testing_catalog
from tuner.daemon import Daemon


def start_daemon(log, listen="127.0.0.1:0", **kwargs) -> Daemon:
    kwargs.setdefault("heartbeat_interval_s", 0.3)
    kwargs.setdefault("agent_timeout_s", 2.0)
    return Daemon(log, listen, catalog=testing_catalog(), **kwargs).start()


def start_agent(address: str, key: str, name: str, cache_dir, parallel: int = 2, templates: str = "testing",
                extra_args: tuple[str, ...] = ()):
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_dir))
    return subprocess.Popen(
        [sys.executable, "-m", "measure_agent", "--tracker", address, "--key", key, "--name", name,
         "--parallel", str(parallel), "--templates", templates, *extra_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def agent_names(daemon: Daemon, key: str | None = None) -> set[str]:
    return {a.name for a in daemon.scheduler.agents() if key is None or a.key == key}


def stop_all(processes):
    for p in processes:
        if p.poll() is None:
            p.terminate()
    for p in processes:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon_process(db_url: str, port: int, env=None) -> subprocess.Popen:
    """``tuner daemon`` as its own process (to be killed with SIGKILL in tests)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{port}", "--db", db_url,
         "--templates", "testing", "--heartbeat-interval", "0.3", "--agent-timeout", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )


class FakeAgent:
    """An agent over the raw protocol (no engine): it reports ``cost_of(candidate_number)`` seconds,
    or a malformed measurement where that returns a Measurement message."""

    def __init__(self, address: str, key: str = "fake", name: str = "fake-1", cost_of=lambda n: 1e-3,
                 device=None, template_version: str | None = None,
                 leases_when: threading.Event | None = None) -> None:
        """``device``: the DeviceInfo it says it is (default: this host); ``template_version``:
        that of the daemon's catalog (default: the testing catalog's); ``leases_when``: registered
        and heartbeating, it takes work only once this is set."""
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.AgentServiceStub(self.channel)
        caps = capabilities_to_proto(device or detect_device(), "test",
                                     template_version or testing_catalog().version, [])
        self.agent_id = self.stub.Register(pb.RegisterRequest(key=key, name=name, capabilities=caps,
                                                               protocol_version=V1_PROTOCOL_VERSION,
                                                               parallel=1)).agent_id
        self.cost_of = cost_of
        self.leases_when = leases_when
        self.reported = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self.stub.Heartbeat(pb.HeartbeatRequest(agent_id=self.agent_id), timeout=5)
                if self.leases_when is not None and not self.leases_when.wait(0.2):
                    continue
                reply = self.stub.Lease(pb.LeaseRequest(agent_id=self.agent_id, max_candidates=2, wait_s=0.2),
                                        timeout=5)
                for candidate in reply.candidates:
                    outcome = self.cost_of(self.reported)
                    self.reported += 1
                    if isinstance(outcome, pb.Measurement):
                        outcome.lease_id = candidate.lease_id
                        measurement = outcome
                    else:
                        measurement = result_to_proto(candidate.lease_id, MeasureResult(MeasureStatus.OK,
                                                                                        costs=(outcome,)))
                    self.stub.Report(pb.ReportRequest(agent_id=self.agent_id, measurements=[measurement]), timeout=5)
            except grpc.RpcError:
                if self._stop.is_set():
                    return
                time.sleep(0.1)

    def stop(self, leave: bool = False) -> None:
        """Stop serving; with ``leave``, say so to the daemon first (as a stopping agent does)."""
        self._stop.set()
        self.thread.join(timeout=10)
        if leave:
            self.stub.Leave(pb.LeaveRequest(agent_id=self.agent_id), timeout=5)
        self.channel.close()


class RawStream:
    """One protocol v2 stream driven message by message (``send`` one kind, ``receive`` the next
    daemon message): for tests of the stream itself."""

    def __init__(self, address: str, metadata=(), channel: grpc.Channel | None = None) -> None:
        import queue

        from measure_agent.protocol.v2 import agent_pb2_grpc as pb2_grpc

        self.channel = channel or grpc.insecure_channel(address)
        self._requests: queue.Queue = queue.Queue()
        self.replies = pb2_grpc.AgentServiceStub(self.channel).Connect(iter(self._requests.get, None),
                                                                        metadata=metadata)

    def send(self, **kind) -> None:
        from measure_agent.protocol.v2 import agent_pb2 as pb2

        self._requests.put(pb2.AgentMessage(**kind))

    def hello(self, key: str = "k", name: str = "raw-1", template_version: str | None = None,
              protocol_version: int | None = None, parallel: int = 1):
        """Say hello and return the daemon's welcome (raises grpc.RpcError when refused)."""
        from measure_agent.protocol import PROTOCOL_VERSION
        from measure_agent.protocol.v2 import agent_pb2 as pb2

        caps = capabilities_to_proto(detect_device(), "test", template_version or testing_catalog().version, [])
        self.send(hello=pb2.Hello(key=key, name=name, capabilities=caps, parallel=parallel,
                                  protocol_version=PROTOCOL_VERSION if protocol_version is None else protocol_version))
        return self.receive().welcome

    def receive(self):
        return next(self.replies)

    def close(self) -> None:
        """End the stream from the agent's side (as a process that dies does)."""
        self._requests.put(None)
        self.replies.cancel()
