"""Starting daemons and agent processes on loopback for fleet tests."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time

import grpc

from measure_agent.device import detect_device
from measure_agent.engine import MeasureResult, MeasureStatus
from measure_agent.protocol import PROTOCOL_VERSION
from measure_agent.protocol.convert import capabilities_to_proto, result_to_proto
from measure_agent.protocol.v1 import fleet_pb2 as pb
from measure_agent.protocol.v2 import agent_pb2 as pb2
from measure_agent.protocol.v2 import agent_pb2_grpc as pb2_grpc
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
    """An agent over the raw protocol (v2, no engine): it reports ``cost_of(candidate_number)``
    seconds, or a malformed measurement where that returns a Measurement message."""

    def __init__(self, address: str, key: str = "fake", name: str = "fake-1", cost_of=lambda n: 1e-3,
                 device=None, template_version: str | None = None,
                 leases_when: threading.Event | None = None) -> None:
        """``device``: the DeviceInfo it says it is (default: this host); ``template_version``:
        that of the daemon's catalog (default: the testing catalog's); ``leases_when``: joined and
        heartbeating, it gives credit (takes work) only once this is set."""
        self.channel = grpc.insecure_channel(address)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._replies = pb2_grpc.AgentServiceStub(self.channel).Connect(iter(self._requests.get, None))
        caps = capabilities_to_proto(device or detect_device(), "test",
                                     template_version or testing_catalog().version, [])
        self._send(hello=pb2.Hello(key=key, name=name, capabilities=caps, protocol_version=PROTOCOL_VERSION,
                                   parallel=1))
        self.agent_id = next(self._replies).welcome.agent_id  # raises grpc.RpcError when refused
        self.cost_of = cost_of
        self.leases_when = leases_when
        self.reported = 0
        self.credit = 1  # candidates held at once: one, so that each is leased when the agent is idle
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def _send(self, **kind) -> None:
        self._requests.put(pb2.AgentMessage(**kind))

    def _heartbeat(self) -> None:
        while not self._stop.wait(0.2):
            self._send(heartbeat=pb2.Heartbeat())

    def _serve(self) -> None:
        while self.leases_when is not None and not self.leases_when.wait(0.2):
            if self._stop.is_set():
                return
        self._send(credit=pb2.Credit(candidates=self.credit))
        try:
            for message in self._replies:
                for candidate in message.leases.candidates:
                    if self._stop.is_set():
                        return
                    outcome = self.cost_of(self.reported)
                    self.reported += 1
                    if isinstance(outcome, pb.Measurement):
                        outcome.lease_id = candidate.lease_id
                        measurement = outcome
                    else:
                        measurement = result_to_proto(candidate.lease_id, MeasureResult(MeasureStatus.OK,
                                                                                        costs=(outcome,)))
                    self._send(results=pb2.Results(measurements=[measurement]))
                    self._send(credit=pb2.Credit(candidates=1))
        except grpc.RpcError:
            return

    def stop(self, leave: bool = False) -> None:
        """Stop serving and close the stream (the daemon requeues what it held at once); with
        ``leave``, say so first (as a stopping agent does)."""
        self._stop.set()
        if leave:
            self._send(leaving=pb2.Leaving())
        self._requests.put(None)
        self.thread.join(timeout=10)
        self._replies.cancel()
        self.channel.close()


class RawStream:
    """One protocol v2 stream driven message by message (``send`` one kind, ``receive`` the next
    daemon message): for tests of the stream itself."""

    def __init__(self, address: str, metadata=(), channel: grpc.Channel | None = None) -> None:
        self.channel = channel or grpc.insecure_channel(address)
        self._requests: queue.Queue = queue.Queue()
        self.replies = pb2_grpc.AgentServiceStub(self.channel).Connect(iter(self._requests.get, None),
                                                                        metadata=metadata)

    def send(self, **kind) -> None:
        self._requests.put(pb2.AgentMessage(**kind))

    def hello(self, key: str = "k", name: str = "raw-1", template_version: str | None = None,
              protocol_version: int | None = None, parallel: int = 1):
        """Say hello and return the daemon's welcome (raises grpc.RpcError when refused)."""
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
