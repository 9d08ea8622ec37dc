"""How much any peer may ask of the daemon: sizes of what it sends, and how many calls it holds.

The job's own fields are bounded by :mod:`tuner.fleet.jobs` and timing by
:data:`measure_agent.engine.types.TIMING_LIMITS`; these are the limits of the daemon's edge.
``docs/security.md`` lists every one (a test compares the two).
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import grpc

from measure_agent.protocol.connection import MAX_MESSAGE_BYTES  # noqa: F401 - one gRPC message, either way

MAX_AGENT_NAME_CHARS = 128
MAX_CAPABILITY_TEXT_CHARS = 256  # each text an agent reports about its device
MAX_CAPABILITY_LIST = 512  # ISA features, installed templates
MAX_CANDIDATES_PER_LEASE = 256
MAX_LEASE_WAIT_S = 30.0
MAX_HELLO_WAIT_S = 30.0  # a v2 stream that does not send its hello by then is closed
MAX_STREAM_CREDIT = MAX_CANDIDATES_PER_LEASE  # leases a v2 agent holds plus credit left; more is clamped
MAX_CONFIGS_PER_MEASURE = 256
MAX_MEASURE_S = 900.0  # a Measure call gives up after this long
MAX_WATCH_S = 3600.0  # a WatchJob stream ends after this long (clients follow it again)
MAX_CLIENT_CALLS = 64  # client calls in progress at once; agents' calls are never counted
MAX_CLIENT_CALLS_PER_PEER = 16
SERVER_THREADS = 256
MAX_LISTED_JOBS = 500  # jobs in one ListJobs page
DRIVER_THREADS = 4  # threads that advance all the daemon's jobs, a step at a time
VALIDATION_THREADS = 2  # submissions whose constraints are checked at once
FINISHED_JOBS_KEPT = 1000  # finished jobs remembered in memory (the log keeps them all)
LEASE_GRACE_S = 60.0  # added to every lease's deadline (worker start-up, a slow network)
OVERDUE_LEASES_TO_QUARANTINE = 3
MAX_DEVICE_KINDS_PER_KEY = 64  # kinds of device remembered per key, to refuse jobs none can serve
MAX_REFUSED_AGENTS_KEPT = 256  # refused registrations remembered for `tuner agents` (the latest ones)


class ClientCallsFull(Exception):
    """Too many client calls in progress (for everyone, or from one peer)."""


class ClientCallLimiter:
    """Counts client calls in progress, overall and per peer, so that clients can never take the
    server threads agents need for heartbeats and reports."""

    def __init__(self, total: int = MAX_CLIENT_CALLS, per_peer: int = MAX_CLIENT_CALLS_PER_PEER) -> None:
        self.total = total
        self.per_peer = per_peer
        self._lock = threading.Lock()
        self._busy = 0
        self._by_peer: Counter[str] = Counter()

    @contextmanager
    def call(self, peer: str) -> Iterator[None]:
        """Hold one call slot for ``peer`` while the body runs; raises :class:`ClientCallsFull`."""
        host = _peer_host(peer)
        with self._lock:
            if self._busy >= self.total:
                raise ClientCallsFull(f"the daemon is serving {self.total} client calls; try again shortly")
            if self._by_peer[host] >= self.per_peer:
                raise ClientCallsFull(f"at most {self.per_peer} client calls at once from one host")
            self._busy += 1
            self._by_peer[host] += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                self._by_peer[host] -= 1
                if not self._by_peer[host]:
                    del self._by_peer[host]

    @property
    def busy(self) -> int:
        return self._busy


def _peer_host(peer: str) -> str:
    """``ipv4:1.2.3.4:5678`` -> ``ipv4:1.2.3.4``: a client's calls count together whatever port."""
    head, _, port = peer.rpartition(":")
    return head if head and port.isdigit() else peer


CLIENT_SERVICE_PREFIX = "/measure_agent.protocol.v1.ClientService/"


class ClientCallInterceptor(grpc.ServerInterceptor):
    """Holds every ClientService call to a :class:`ClientCallLimiter` slot (a stream for as long as
    it streams); a call beyond the limits ends at once with RESOURCE_EXHAUSTED."""

    def __init__(self, limiter: ClientCallLimiter) -> None:
        self.limiter = limiter

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(CLIENT_SERVICE_PREFIX):
            return handler
        limiter = self.limiter
        if handler.unary_unary is not None:
            behaviour = handler.unary_unary

            def unary(request, context):
                try:
                    with limiter.call(context.peer()):
                        return behaviour(request, context)
                except ClientCallsFull as exc:
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.unary_stream is not None:
            stream = handler.unary_stream

            def streaming(request, context):
                try:
                    with limiter.call(context.peer()):
                        yield from stream(request, context)
                except ClientCallsFull as exc:
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))

            return grpc.unary_stream_rpc_method_handler(streaming, handler.request_deserializer,
                                                        handler.response_serializer)
        return handler
