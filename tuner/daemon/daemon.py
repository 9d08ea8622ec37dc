"""The tune-cluster daemon: scheduler, job manager and gRPC server on one port."""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from measure_agent.protocol.connection import CHANNEL_OPTIONS
from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc
from measure_agent.templates import TemplateCatalog, default_catalog
from tuner.daemon.fleet_state import DaemonFleetState
from tuner.daemon.jobs import JobManager
from tuner.daemon.limits import SERVER_THREADS, ClientCallInterceptor, ClientCallLimiter
from tuner.daemon.scheduler import Scheduler
from tuner.daemon.security import TokenAuthInterceptor, server_credentials
from tuner.daemon.service import AgentService, ClientService
from tuner.log import TuningLog

logger = logging.getLogger("tunefleet.daemon")

GRPC_OPTIONS = CHANNEL_OPTIONS
SERVICE_NAMES = ("measure_agent.protocol.v1.AgentService", "measure_agent.protocol.v1.ClientService")


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
                  client_calls: ClientCallLimiter | None = None) -> tuple[grpc.Server, int, TokenAuthInterceptor]:
    """A ready (not started) gRPC server bound to ``address`` (port 0 picks a free port), with the
    health service and, when configured, TLS and token checks. Client calls are held to
    ``client_calls`` (default: the limits of :mod:`tuner.daemon.limits`), so that clients never
    take the threads agents need."""
    interceptor = TokenAuthInterceptor(security.agent_tokens, security.client_tokens)
    limiter = ClientCallInterceptor(client_calls or ClientCallLimiter())
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tunefleet-rpc"),
                         options=GRPC_OPTIONS, interceptors=[interceptor, limiter])
    pb_grpc.add_AgentServiceServicer_to_server(agent_service, server)
    pb_grpc.add_ClientServiceServicer_to_server(client_service, server)
    health_servicer = health.HealthServicer()
    for name in ("",) + SERVICE_NAMES:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if security.tls_cert or security.tls_key:
        if not (security.tls_cert and security.tls_key):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        port = server.add_secure_port(
            address, server_credentials(security.tls_cert, security.tls_key, security.tls_client_ca))
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    server.health_servicer = health_servicer  # type: ignore[attr-defined]
    return server, port, interceptor


class Daemon:
    """Everything a daemon runs; ``start()`` then ``stop()`` (also a context manager)."""

    def __init__(self, log: TuningLog, listen: str = "127.0.0.1:0", catalog: TemplateCatalog | None = None,
                 heartbeat_interval_s: float = 2.0, agent_timeout_s: float = 10.0,
                 security: Security = Security()) -> None:
        self.log = log
        self.catalog = catalog or default_catalog()
        self.scheduler = Scheduler(heartbeat_interval_s, agent_timeout_s)
        self.jobs = JobManager(self.scheduler, log, self.catalog)
        self.fleet_state = DaemonFleetState(self.scheduler, self.jobs)  # the dashboard's live view
        self.server, self.port, self.auth = create_server(
            listen, AgentService(self.scheduler, self.catalog), ClientService(self.jobs, self.scheduler, self.catalog),
            security,
        )
        host = listen.rsplit(":", 1)[0] or "127.0.0.1"
        self.address = f"{host}:{self.port}"
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="tunefleet-reaper", daemon=True)

    def start(self) -> "Daemon":
        self.server.start()
        self._reaper.start()
        self.jobs.resume()  # jobs a stopped or killed daemon left running
        logger.info("daemon listening on %s (templates %s)", self.address, self.catalog.version)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking calls, stop running jobs (their results are in the log), close."""
        self.server.health_servicer.enter_graceful_shutdown()
        self._stop.set()
        self.jobs.shutdown()
        self.server.stop(grace_s).wait()

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
