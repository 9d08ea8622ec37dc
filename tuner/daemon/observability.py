"""What operators see: Prometheus metrics over HTTP and structured (JSON) logs.

Exposition is prometheus_client's. Each :class:`~tuner.daemon.daemon.Daemon` has its own
:class:`DaemonMetrics` registry (not the library's global one), so several daemons in one process
(tests, the embedded fleet) never share or clash. It holds three kinds of metrics:

- gauges and counters read from the daemon's state at scrape time (:class:`DaemonStateCollector`):
  jobs by state, agents, queues, accepted results, failures, lease expiries, refused calls;
- histograms observed as results arrive in the scheduler: compile time, kernel run time (best of
  the repeats) and lease-to-result latency, per device key;
- the library's process, platform and garbage-collector metrics (``process_*``, ``python_*``).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, GCCollector, Histogram, PlatformCollector, ProcessCollector
from prometheus_client import generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from measure_agent.engine import MeasureResult, MeasureStatus

if TYPE_CHECKING:
    from tuner.daemon.daemon import Daemon

JOB_STATES = ("queued", "running", "done", "failed", "cancelled", "interrupted")

# Bucket bounds in seconds. Compiling a numba kernel takes from tens of milliseconds (cache hit)
# to minutes (large CUDA tiles); kernels run from microseconds to seconds; a lease waits behind
# the agent's current batch, so its latency reaches the lease deadline (minutes).
COMPILE_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
KERNEL_RUN_BUCKETS_S = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1, 3, 10)
LEASE_TO_RESULT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class DaemonMetrics:
    """One daemon's metrics registry and the histograms it observes; :meth:`watch` adds the
    daemon's state. ``observe_result`` is safe from any thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.compile_seconds = Histogram(
            "tunefleet_compile_seconds", "Compile time agents reported, per accepted result.",
            ["key"], buckets=COMPILE_BUCKETS_S, registry=self.registry)
        self.kernel_run_seconds = Histogram(
            "tunefleet_kernel_run_seconds", "Kernel time per call (best of the repeats) of correct results.",
            ["key"], buckets=KERNEL_RUN_BUCKETS_S, registry=self.registry)
        self.lease_to_result_seconds = Histogram(
            "tunefleet_lease_to_result_seconds", "From a candidate's lease to its accepted result.",
            ["key"], buckets=LEASE_TO_RESULT_BUCKETS_S, registry=self.registry)
        ProcessCollector(registry=self.registry)  # process_*: CPU, memory, open files (Linux)
        PlatformCollector(registry=self.registry)  # python_info
        GCCollector(registry=self.registry)  # python_gc_*
        self._by_key: dict[str, tuple] = {}

    def observe_result(self, key: str, result: MeasureResult, lease_to_result_s: float) -> None:
        """Record one accepted result of device key ``key``."""
        lease_to_result, compile_seconds, kernel_run = self._histograms_of(key)
        lease_to_result.observe(max(0.0, lease_to_result_s))
        if result.compile_time_s > 0:  # 0: failed before compiling, or a testing kernel
            compile_seconds.observe(result.compile_time_s)
        min_s = result.min_s
        if min_s is not None:
            kernel_run.observe(min_s)

    def _histograms_of(self, key: str) -> tuple:
        """The key's labelled histograms, looked up once per key (``labels`` costs more than an
        observation, and every accepted result observes them)."""
        histograms = self._by_key.get(key)
        if histograms is None:
            histograms = (self.lease_to_result_seconds.labels(key), self.compile_seconds.labels(key),
                          self.kernel_run_seconds.labels(key))
            self._by_key[key] = histograms  # a race only builds the same children twice
        return histograms

    def watch(self, daemon: "Daemon") -> None:
        """Export ``daemon``'s state (read at every scrape)."""
        self.registry.register(DaemonStateCollector(daemon))

    def exposition(self) -> bytes:
        """Everything in the Prometheus text format."""
        return generate_latest(self.registry)


