"""The dashboard as one Starlette app: HTML pages (Jinja2 shells that a small script fills and
refreshes) and the JSON API they read (docs/dashboard.md). ``tuner dashboard`` serves it over a
bare log, ``tuner daemon --http-listen`` with the daemon's live state.

Security: reading needs no token; changing anything (cancel) needs a client token whenever the
dashboard has any (``Authorization: Bearer TOKEN``, compared in constant time), and a same-origin
JSON request always, so another web page open in the browser cannot post to it. Tokens are read
on the server only: no page or API answer contains one. Pages allow scripts from the app itself
only (Content-Security-Policy), and every asset ships in the package (no CDN).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from tuner.dashboard.live import CancelRefused, LiveFleet
from tuner.dashboard.readmodel import BadRequest, DashboardReader, NotFound
from tuner.log import TuningLog, TuningLogError

HERE = Path(__file__).parent
LIVE_REFRESH_S = 1.5  # how often live pages poll the API
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


@dataclass(frozen=True)
class DashboardAccess:
    """Who may do what: ``client_tokens`` (empty: no token needed, loopback only) and the host
    names the app answers to (``None``: any; on loopback the CLI passes loopback names so that a
    DNS-rebinding page cannot reach it)."""

    client_tokens: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] | None = None


def create_app(log: TuningLog, *, live: LiveFleet | None = None, catalog=None,
               access: DashboardAccess = DashboardAccess(), models=()) -> Starlette:
    """The dashboard over ``log``; ``live`` is the daemon's state when served by a daemon;
    ``models`` are :class:`tuner.graph.ModelTasks` whose ``tune-model`` runs the model pages show."""
    reader = DashboardReader(log, catalog=catalog, live=live, models=models)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals["refresh_ms"] = int(LIVE_REFRESH_S * 1000)

    def page(name: str, title: str, data: Callable[[Request], Any], live_page: bool = False):
        def endpoint(request: Request) -> Response:
            try:
                payload = data(request)
            except (NotFound, BadRequest, TuningLogError) as exc:
                return templates.TemplateResponse(request, "error.html", {"title": "error", "message": str(exc), "page": "error",
                                                  "data_json": "null", "daemon": live is not None},
                                                  status_code=_status_of(exc))
            return templates.TemplateResponse(request, name, {
                "title": title.format_map(_Blank({**request.query_params, **request.path_params})),
                "page": name.removesuffix(".html"), "data_json": _json_for_script(payload),
                "daemon": live is not None, "live_page": live_page, "tokens_needed": bool(access.client_tokens)})
        return endpoint

    def api(data: Callable[[Request], Any]):
        def endpoint(request: Request) -> Response:
            try:
                return JSONResponse(data(request))
            except (NotFound, BadRequest, TuningLogError) as exc:
                return _error(_status_of(exc), str(exc))
        return endpoint

    def cancel(request: Request) -> Response:
        refusal = _refuse_change(request, access)
        if refusal is not None:
            return refusal
        try:
            return JSONResponse(reader.cancel(_job_id(request)))
        except CancelRefused as exc:
            return _error(409 if live is None else 404, str(exc))
        except BadRequest as exc:
            return _error(400, str(exc))

    routes = [
        Route("/", page("overview.html", "overview", lambda r: reader.overview(), live_page=True)),
        Route("/jobs/{job_id}", page("job.html", "job {job_id}", lambda r: reader.job(_job_id(r)), live_page=True)),
        Route("/workloads", page("workloads.html", "workloads", lambda r: reader.workloads())),
        Route("/workload", page("workload.html", "workload", lambda r: reader.workload(_param(r, "key")))),
        Route("/kernel", page("kernel.html", "kernel", lambda r: _kernel(reader, r))),
        Route("/models", page("models.html", "models", lambda r: reader.model_list())),
        Route("/model", page("model.html", "model {name}", lambda r: _model(reader, r), live_page=True)),
        Route("/agents", page("agents.html", "agents", lambda r: reader.agents(), live_page=True)),
        Route("/api/overview", api(lambda r: reader.overview())),
        Route("/api/jobs", api(lambda r: reader.jobs())),
        Route("/api/jobs/{job_id}", api(lambda r: reader.job(_job_id(r)))),
        Route("/api/jobs/{job_id}/trials", api(lambda r: reader.job_trials(_job_id(r), r.query_params.get("status")))),
        Route("/api/jobs/{job_id}/cancel", cancel, methods=["POST"]),
        Route("/api/workloads", api(lambda r: reader.workloads())),
        Route("/api/workload", api(lambda r: reader.workload(_param(r, "key")))),
        Route("/api/kernel", api(lambda r: _kernel(reader, r))),
        Route("/api/models", api(lambda r: reader.model_list())),
        Route("/api/model", api(lambda r: _model(reader, r))),
        Route("/api/agents", api(lambda r: reader.agents())),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    middleware = []
    if access.allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(access.allowed_hosts)))
    middleware.append(Middleware(SecurityHeaders))
    app = Starlette(routes=routes, middleware=middleware)
    app.state.reader = reader
    return app


class SecurityHeaders:
    """ASGI middleware: every answer forbids foreign scripts, framing, sniffing and caching."""

    HEADERS = [(b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
               (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
               (b"cache-control", b"no-store")]

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in self.HEADERS if k not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


def _refuse_change(request: Request, access: DashboardAccess) -> Response | None:
    """Why a changing request is refused, or ``None``: a same-origin JSON call, with a valid token
    when the dashboard has tokens."""
    from tuner.daemon.security import token_matches

    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        return _error(403, "cross-origin requests may not change anything")
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return _error(415, "send changes as application/json")
    if access.client_tokens:
        presented = request.headers.get("authorization", "")
        if not presented.startswith("Bearer ") or not token_matches(presented[len("Bearer "):],
                                                                     access.client_tokens):
            return _error(401, "this needs a client token (Authorization: Bearer TOKEN); reading needs none")
    return None


def _kernel(reader: DashboardReader, request: Request) -> dict[str, Any]:
    q = request.query_params
    return reader.kernel(_param(request, "workload"), _param(request, "device"), q.get("target", "cpu"),
                         q.get("config", "best"))


class _Blank(dict):
    """Page-title values: a missing parameter leaves a blank, not an error."""

    def __missing__(self, key: str) -> str:
        return ""


def _model(reader: DashboardReader, request: Request) -> dict[str, Any]:
    q = request.query_params
    return reader.model(_param(request, "name"), q.get("device") or None, q.get("target") or None)


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name, "").strip()
    if not value:
        raise BadRequest(f"missing query parameter {name!r}")
    return value


def _job_id(request: Request) -> int:
    text = request.path_params["job_id"]
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise BadRequest(f"a job id is a positive integer, not {text!r}")
    return int(text)


def _status_of(exc: Exception) -> int:
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, BadRequest):
        return 400
    return 503  # the log is away or refuses


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _json_for_script(value: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``</script>`` or comment opener survives."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
