"""Tokens and TLS on the daemon's port; refusals are one-line errors on both sides."""

from __future__ import annotations

import shutil
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from measure_agent.cli import EXIT_REFUSED
from measure_agent.protocol.connection import TlsFiles
from measure_agent.protocol.errors import Unauthenticated
from measure_agent.templates import testing_catalog
from tuner.daemon import Daemon, FleetClient
from tuner.daemon.daemon import Security
from tuner.log import TuningLog

from fleet_helpers import agent_names, start_agent, stop_all, wait_for

pytestmark = pytest.mark.timeout(300)
AGENT_TOKEN = "agent-secret-0123456789abcdef"
CLIENT_TOKEN = "client-secret-0123456789abcdef"


@pytest.fixture()
def secured(tmp_path):
    (tmp_path / "agent.tok").write_text(AGENT_TOKEN + "\n")
    (tmp_path / "client.tok").write_text("# rotation: two tokens accepted\nold-client-token-xxxxxxxx\n" + CLIENT_TOKEN + "\n")
    (tmp_path / "wrong.tok").write_text("not-the-right-token-at-all\n")
    with TuningLog(f"sqlite:///{tmp_path / 'sec.db'}") as log:
        daemon = Daemon(log, "127.0.0.1:0", catalog=testing_catalog(), heartbeat_interval_s=0.3, agent_timeout_s=2,
                        security=Security(agent_tokens=(AGENT_TOKEN,),
                                          client_tokens=("old-client-token-xxxxxxxx", CLIENT_TOKEN))).start()
        try:
            yield daemon, tmp_path
        finally:
            daemon.stop()


def _agent_with_token(address, name, token_file, cache_dir):
    return start_agent(address, "sec", name, cache_dir, extra_args=("--token-file", str(token_file)))


def test_wrong_or_missing_agent_token_is_refused_and_logged(secured, kernel_cache_dir, caplog):
    daemon, tmp = secured
    wrong = _agent_with_token(daemon.address, "intruder", tmp / "wrong.tok", kernel_cache_dir)
    _, err = wrong.communicate(timeout=120)
    assert wrong.returncode == EXIT_REFUSED  # restarting it with the same token cannot help
    assert "refused the agent token" in err and "Traceback" not in err
    missing = start_agent(daemon.address, "sec", "tokenless", kernel_cache_dir)
    _, err = missing.communicate(timeout=120)
    assert missing.returncode == EXIT_REFUSED and "refused the agent token" in err
    assert not agent_names(daemon)
    assert daemon.auth.refused >= 2
    assert any("refused /measure_agent.protocol.v2.AgentService/Connect" in r.getMessage() for r in caplog.records)


def test_right_tokens_work_and_client_token_is_separate(secured, kernel_cache_dir, cli_env):
    daemon, tmp = secured
    agent = _agent_with_token(daemon.address, "friend", tmp / "agent.tok", kernel_cache_dir)
    try:
        wait_for(lambda: agent_names(daemon) == {"friend"}, what="agent with the right token joined")
        with FleetClient(daemon.address, token=CLIENT_TOKEN) as client:
            assert [a.name for a in client.agents().agents] == ["friend"]
        with FleetClient(daemon.address, token=AGENT_TOKEN) as client:  # an agent token is no client token
            with pytest.raises(Unauthenticated, match="refused the client token"):
                client.agents()
        with FleetClient(daemon.address) as client:
            with pytest.raises(Unauthenticated):
                list(client.watch(1))

        def tuner(*args, env=cli_env):
            return subprocess.run([sys.executable, "-m", "tuner", *args, "--tracker", daemon.address],
                                  capture_output=True, text=True, env=env, timeout=120)

        refused = tuner("agents")
        assert refused.returncode == 1
        assert refused.stderr.strip() == "tuner: error: the daemon refused the client token (missing or wrong)"
        by_flag = tuner("agents", "--token-file", str(tmp / "client.tok"))
        assert by_flag.returncode == 0 and "friend" in by_flag.stdout
        by_env = tuner("agents", env=dict(cli_env, TUNEFLEET_TOKEN_FILE=str(tmp / "client.tok")))
        assert by_env.returncode == 0 and "friend" in by_env.stdout
    finally:
        stop_all([agent])


def test_health_service_answers_without_a_token(secured):
    daemon, _ = secured
    with grpc.insecure_channel(daemon.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls_daemon_with_a_trusted_ca(tmp_path, kernel_cache_dir):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    with TuningLog(f"sqlite:///{tmp_path / 'tls.db'}") as log:
        daemon = Daemon(log, "127.0.0.1:0", catalog=testing_catalog(),
                        security=Security(tls_cert=str(cert), tls_key=str(key))).start()
        try:
            with FleetClient(daemon.address, tls=TlsFiles(ca=str(cert))) as client:
                assert list(client.agents().agents) == []
            with FleetClient(daemon.address, timeout_s=5) as plain:  # no TLS: cannot talk to a TLS port
                with pytest.raises(Exception):
                    plain.agents()
            agent = start_agent(daemon.address, "tls", "tls-agent", kernel_cache_dir, extra_args=("--tls-ca", str(cert)))
            try:
                wait_for(lambda: agent_names(daemon) == {"tls-agent"}, what="agent joined over TLS")
            finally:
                stop_all([agent])
        finally:
            daemon.stop()
