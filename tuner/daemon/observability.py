"""What operators see: Prometheus metrics over HTTP and structured (JSON) logs."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from measure_agent.engine import MeasureStatus

if TYPE_CHECKING:
    from tuner.daemon.daemon import Daemon

JOB_STATES = ("queued", "running", "done", "failed", "cancelled", "interrupted")


def render_metrics(daemon: "Daemon") -> str:
    """The daemon's state in the Prometheus text exposition format (names prefixed ``tunefleet_``)."""
    scheduler = daemon.scheduler
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP tunefleet_{name} {help_text}")
        lines.append(f"# TYPE tunefleet_{name} {kind}")
        for labels, value in samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            lines.append(f"tunefleet_{name}{{{text}}} {value:g}" if text else f"tunefleet_{name} {value:g}")

    jobs = daemon.jobs.list()
    metric("jobs", "gauge", "Jobs known to this daemon run, by state.",
           [({"state": s}, sum(1 for j in jobs if j.state == s)) for s in JOB_STATES])
    metric("trials_total", "counter", "Measurement results accepted from agents.",
           [({}, sum(scheduler.results_by_status.values()))])
    metric("trials_per_second", "gauge", "Results accepted per second over the last minute.",
           [({}, scheduler.results_per_second())])
    metric("measurement_errors_total", "counter", "Failed measurements by status.",
           [({"status": s.value}, scheduler.results_by_status.get(s.value, 0)) for s in MeasureStatus if not s.is_ok])
    agents = scheduler.agents()
    keys = sorted({a.key for a in agents})
    metric("agents", "gauge", "Live agents per device key.", [({"key": k}, sum(1 for a in agents if a.key == k)) for k in keys])
    metric("busy_agents", "gauge", "Agents holding leases, per device key.",
           [({"key": k}, sum(1 for a in agents if a.key == k and a.leases)) for k in keys])
    all_keys = sorted(set(scheduler.device_keys()) | {j.device_key for j in jobs if not j.finished})
    queued = [({"key": k}, scheduler.key_counts(k)[0]) for k in all_keys]
    metric("queued_candidates", "gauge", "Candidates waiting for an agent, per device key.", queued)
    metric("lease_expiries_total", "counter", "Leases taken back from agents presumed dead.",
           [({}, scheduler.expired_leases)])
    metric("refused_calls_total", "counter", "Calls refused for a missing or wrong token.", [({}, daemon.auth.refused)])
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsServer:
    """Serves ``/metrics`` (and ``/healthz``) on its own port, in a thread."""

    def __init__(self, address: str, daemon: "Daemon") -> None:
        host, _, port = address.rpartition(":")
        daemon_ref = daemon

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] == "/metrics":
                    body, kind = render_metrics(daemon_ref).encode(), "text/plain; version=0.0.4"
                elif self.path == "/healthz":
                    body, kind = b"ok\n", "text/plain"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # scrapes every few seconds: keep the log quiet
                pass

        self._server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), Handler)
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