class DaemonStateCollector(Collector):
    """The daemon's jobs, agents, queues and counters, read from its state at each scrape."""

    def __init__(self, daemon: "Daemon") -> None:
        self._daemon = daemon

    def collect(self) -> Iterator[Metric]:
        daemon, scheduler = self._daemon, self._daemon.scheduler
        jobs = daemon.jobs.list()
        yield _gauge("jobs", "Jobs known to this daemon run, by state.", "state",
                     [(s, sum(1 for j in jobs if j.state == s)) for s in JOB_STATES])
        yield _counter("trials", "Measurement results accepted from agents.", sum(scheduler.results_by_status.values()))
        yield _gauge("trials_per_second", "Results accepted per second over the last minute.", None,
                     [(None, scheduler.results_per_second())])
        errors = CounterMetricFamily("tunefleet_measurement_errors", "Failed measurements by status.", labels=["status"])
        for status in MeasureStatus:
            if not status.is_ok:
                errors.add_metric([status.value], scheduler.results_by_status.get(status.value, 0))
        yield errors
        agents = scheduler.agents()
        keys = sorted({a.key for a in agents})
        yield _gauge("agents", "Live agents per device key.", "key",
                     [(k, sum(1 for a in agents if a.key == k)) for k in keys])
        yield _gauge("busy_agents", "Agents holding leases, per device key.", "key",
                     [(k, sum(1 for a in agents if a.key == k and a.leases)) for k in keys])
        all_keys = sorted(set(scheduler.device_keys()) | {j.device_key for j in jobs if not j.finished})
        yield _gauge("queued_candidates", "Candidates waiting for an agent, per device key.", "key",
                     [(k, scheduler.key_counts(k)[0]) for k in all_keys])
        yield _counter("lease_expiries", "Leases taken back from agents presumed dead or overdue.",
                       scheduler.expired_leases)
        yield _counter("refused_calls", "Calls refused for a missing or wrong token.", daemon.auth.refused)
        yield _gauge("leader", "1 while this daemon leads the tune-cluster (a single daemon always does), "
                     "0 while it stands by.", None, [(None, 1.0 if daemon.leading else 0.0)])
        yield _gauge("leader_epoch", "The epoch of this daemon's leadership lease (0: a single daemon or a standby).",
                     None, [(None, float(daemon.gate.epoch if daemon.leading else 0))])


def _gauge(name: str, help_text: str, label: str | None, samples: list[tuple[str | None, float]]) -> Metric:
    family = GaugeMetricFamily(f"tunefleet_{name}", help_text, labels=[label] if label else None)
    for value_label, value in samples:
        family.add_metric([value_label] if label else [], value)
    return family


def _counter(name: str, help_text: str, value: float) -> Metric:
    return CounterMetricFamily(f"tunefleet_{name}", help_text, value=value)  # exposed as tunefleet_NAME_total


def render_metrics(daemon: "Daemon") -> str:
    """The daemon's metrics in the Prometheus text exposition format (names prefixed ``tunefleet_``)."""
    return daemon.metrics.exposition().decode()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # scraped every few seconds: keep the log quiet
        pass


class MetricsServer:
    """Serves ``/metrics`` (prometheus_client's WSGI app: text or OpenMetrics, gzip when asked),
    ``/healthz`` (200 while the process serves: liveness) and ``/readyz`` (200 while this daemon leads,
    503 while it stands by: readiness, since the daemon's TLS port cannot be probed by Kubernetes'
    plain gRPC probe) on its own port, in a thread."""

    def __init__(self, address: str, daemon: "Daemon") -> None:
        host, _, port = address.rpartition(":")
        metrics_app = make_wsgi_app(daemon.metrics.registry)

        def app(environ, start_response):
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return metrics_app(environ, start_response)
            if path == "/healthz":
                start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "3")])
                return [b"ok\n"]
            if path == "/readyz":
                body = b"leader\n" if daemon.leading else b"standby\n"
                start_response("200 OK" if daemon.leading else "503 Service Unavailable",
                               [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
                return [body]
            start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", "10")])
            return [b"not found\n"]

        host = host.strip("[]") or "0.0.0.0"

        class Server(ThreadingWSGIServer):
            address_family = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        self._server = make_server(host, int(port), app, Server, handler_class=_QuietHandler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="tunefleet-metrics", daemon=True)

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, sort_keys=True)
