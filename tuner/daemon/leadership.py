"""A daemon's role in a tune-cluster of several daemons on one PostgreSQL log: leader or standby.

The lease and its fencing live in the log (:mod:`tuner.log.leadership`); this module is the daemon's
side. A standby answers health as NOT_SERVING (so load balancers and Kubernetes' readiness route to
the leader) and refuses agent and client calls with UNAVAILABLE, naming the leader's address in the
message and in the trailing metadata ``tunefleet-leader``, which agents and clients follow
(:class:`measure_agent.protocol.connection.Tracker`). It polls the lease every second and takes it
once it expires. A leader renews its lease every third of its time to live; when it finds the lease
taken (it was frozen, or cut from the database longer than the lease), it refuses calls at once and
tells its owner (``on_deposed``), which stops it: it comes back as a standby when restarted.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import grpc

from measure_agent.protocol.connection import LEADER_METADATA_KEY
from tuner.daemon.security import AGENT_SERVICES, CLIENT_SERVICE, refusing_handler
from tuner.log import LogUnavailable, TuningLogError
from tuner.log.leadership import LeaderLease

logger = logging.getLogger("tunefleet.daemon")

STANDBY_POLL_S = 1.0


class StandbyGate(grpc.ServerInterceptor):
    """Lets agent and client calls through only while this daemon leads."""

    def __init__(self, leading: bool = True) -> None:
        self.leading = leading
        self.leader_address = ""  # the leader as last read from the lease ("" when unknown or single)
        self.epoch = 0  # this daemon's lease epoch while it leads (0: a single daemon)

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if self.leading or not method.startswith((*AGENT_SERVICES, CLIENT_SERVICE)):
            return continuation(handler_call_details)
        leader = self.leader_address
        message = (f"this daemon is a standby; the leader is at {leader}" if leader
                   else "this daemon is a standby and no daemon leads yet")
        # always sent, empty while no daemon leads: clients tell a standby from a daemon that is down
        return refusing_handler(continuation(handler_call_details), grpc.StatusCode.UNAVAILABLE, message, method,
                                trailing_metadata=((LEADER_METADATA_KEY, leader),), log=False)


class LeadershipKeeper:
    """The thread that takes, renews and (on deposition) gives up leadership for one daemon."""

    def __init__(self, lease: LeaderLease, gate: StandbyGate, *, on_promoted: Callable[[], None],
                 on_deposed: Callable[[], None], poll_s: float = STANDBY_POLL_S) -> None:
        self.lease = lease
        self.gate = gate
        self.on_promoted = on_promoted
        self.on_deposed = on_deposed
        self.poll_s = poll_s
        self.deposed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="tunefleet-leadership", daemon=True)

    @property
    def leading(self) -> bool:
        return self.gate.leading

    def start(self) -> "LeadershipKeeper":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop taking or renewing the lease; then :meth:`release` once the jobs are stopped."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def release(self) -> None:
        """Expire this daemon's lease so that a standby takes over at once (a graceful stop)."""
        if self.gate.leading and not self.deposed:
            self.gate.leading = False
            try:
                self.lease.release()
            except TuningLogError as exc:
                logger.warning("could not release the leadership lease (a standby takes over when it expires): %s",
                               exc)

    def _keep(self) -> None:
        while not self._stop.is_set():
            leading = self.gate.leading
            try:
                acquired = self.lease.try_acquire()
                if not acquired:
                    current = self.lease.current()
                    self.gate.leader_address = current.address if current and current.live else ""
            except LogUnavailable as exc:
                # Nobody can take a lease from a database nobody reaches; if others reach it, our
                # lease expires, their takeover fences our writes, and the next renewal says so.
                logger.warning("cannot reach the leadership lease: %s", exc)
                acquired = leading
            except TuningLogError as exc:
                logger.error("leadership lease: %s", exc)
                acquired = leading
            if acquired and not leading:
                logger.info("leading the tune-cluster (epoch %s)", self.lease.epoch)
                self.gate.leader_address = self.lease.address
                self.gate.epoch = self.lease.epoch or 0
                self.on_promoted()
                self.gate.leading = True
            elif leading and not acquired:
                self.gate.leading = False
                self.deposed = True
                logger.error("deposed: another daemon leads now (at %s); stopping, nothing more is recorded here",
                             self.gate.leader_address or "an unknown address")
                self.on_deposed()
                return
            self._stop.wait(self.lease.ttl_s / 3 if self.gate.leading else self.poll_s)
