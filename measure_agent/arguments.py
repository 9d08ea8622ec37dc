"""argparse types of the ``measure-agent`` and ``tuner`` command lines (tuner reuses these: the agent
must not import tuner). Each rejects bad input up front with one message naming what it accepts,
instead of a traceback from protobuf, SQLite or gRPC later on."""

from __future__ import annotations

import argparse
import math
from typing import Callable

INT32_MAX = 2**31 - 1  # protobuf int32 fields: trials, priority, early stopping, timing counts, parallel
INT32_MIN = -(2**31)
INT64_MAX = 2**63 - 1  # protobuf int64 fields and SQLite INTEGER: job ids, seeds
MAX_PORT = 65535


def int_range(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high}, not {text!r}")
        return value

    return parse


def _finite_number(text: str, accepts: Callable[[float], bool], bound: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and accepts(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, not {text!r}")
    return value


def positive_float(text: str) -> float:
    return _finite_number(text, lambda value: value > 0, "> 0")


def non_negative_float(text: str) -> float:
    return _finite_number(text, lambda value: value >= 0, ">= 0")


def share_fraction(text: str) -> float:
    """A share of something: a number from 0 up to, not including, 1."""
    return _finite_number(text, lambda value: 0 <= value < 1, "in [0, 1)")


def host_port_type(lowest_port: int) -> Callable[[str], str]:
    """An argparse type: HOST:PORT (an IPv6 host in brackets, [::1]:9190) with PORT from ``lowest_port``
    to 65535; 1 for addresses to connect to, 0 for addresses to bind (any free port)."""

    def parse(text: str) -> str:
        if not _is_host_port(text, lowest_port):
            raise argparse.ArgumentTypeError(f"expected HOST:PORT with PORT {lowest_port}-{MAX_PORT}, not {text!r}")
        return text

    return parse


MAX_TRACKER_ADDRESSES = 16


def tracker_type(text: str) -> str:
    """An argparse type: the daemons of a tune-cluster, ``HOST:PORT[,HOST:PORT...]`` (a leader and
    its standbys; a HOST may also be a DNS name of several addresses). Kept as given (see
    :class:`measure_agent.protocol.connection.Tracker`)."""
    parts = text.split(",")
    if len(parts) > MAX_TRACKER_ADDRESSES:
        raise argparse.ArgumentTypeError(f"at most {MAX_TRACKER_ADDRESSES} daemon addresses, not {len(parts)}")
    bad = next((p for p in parts if not _is_host_port(p, 1)), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT[,HOST:PORT...] with PORT 1-{MAX_PORT}, not {bad!r}")
    return text


def _is_host_port(text: str, lowest_port: int) -> bool:
    host, _, port = text.rpartition(":")
    if host.startswith("["):
        host_ok = host.endswith("]") and len(host) > 2 and "[" not in host[1:-1]
    else:
        host_ok = bool(host) and ":" not in host and "]" not in host
    port_ok = port.isascii() and port.isdigit() and len(port) <= 5 and lowest_port <= int(port) <= MAX_PORT
    return host_ok and port_ok and not any(c.isspace() for c in text)


def device_key_type(text: str) -> str:
    """An argparse type: a device key (:func:`measure_agent.device.check_device_key`)."""
    from measure_agent.device import DeviceKeyError, check_device_key

    try:
        return check_device_key(text)
    except DeviceKeyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
