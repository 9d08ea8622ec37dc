"""An agent's end of a protocol v2 stream: hello and welcome, credit out, leases in.

One :class:`AgentStream` is one registration. Its reader thread files leased candidates in an inbox
the agent takes batches from; a heartbeat thread keeps the stream (and the agent) known and notices
a daemon that went silent. Sending only queues a message, so it never blocks the agent's work.
When the stream ends, :attr:`error` says why (``None``: the agent left) and the inbox wakes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Iterator

import grpc

from measure_agent.protocol import PROTOCOL_VERSION, V1_PROTOCOL_VERSION
from measure_agent.protocol.connection import leader_hint
from measure_agent.protocol.errors import FleetError, Unavailable, VersionMismatch, from_rpc_error
from measure_agent.protocol.v1 import fleet_pb2 as pb1
from measure_agent.protocol.v2 import agent_pb2 as pb
from measure_agent.protocol.v2 import agent_pb2_grpc as pb_grpc

logger = logging.getLogger("tunefleet.agent")

_END = object()  # closes the request iterator, and ends the inbox after the last lease


class AgentStream:
    """Opened by :meth:`open` (raises the refusal or outage as a :class:`FleetError`)."""

    def __init__(self, channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._call = pb_grpc.AgentServiceStub(channel).Connect(self._outgoing(), metadata=metadata)
        # leased candidates, then _END once the stream ended: a queue whose wait and wake-up are
        # C (a Condition's are Python, and its waiter woke to contend for the reader's lock)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        # what take_when_leased arranged (how many, and whom to hand them), until it is done
        self._waiting: tuple[int, Callable[[list[pb1.Candidate]], None]] | None = None
        self._waiting_lock = threading.Lock()
        self._ended = threading.Event()
        self.error: FleetError | None = None
        self.leader_hint: str | None = None  # the leader a standby named when it refused the stream
        self.agent_id = ""
        self.heartbeat_interval_s = 2.0
        self.agent_timeout_s = 10.0
        self.results_carry_credit = False  # the welcome says whether results may carry new credit
        self._last_heard = time.monotonic()

    def open(self, hello: pb.Hello, timeout_s: float = 10.0) -> "AgentStream":
        """Say hello; returns once welcomed. Raises the daemon's refusal, or :class:`Unavailable`."""
        self.send(hello=hello)
        welcomed = threading.Event()
        reader = threading.Thread(target=self._read, args=(welcomed,), name="tunefleet-stream", daemon=True)
        reader.start()
        if not welcomed.wait(timeout_s):
            self._call.cancel()
            reader.join(timeout=5)
            if self.error is None:
                self.error = Unavailable(f"daemon did not welcome this agent in {timeout_s:g} s")
        if self.error is None and not self.agent_id:
            self.error = Unavailable("daemon closed the stream before welcoming this agent")
        if self.error is not None:
            raise self.error
        threading.Thread(target=self._heartbeat, name="tunefleet-heartbeat", daemon=True).start()
        return self

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def send(self, **kind) -> None:
        """Queue one message (``credit=``, ``results=``...); dropped once the stream ended."""
        if not self._ended.is_set():
            self._requests.put(pb.AgentMessage(**kind))

    def take(self, most: int, wait_s: float) -> list[pb1.Candidate]:
        """Up to ``most`` leased candidates, waiting up to ``wait_s`` for the first (fewer when the
        stream ends)."""
        try:
            first = self._inbox.get(timeout=max(0.0, wait_s))
        except queue.Empty:
            return []
        taken: list[pb1.Candidate] = []
        item = first
        while True:
            if item is _END:
                self._inbox.put(_END)  # the stream stays ended for later takes
                break
            taken.append(item)
            if len(taken) >= most:
                break
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
        return taken

    def take_when_leased(self, most: int, deliver: Callable[[list[pb1.Candidate]], None]) -> None:
        """Call ``deliver`` once with what :meth:`take` would return (up to ``most`` candidates; none
        once the stream ended): at once, in this thread, when candidates are queued or the stream
        ended, else in the reader's thread when the next leases come or the stream ends; until then
        :meth:`cancel_take` withdraws it. ``deliver`` must be quick and must not raise.

        An agent hands the leases to the thread that builds them ahead: woken once, with them,
        instead of once to wait for them in :meth:`take` and once more when they come."""
        with self._waiting_lock:
            if self._inbox.empty():  # the end of the stream queues _END: not empty then
                self._waiting = (most, deliver)
                return
        deliver(self.take(most, 0.0))

    def cancel_take(self) -> bool:
        """Withdraw what :meth:`take_when_leased` arranged; False when it was done already (or none was)."""
        with self._waiting_lock:
            waiting, self._waiting = self._waiting, None
        return waiting is not None

    def _deliver_waiting(self) -> None:
        """Reader thread, after queueing leases or the end of the stream."""
        with self._waiting_lock:
            waiting, self._waiting = self._waiting, None
        if waiting is not None:
            most, deliver = waiting
            deliver(self.take(most, 0.0))

    def leave(self, timeout_s: float = 5.0) -> None:
        """Say goodbye after whatever was queued (results first) and wait for the daemon to close."""
        if not self._ended.is_set():
            self.send(leaving=pb.Leaving())
            self._requests.put(_END)
            self._ended.wait(timeout_s)
        self.close()

    def close(self) -> None:
        self._requests.put(_END)
        self._call.cancel()
        self._ended.wait(5.0)

    # -- threads ----------------------------------------------------------------------------
    def _outgoing(self) -> Iterator[pb.AgentMessage]:
        while (message := self._requests.get()) is not _END:
            yield message

    def _read(self, welcomed: threading.Event) -> None:
        try:
            for message in self._call:
                self._last_heard = time.monotonic()
                kind = message.WhichOneof("kind")
                if kind == "leases":
                    for candidate in message.leases.candidates:
                        self._inbox.put(candidate)
                    self._deliver_waiting()
                elif kind == "welcome":
                    self.agent_id = message.welcome.agent_id
                    self.heartbeat_interval_s = message.welcome.heartbeat_interval_s or 2.0
                    self.agent_timeout_s = message.welcome.agent_timeout_s or 10.0
                    self.results_carry_credit = message.welcome.results_carry_credit
                    welcomed.set()
                elif kind == "results_refused":
                    logger.info("%d results were no longer wanted (leases expired)",
                                len(message.results_refused.lease_ids))
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.leader_hint = leader_hint(exc)  # None unless a standby answered
                self.error = _stream_error(exc)
        finally:
            self._ended.set()
            self._inbox.put(_END)  # wakes a take waiting for candidates
            self._deliver_waiting()
            welcomed.set()
            self._requests.put(_END)

    def _heartbeat(self) -> None:
        while not self._ended.wait(self.heartbeat_interval_s):
            if time.monotonic() - self._last_heard > self.agent_timeout_s:
                # The daemon acknowledges each heartbeat: this long without a word, it is gone.
                self.error = Unavailable(f"daemon silent for {self.agent_timeout_s:g} s")
                self._call.cancel()
                return
            self.send(heartbeat=pb.Heartbeat())


def _stream_error(exc: grpc.RpcError) -> FleetError:
    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        # A daemon of protocol 1 has no Connect: one line naming both versions.
        return VersionMismatch(f"the daemon speaks protocol {V1_PROTOCOL_VERSION}, this agent {PROTOCOL_VERSION}: "
                               "install the same tunefleet version on both")
    return from_rpc_error(exc)
