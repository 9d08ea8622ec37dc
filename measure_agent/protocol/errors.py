"""Protocol errors, mapped to gRPC status codes the same way on both sides.

The server aborts a call with :func:`abort`; the client turns the ``grpc.RpcError`` back into the
same exception class with :func:`from_rpc_error`. Messages are one line, meant for users.
"""

from __future__ import annotations

import grpc


def shown(value: object, chars: int = 60) -> str:
    """``repr(value)`` cut to ``chars``: an error message echoes what a peer sent, never all of it
    (a huge echo would itself break the reply)."""
    text = repr(value)
    return text if len(text) <= chars else text[:chars] + f"... ({len(text)} characters)"


class FleetError(Exception):
    """Base of protocol errors."""

    code = grpc.StatusCode.UNKNOWN


class InvalidRequest(FleetError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(FleetError):
    code = grpc.StatusCode.NOT_FOUND


class VersionMismatch(FleetError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(FleetError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(FleetError):
    code = grpc.StatusCode.UNAVAILABLE


class Busy(FleetError):
    """The daemon is serving as many calls as it allows (of all clients, or of this one)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class TimedOut(FleetError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE = {cls.code: cls for cls in (InvalidRequest, NotFound, VersionMismatch, Unauthenticated, Unavailable, Busy,
                                      TimedOut)}


def abort(context: grpc.ServicerContext, error: FleetError) -> None:
    """End the current call with ``error`` (raises, as ``context.abort`` does)."""
    context.abort(error.code, str(error))


def from_rpc_error(error: grpc.RpcError) -> FleetError:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    cls = _BY_CODE.get(code, FleetError)
    if cls is Unavailable:
        details = f"daemon unreachable ({details})"
    return cls(details or code.name)
