"""The tune-cluster daemon: scheduler, job manager and gRPC server on one port."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from measure_agent.protocol.connection import CHANNEL_OPTIONS
from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc
from measure_agent.protocol.v2 import agent_pb2_grpc as pb2_grpc
from measure_agent.templates import TemplateCatalog, default_catalog
from tuner.daemon.aio_server import LoopServer
from tuner.daemon.fleet_state import DaemonFleetState
from tuner.daemon.jobs import JobManager
from tuner.daemon.leadership import LeadershipKeeper, StandbyGate
from tuner.daemon.limits import SERVER_THREADS, ClientCallInterceptor, ClientCallLimiter
from tuner.daemon.observability import DaemonMetrics
from tuner.daemon.scheduler import Scheduler
from tuner.daemon.security import TokenAuthInterceptor, server_credentials
from tuner.daemon.service import AgentService, ClientService
from tuner.daemon.stream_service import StreamAgentService
from tuner.log import TuningLog
from tuner.log.leadership import DEFAULT_TTL_S, LeaderLease

logger = logging.getLogger("tunefleet.daemon")

SERVICE_NAMES = ("measure_agent.protocol.v2.AgentService", "measure_agent.protocol.v1.AgentService",
                 "measure_agent.protocol.v1.ClientService")


@dataclass(frozen=True)
class Security:
    """TLS files and token lists of a daemon; empty means open (fine on loopback only)."""

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    agent_tokens: tuple[str, ...] = ()
    client_tokens: tuple[str, ...] = ()


def create_server(address: str, agent_service: AgentService, client_service: ClientService,
                  security: Security = Security(), max_workers: int = SERVER_THREADS,
                  client_calls: ClientCallLimiter | None = None, gate: StandbyGate | None = None,
                  stream_service: StreamAgentService | None = None) -> tuple[LoopServer, int, TokenAuthInterceptor]:
    """A ready (not started) gRPC server bound to ``address`` (port 0 picks a free port), with the
    health service and, when configured, TLS and token checks. Client calls are held to
    ``client_calls`` (default: the limits of :mod:`tuner.daemon.limits`), so that clients never
    take the threads agents need. ``gate`` refuses calls while the daemon is a standby.
    ``stream_service`` serves protocol v2's agent streams on the server's event loop."""
    interceptor = TokenAuthInterceptor(security.agent_tokens, security.client_tokens)
    limiter = ClientCallInterceptor(client_calls or ClientCallLimiter())
    interceptors = [interceptor] + ([gate] if gate is not None else []) + [limiter]
    if (security.tls_cert or security.tls_key) and not (security.tls_cert and security.tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    credentials = (server_credentials(security.tls_cert, security.tls_key, security.tls_client_ca)
                   if security.tls_cert else None)
    health_servicer = health.HealthServicer()
    for name in ("",) + SERVICE_NAMES:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    def setup(server: grpc.aio.Server) -> int:
        if stream_service is not None:
            stream_service.bind(asyncio.get_running_loop())
            pb2_grpc.add_AgentServiceServicer_to_server(stream_service, server)
        pb_grpc.add_AgentServiceServicer_to_server(agent_service, server)
        pb_grpc.add_ClientServiceServicer_to_server(client_service, server)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        return server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)

    server = LoopServer(interceptors, CHANNEL_OPTIONS, max_workers, setup)
    port = server.setup_result
    if port == 0:
        server.stop(None)
        raise OSError(f"cannot listen on {address}")
    server.health_servicer = health_servicer  # type: ignore[attr-defined]
    return server, port, interceptor


class Daemon:
    """Everything a daemon runs; ``start()`` then ``stop()`` (also a context manager).

    With ``leadership`` (a PostgreSQL log shared by several daemons, :mod:`tuner.daemon.leadership`)
    the daemon starts as a standby and leads once it holds the lease: only then does it resume the
    log's running jobs and take agent and client calls. ``on_deposed`` hears when it lost the lease
    to another daemon; its owner should stop it (``tuner daemon`` exits with
    :data:`EXIT_DEPOSED`). ``advertise`` is the address other daemons send clients to when this one leads.
    ``agents_share_host``: the agents run on this host (the embedded local agent of ``tuner tune``):
    jobs of kernels timed on the CPU then propose only between batches (``Measurer.shares_cpu_with_tuner``).
    """

    def __init__(self, log: TuningLog, listen: str = "127.0.0.1:0", catalog: TemplateCatalog | None = None,
                 heartbeat_interval_s: float = 2.0, agent_timeout_s: float = 10.0,
                 security: Security = Security(), *, leadership: bool = False, advertise: str | None = None,
                 lease_ttl_s: float = DEFAULT_TTL_S, on_deposed: Callable[[], None] | None = None,
                 serve_v1_agents: bool = False, agents_share_host: bool = False) -> None:
        self.log = log
        self.catalog = catalog or default_catalog()
        self.metrics = DaemonMetrics()  # this daemon's own registry; served by MetricsServer
        self.scheduler = Scheduler(heartbeat_interval_s, agent_timeout_s, on_result=self.metrics.observe_result)
        self.jobs = JobManager(self.scheduler, log, self.catalog, agents_share_host=agents_share_host)
        self.gate = StandbyGate(leading=not leadership)
        self.fleet_state = DaemonFleetState(self.scheduler, self.jobs, self.gate)  # the dashboard's live view
        self.streams = StreamAgentService(self.scheduler, self.catalog)  # protocol v2's agents
        self.server, self.port, self.auth = create_server(
            listen, AgentService(self.scheduler, self.catalog, serve_v1=serve_v1_agents), ClientService(self.jobs, self.scheduler, self.catalog, self.gate),
            security, gate=self.gate, stream_service=self.streams,
        )
        host = listen.rsplit(":", 1)[0] or "127.0.0.1"
        self.address = f"{host}:{self.port}"
        self.advertise = advertise or (self.address if host not in ("0.0.0.0", "[::]") else
                                       f"{socket.getfqdn()}:{self.port}")
        self.keeper: LeadershipKeeper | None = None
        if leadership:
            lease = LeaderLease(log, self.advertise, lease_ttl_s)
            self.keeper = LeadershipKeeper(lease, self.gate, on_promoted=self._promoted,
                                           on_deposed=self._deposed)
        self._on_deposed = on_deposed or (lambda: None)
        self.metrics.watch(self)
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="tunefleet-reaper", daemon=True)

    @property
    def leading(self) -> bool:
        return self.gate.leading

    @property
    def leader_address(self) -> str:
        """Where the leader is: this daemon's advertised address while it leads."""
        return self.advertise if self.gate.leading else self.gate.leader_address

    def start(self) -> "Daemon":
        self.server.start()
        self._reaper.start()
        if self.keeper is None:
            self.jobs.resume()  # jobs a stopped or killed daemon left running
        else:
            self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            self.keeper.start()  # resumes them once it leads
        logger.info("daemon listening on %s (templates %s)%s", self.address, self.catalog.version,
                    "" if self.keeper is None else f", advertised as {self.advertise}, standby until it leads")
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking calls, stop running jobs (their results are in the log), close; a leader
        then releases its lease, so a standby takes over at once."""
        self.server.health_servicer.enter_graceful_shutdown()
        self._stop.set()
        if self.keeper is not None:
            self.keeper.stop()
        self.jobs.shutdown()
        if self.keeper is not None:
            self.keeper.release()
        self.server.stop(grace_s).wait()

    def _promoted(self) -> None:
        self.log.fence_writes(self.keeper.lease.fence)
        self.jobs.resume()
        self._set_health(health_pb2.HealthCheckResponse.SERVING)

    def _deposed(self) -> None:
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self._on_deposed()

    def _set_health(self, status) -> None:
        for name in ("",) + SERVICE_NAMES:
            self.server.health_servicer.set(name, status)

    def wait(self) -> None:
        self.server.wait_for_termination()

    def _reap(self) -> None:
        # Expire silent agents even when no call arrives, so their leases go to live agents.
        while not self._stop.wait(min(1.0, self.scheduler.heartbeat_interval_s)):
            self.scheduler.expire_dead_agents()

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
