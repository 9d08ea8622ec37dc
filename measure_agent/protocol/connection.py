"""Opening channels to the daemon: TLS when configured, and the bearer token sent with every call.

Shared by agents and tuner clients, so both authenticate the same way. Tokens travel in the
``authorization`` metadata (``Bearer <token>``); use TLS on any network you do not trust, or the
token is readable on the wire.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

# Requests are small (a workload, a config); anything near this is malformed or hostile.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # No HTTP/2 bandwidth-delay probing, on either end: messages here are a few hundred bytes, and
    # each side's probes are pings the other side answers. With 1000 light agents at 1 s the
    # agents' probes cost the daemon's gRPC threads 0.067 ms per candidate, 0.032 without them
    # (its own probes, off since, another 0.05).
    ("grpc.http2.bdp_probe", 0),
]


class CredentialsError(ValueError):
    """A token or certificate file that cannot be used (one-line message)."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: ``ca`` to trust the daemon; ``cert`` and ``key`` when the daemon wants client certificates."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert)


def read_pem(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CredentialsError(f"cannot read {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN" not in data:
        raise CredentialsError(f"{what} {path} is not a PEM file")
    return data


def read_tokens(path: str) -> tuple[str, ...]:
    """Tokens in a file, one per line (several allow rotation); blank lines and # comments ignored."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CredentialsError(f"cannot read token file {path}: {exc.strerror}") from None
    tokens = tuple(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))
    if not tokens:
        raise CredentialsError(f"token file {path} holds no token")
    if any(len(t) < 16 for t in tokens):
        raise CredentialsError(f"token in {path} is shorter than 16 characters")
    return tokens


def open_channel(address: str, tls: TlsFiles | None = None, server_name: str | None = None) -> grpc.Channel:
    """A channel to ``address``; ``server_name``: the name its TLS certificate must carry when
    ``address`` is one of the IP addresses a DNS name resolved to."""
    if tls is not None and tls.enabled:
        if bool(tls.cert) != bool(tls.key):
            raise CredentialsError("a client certificate needs both --tls-cert and --tls-key")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read_pem(tls.ca, "CA certificate"),
            private_key=read_pem(tls.key, "TLS key"),
            certificate_chain=read_pem(tls.cert, "TLS certificate"),
        )
        options = CHANNEL_OPTIONS + ([("grpc.ssl_target_name_override", server_name)] if server_name else [])
        return grpc.secure_channel(address, credentials, options=options)
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


# A standby daemon names the leader in this trailing metadata of its UNAVAILABLE answers.
LEADER_METADATA_KEY = "tunefleet-leader"


def leader_hint(error: grpc.RpcError) -> str | None:
    """The leader's address a standby daemon named in its refusal: ``""`` while no daemon leads,
    ``None`` when the answer is not a standby's."""
    try:
        metadata = error.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - errors raised before any answer carry no metadata
        return None
    return next((value for key, value in metadata if key == LEADER_METADATA_KEY and isinstance(value, str)), None)


class Tracker:
    """The daemons of a tune-cluster as a client or agent knows them, and a channel to one of them.

    ``spec`` is ``HOST:PORT[,HOST:PORT...]``: a leader and its standbys. A HOST that resolves to
    several addresses (one DNS name for every daemon) stands for each of them, tried in turn with
    TLS checked against the name. :meth:`failover` moves to the leader a standby named, when it is
    one of these daemons (a daemon cannot send agents and their tokens elsewhere), else to the next.
    """

    def __init__(self, spec: str, tls: TlsFiles | None = None) -> None:
        self.spec = spec
        self._given = tuple(part.strip() for part in spec.split(",") if part.strip()) or (spec,)
        self._tls = tls
        self._lock = threading.Lock()
        self._endpoints = self._resolve()
        self._index = 0
        self.channel = self._open(self._endpoints[0])

    @property
    def address(self) -> str:
        """The daemon the channel goes to."""
        return self._endpoints[self._index].target

    @property
    def alternatives(self) -> bool:
        """Whether there is another daemon to fail over to."""
        return len(self._endpoints) > 1 or len(self._given) > 1

    def failover(self, leader: str | None = None) -> str:
        """Close the channel and open one to ``leader`` (when it is one of the tracker's daemons) or
        else to the next daemon in turn; the new address. Names are resolved again, since where a
        DNS name points may have changed."""
        with self._lock:
            current = self.address
            self._endpoints = self._resolve()
            targets = [e.target for e in self._endpoints]
            if leader in targets:
                self._index = targets.index(leader)
            elif leader in self._given:
                self._index = next(i for i, e in enumerate(self._endpoints) if e.given == leader)
            else:
                self._index = (targets.index(current) + 1) % len(targets) if current in targets else 0
            old, self.channel = self.channel, self._open(self._endpoints[self._index])
        old.close()
        return self.address

    def close(self) -> None:
        self.channel.close()

    def _open(self, endpoint: "_Endpoint") -> grpc.Channel:
        return open_channel(endpoint.target, self._tls, endpoint.server_name)

    def _resolve(self) -> list["_Endpoint"]:
        endpoints: list[_Endpoint] = []
        for given in self._given:
            host, _, port = given.rpartition(":")
            name = host.strip("[]")
            addresses = [] if _is_ip(name) else _addresses_of(name, port)
            if len(addresses) > 1:
                endpoints += [_Endpoint(_join(address, port), name, given) for address in addresses]
            else:
                endpoints.append(_Endpoint(given, None, given))  # one address (or none now): gRPC resolves it
        return list(dict.fromkeys(endpoints))


@dataclass(frozen=True)
class _Endpoint:
    target: str  # what to dial
    server_name: str | None  # the name TLS checks when ``target`` is one of its IP addresses
    given: str  # the tracker address it comes from


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _addresses_of(host: str, port: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return []
    return list(dict.fromkeys(info[4][0] for info in infos))


def _join(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
