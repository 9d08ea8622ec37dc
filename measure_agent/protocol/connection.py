"""Opening channels to the daemon: TLS when configured, and the bearer token sent with every call.

Shared by agents and tuner clients, so both authenticate the same way. Tokens travel in the
``authorization`` metadata (``Bearer <token>``); use TLS on any network you do not trust, or the
token is readable on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

# Requests are small (a workload, a config); anything near this is malformed or hostile.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
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


def open_channel(address: str, tls: TlsFiles | None = None) -> grpc.Channel:
    if tls is not None and tls.enabled:
        if bool(tls.cert) != bool(tls.key):
            raise CredentialsError("a client certificate needs both --tls-cert and --tls-key")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read_pem(tls.ca, "CA certificate"),
            private_key=read_pem(tls.key, "TLS key"),
            certificate_chain=read_pem(tls.cert, "TLS certificate"),
        )
        return grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
