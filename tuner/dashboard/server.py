"""Serving the dashboard: uvicorn in a background thread, with TLS when given, stopped gracefully."""

from __future__ import annotations

import threading
import time

DEFAULT_LISTEN = "127.0.0.1:8080"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class DashboardServer:
    """``start()`` binds ``listen`` (port 0 picks one; :attr:`port` says which) and serves ``app``
    from a thread; ``stop()`` lets open requests finish and ends it."""

    def __init__(self, app, listen: str = DEFAULT_LISTEN, *, tls_cert: str | None = None,
                 tls_key: str | None = None) -> None:
        import uvicorn

        host, _, port = listen.rpartition(":")
        self.host = host.strip("[]") or "127.0.0.1"
        config = uvicorn.Config(app, host=self.host, port=int(port), log_level="warning", access_log=False,
                                ssl_certfile=tls_cert, ssl_keyfile=tls_key, lifespan="off",
                                timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # the command line owns the signals
        self._thread = threading.Thread(target=self._server.run, name="tunefleet-dashboard", daemon=True)
        self.scheme = "https" if tls_cert else "http"

    def start(self, timeout_s: float = 10.0) -> "DashboardServer":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise OSError(f"cannot listen on {self.host}:{self._server.config.port}")
            if time.monotonic() > deadline:
                raise OSError("the dashboard did not start in time")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        sockets = [s for server in self._server.servers for s in server.sockets]
        return sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
