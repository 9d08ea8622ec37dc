"""The daemon's gate: TLS server credentials and bearer-token checks for agents and clients.

Agent calls (``AgentService``) need an agent token and client calls (``ClientService``) a client
token, each from its own file, so a leaked client token cannot join a rogue agent and the reverse.
Health checks stay open. A refused call gets UNAUTHENTICATED and is logged with the peer's address.

Before anything starts, :func:`exposure_policy` decides whether a daemon may listen where it was
asked to: beyond loopback it needs both token files (or an explicit ``--insecure``).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

import grpc

from measure_agent.protocol.connection import CredentialsError, read_pem

logger = logging.getLogger("tunefleet.daemon")

# Agents speak v2 (one stream each); v1's agent service remains to answer agents of that version.
AGENT_SERVICES = ("/measure_agent.protocol.v2.AgentService/", "/measure_agent.protocol.v1.AgentService/")
CLIENT_SERVICE = "/measure_agent.protocol.v1.ClientService/"


def server_credentials(cert: str, key: str, client_ca: str | None = None) -> grpc.ServerCredentials:
    """TLS for the daemon's port; with ``client_ca``, clients must present a certificate it signed."""
    pair = (read_pem(key, "TLS key"), read_pem(cert, "TLS certificate"))
    return grpc.ssl_server_credentials([pair], root_certificates=read_pem(client_ca, "client CA"),
                                       require_client_auth=bool(client_ca))


def check_tls_files(cert: str | None, key: str | None, client_ca: str | None) -> None:
    """Refuse (:class:`CredentialsError`, one line) TLS settings that cannot work, before anything starts."""
    if bool(cert) != bool(key):
        raise CredentialsError("TLS needs both --tls-cert and --tls-key")
    if client_ca and not cert:
        raise CredentialsError("--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked "
                               "only over TLS")
    read_pem(cert, "TLS certificate")
    read_pem(key, "TLS key")
    read_pem(client_ca, "client CA")


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT binds to loopback only: ``localhost``, 127.0.0.0/8 or ::1. Any other name
    counts as beyond loopback, since what it resolves to is not ours to trust."""
    host = address.rpartition(":")[0].strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_policy(listen: str, *, agent_tokens: bool, client_tokens: bool, tls: bool,
                    insecure: bool) -> tuple[str | None, list[str]]:
    """(why the daemon must not start, or ``None``; warnings to log) for listening on ``listen``.

    Loopback is as open as ever: tests and the embedded daemon of ``tuner tune`` use it. Beyond it,
    both token files are required unless ``insecure``, and tokens without TLS draw a warning.
    """
    if is_loopback(listen):
        return None, []
    missing = [flag for flag, given in (("--client-token-file", client_tokens), ("--agent-token-file", agent_tokens))
               if not given]
    if missing and not insecure:
        return (f"refusing to listen on {listen} beyond loopback without {' and '.join(missing)} (anyone who "
                "reaches the port could submit jobs or join as an agent): give both token files "
                "(see docs/security.md), listen on 127.0.0.1, or pass --insecure"), []
    if missing:
        return None, [f"listening on {listen} without {' and '.join(missing)} (--insecure): anyone who reaches "
                      "the port can submit jobs or join as an agent (see docs/security.md)"]
    if not tls:
        return None, [f"listening on {listen} without TLS: the tokens cross the network in clear text; "
                      "add --tls-cert and --tls-key (see docs/security.md)"]
    return None, []


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Refuses agent and client calls without a valid token (when tokens are configured)."""

    def __init__(self, agent_tokens: tuple[str, ...] = (), client_tokens: tuple[str, ...] = ()) -> None:
        self.agent_tokens = agent_tokens
        self.client_tokens = client_tokens
        self.refused = 0

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(AGENT_SERVICES):
            tokens, who = self.agent_tokens, "agent"
        elif method.startswith(CLIENT_SERVICE):
            tokens, who = self.client_tokens, "client"
        else:
            return continuation(handler_call_details)
        if not tokens or _presented_token_ok(handler_call_details.invocation_metadata, tokens):
            return continuation(handler_call_details)
        self.refused += 1
        handler = continuation(handler_call_details)
        return refusing_handler(handler, grpc.StatusCode.UNAUTHENTICATED,
                                f"the daemon refused the {who} token (missing or wrong)", method)


def _presented_token_ok(metadata, tokens: tuple[str, ...]) -> bool:
    presented = next((value for key, value in metadata or () if key == "authorization"), "")
    if not presented.startswith("Bearer "):
        return False
    return token_matches(presented[len("Bearer "):], tokens)


def token_matches(candidate: str, tokens: tuple[str, ...]) -> bool:
    """Whether ``candidate`` is one of ``tokens``, compared in constant time (the daemon's gRPC
    port and the dashboard both check tokens here)."""
    encoded = candidate.encode()
    # compare against every token without stopping early: no timing hint about which one matched
    return any([hmac.compare_digest(encoded, token.encode()) for token in tokens])


def refusing_handler(handler, code: grpc.StatusCode, message: str, method: str, *,
                     trailing_metadata: tuple[tuple[str, str], ...] = (), log: bool = True):
    """A handler of ``handler``'s kind that answers every call with ``code`` and ``message``."""
    def abort(request, context):
        if log:
            logger.warning("refused %s from %s: %s", method, context.peer(), message)
        if trailing_metadata:
            context.set_trailing_metadata(trailing_metadata)
        context.abort(code, message)

    def abort_stream(request, context):
        abort(request, context)
        yield  # pragma: no cover - abort raises

    def abort_bidi(requests, context):
        abort(None, context)
        yield  # pragma: no cover - abort raises

    if handler is None:
        return None
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort_bidi, handler.request_deserializer,
                                                     handler.response_serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort_stream, handler.request_deserializer,
                                                    handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(abort, handler.request_deserializer, handler.response_serializer)
