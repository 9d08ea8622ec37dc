"""Which daemon a client or agent talks to: a leader and its standbys, or one name of several addresses."""

from __future__ import annotations

import socket

import pytest

from measure_agent.protocol import connection
from measure_agent.protocol.connection import TlsFiles, Tracker


@pytest.fixture()
def dns(monkeypatch):
    """Names resolve as the test says (no network)."""
    table: dict[str, list[str]] = {}

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in table:
            raise socket.gaierror(f"unknown {host}")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in table[host]]

    monkeypatch.setattr(connection.socket, "getaddrinfo", getaddrinfo)
    return table


def test_a_list_of_daemons_is_tried_in_turn_and_the_named_leader_is_followed(dns):
    dns.update({"a": ["10.0.0.1"], "b": ["10.0.0.2"]})
    tracker = Tracker("a:9190,b:9190")
    assert tracker.address == "a:9190" and tracker.alternatives
    assert tracker.failover() == "b:9190"
    assert tracker.failover() == "a:9190"  # round and round
    assert tracker.failover("b:9190") == "b:9190"  # the leader a standby named
    assert tracker.failover("b:9190") == "b:9190"
    # a daemon cannot send the client (and its token) anywhere else: an unknown leader means "next"
    assert tracker.failover("evil.example:9190") == "a:9190"
    assert tracker.failover("") == "b:9190"  # a standby while nobody leads: the next one
    tracker.close()


def test_one_name_of_several_addresses_stands_for_each_with_tls_checked_against_the_name(dns, monkeypatch):
    dns["daemons.example"] = ["10.0.0.1", "10.0.0.2", "fd00::3"]
    opened = []
    monkeypatch.setattr(connection, "open_channel",
                        lambda address, tls=None, server_name=None: opened.append((address, server_name)) or
                        _Closable())
    tracker = Tracker("daemons.example:9190", TlsFiles(ca="ca.pem"))
    assert tracker.alternatives
    assert [tracker.address] + [tracker.failover() for _ in range(3)] == [
        "10.0.0.1:9190", "10.0.0.2:9190", "[fd00::3]:9190", "10.0.0.1:9190"]
    assert {name for _, name in opened} == {"daemons.example"}
    assert tracker.failover("10.0.0.2:9190") == "10.0.0.2:9190"  # a leader among the name's addresses
    dns["daemons.example"] = ["10.0.0.9"]  # the name moved: resolved again at each failover
    assert tracker.failover() == "daemons.example:9190"


def test_one_daemon_is_one_daemon(dns):
    dns["solo"] = ["10.0.0.1"]
    tracker = Tracker("solo:9190")
    assert not tracker.alternatives and tracker.failover() == "solo:9190"
    unresolvable = Tracker("nowhere.invalid:9190")  # gRPC reports it when it dials
    assert unresolvable.address == "nowhere.invalid:9190"


class _Closable:
    def close(self) -> None:
        pass
