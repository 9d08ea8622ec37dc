"""Secure by default: ``tuner daemon`` beyond loopback needs both token files (or ``--insecure``) and
warns without TLS; loopback stays open. The tuning log's directory is created only at its default
location, and a database server's password can come from a file instead of the URL."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url

from fleet_helpers import free_port
from tuner import settings
from tuner.cli import main as tuner_main
from tuner.daemon.security import exposure_policy, is_loopback
from tuner.log.database import redact

pytestmark = pytest.mark.timeout(120)
TOKEN = "a-token-of-at-least-16-characters"
BOTH_TOKENS = dict(agent_tokens=True, client_tokens=True)


# -- the rule ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1:9190", True), ("127.8.9.10:0", True), ("localhost:9190", True), ("LOCALHOST:1", True),
    ("[::1]:9190", True),
    ("0.0.0.0:9190", False), ("[::]:9190", False), ("10.0.0.1:9190", False), ("192.168.1.2:0", False),
    ("tuner.example.internal:9190", False), ("localhost.example:9190", False), ("[::ffff:10.0.0.1]:1", False),
])
def test_what_counts_as_loopback(address, loopback):
    assert is_loopback(address) is loopback


def test_exposure_policy():
    assert exposure_policy("127.0.0.1:9190", agent_tokens=False, client_tokens=False, tls=False,
                           insecure=False) == (None, [])
    refusal, warnings = exposure_policy("0.0.0.0:9190", agent_tokens=False, client_tokens=False, tls=True,
                                        insecure=False)
    assert "--client-token-file and --agent-token-file" in refusal and "--insecure" in refusal and not warnings
    refusal, _ = exposure_policy("0.0.0.0:9190", agent_tokens=True, client_tokens=False, tls=True, insecure=False)
    assert "without --client-token-file (" in refusal
    refusal, [warning] = exposure_policy("0.0.0.0:9190", agent_tokens=False, client_tokens=True, tls=True,
                                         insecure=True)
    assert refusal is None and "without --agent-token-file (--insecure)" in warning
    refusal, [warning] = exposure_policy("10.0.0.1:9190", **BOTH_TOKENS, tls=False, insecure=False)
    assert refusal is None and "clear text" in warning
    assert exposure_policy("10.0.0.1:9190", **BOTH_TOKENS, tls=True, insecure=False) == (None, [])


# -- the daemon's command line -------------------------------------------------------------------------
@pytest.fixture()
def token_files(tmp_path) -> dict[str, str]:
    """Token flag -> a valid token file."""
    files = {}
    for flag in ("--agent-token-file", "--client-token-file"):
        path = tmp_path / flag.strip("-")
        path.write_text(TOKEN + "\n")
        files[flag] = str(path)
    return files


def with_files(token_files: dict[str, str], *flags: str) -> list[str]:
    return [arg for flag in flags for arg in (flag, token_files[flag])]


def daemon_command(tmp_path, *args) -> list[str]:
    return [sys.executable, "-m", "tuner", "daemon", "--templates", "testing", "--db", str(tmp_path / "d.db"), *args]


@pytest.mark.parametrize("given, missing", [
    ((), "--client-token-file and --agent-token-file"),
    (("--agent-token-file",), "--client-token-file"),
    (("--client-token-file",), "--agent-token-file"),
])
def test_daemon_beyond_loopback_without_both_tokens_refuses_to_start(tmp_path, cli_env, token_files, given,
                                                                      missing):
    listen = f"0.0.0.0:{free_port()}"
    proc = subprocess.run(daemon_command(tmp_path, "--listen", listen, *with_files(token_files, *given)),
                          capture_output=True, text=True, env=cli_env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"tuner: error: refusing to listen on {listen} beyond loopback without {missing} (")
    assert "--insecure" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "d.db").exists(), "a refused daemon opens no log"


def start_and_stop(command: list[str], env) -> str:
    """Start a daemon, wait until it listens, stop it; its stderr."""
    daemon = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = daemon.stdout.readline()
        assert "tunefleet daemon listening on" in line, daemon.stderr.read() if daemon.poll() is not None else line
    finally:
        daemon.terminate()
        _, err = daemon.communicate(timeout=30)
    return err


BOTH = ("--agent-token-file", "--client-token-file")


@pytest.mark.parametrize("host, tokens, extra, warning", [
    ("0.0.0.0", (), ("--insecure",), "without --client-token-file and --agent-token-file (--insecure)"),
    ("0.0.0.0", BOTH, (), "without TLS: the tokens cross the network in clear text"),
    ("127.0.0.1", (), (), None),            # loopback: as easy as ever, and nothing to warn about
    ("localhost", BOTH, (), None),
])
def test_daemon_starts_and_warns_in_one_line(tmp_path, cli_env, token_files, host, tokens, extra, warning):
    listen = f"{host}:{free_port()}"
    err = start_and_stop(daemon_command(tmp_path, "--listen", listen, *with_files(token_files, *tokens), *extra),
                         cli_env)
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    if warning is None:
        assert warnings == [], err
    else:
        [line] = warnings
        assert f"listening on {listen} {warning}" in line


@pytest.mark.parametrize("args, message", [
    (("--tls-cert", "cert.pem"), "TLS needs both --tls-cert and --tls-key"),
    (("--tls-client-ca", "ca.pem"), "--tls-client-ca needs --tls-cert and --tls-key"),
    (("--tls-cert", "missing.pem", "--tls-key", "missing.pem"), "cannot read TLS certificate missing.pem"),
])
def test_tls_settings_that_cannot_work_are_refused_before_starting(tmp_path, cli_env, args, message):
    proc = subprocess.run(daemon_command(tmp_path, "--listen", "127.0.0.1:0", *args), capture_output=True, text=True,
                          env=cli_env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"tuner: error: {message}") and len(proc.stderr.strip().splitlines()) == 1


# -- where the tuning log may be created ------------------------------------------------------------------
@pytest.fixture()
def clean_env(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(settings.DB_ENV_VAR, raising=False)
    monkeypatch.delenv(settings.DB_PASSWORD_FILE_ENV_VAR, raising=False)
    return monkeypatch


def test_only_the_default_log_directory_is_created(clean_env, tmp_path):
    assert settings.resolve_db_url(None) == f"sqlite:///{tmp_path / 'xdg' / 'tunefleet' / 'tuning.db'}"
    assert (tmp_path / "xdg" / "tunefleet").is_dir()

    missing = tmp_path / "no" / "such"
    for explicit in (str(missing / "x.db"), f"sqlite:///{missing / 'x.db'}"):
        with pytest.raises(settings.SettingsError, match=f"^no directory {missing} for the tuning log: create it"):
            settings.resolve_db_url(explicit)
    clean_env.setenv(settings.DB_ENV_VAR, str(missing / "env.db"))
    with pytest.raises(settings.SettingsError, match=f"no directory {missing} "):
        settings.resolve_db_url(None)
    assert not (tmp_path / "no").exists()

    # Readers (tuner.best_kernel, tuner best) neither create nor refuse: opening the log says what is missing.
    assert settings.resolve_db_url(None, create_directory=False) == f"sqlite:///{missing / 'env.db'}"
    assert not (tmp_path / "no").exists()

    # An explicit file in an existing directory is fine, relative paths included.
    clean_env.chdir(tmp_path)
    assert settings.resolve_db_url("here.db") == f"sqlite:///{tmp_path / 'here.db'}"
    clean_env.setenv(settings.DB_ENV_VAR, str(tmp_path / "env.db"))
    assert settings.resolve_db_url(None) == f"sqlite:///{tmp_path / 'env.db'}"


def test_commands_refuse_a_log_in_a_missing_directory(clean_env, tmp_path, capsys, cli_env):
    missing = tmp_path / "typo"
    db = f"sqlite:///{missing / 'x.db'}"
    expected = f"tuner: error: no directory {missing} for the tuning log"
    for argv in (["db", "upgrade", "--db", db],
                 ["tune", "--workload", "matmul(M=4,N=4,K=4)", "--trials", "1", "--db", db]):
        assert tuner_main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith(expected) and len(err.strip().splitlines()) == 1, (argv, err)
    proc = subprocess.run(daemon_command(tmp_path, "--listen", "127.0.0.1:0", "--db", db), capture_output=True,
                          text=True, env=cli_env, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith(expected), proc.stderr
    assert not missing.exists()


# -- a database password from a file -------------------------------------------------------------------------
SERVER = "postgresql+psycopg://tuner@db.example:5432/tunefleet"


def test_password_file_fills_in_a_server_urls_password(clean_env, tmp_path):
    secret = tmp_path / "postgres-password"
    secret.write_text("p@ss/w:rd%\n")  # what a URL cannot hold as is
    url = settings.resolve_db_url(SERVER, password_file=str(secret))
    assert make_url(url).password == "p@ss/w:rd%"
    assert make_url(url).host == "db.example" and make_url(url).username == "tuner"
    assert redact(url) == "postgresql+psycopg://tuner:***@db.example:5432/tunefleet"  # what error messages show

    clean_env.setenv(settings.DB_PASSWORD_FILE_ENV_VAR, str(secret))
    assert make_url(settings.resolve_db_url(SERVER)).password == "p@ss/w:rd%"
    # From the environment it is for server URLs without a password: others are left alone.
    with_password = "postgresql+psycopg://tuner:other@db.example/tunefleet"
    assert settings.resolve_db_url(with_password) == with_password
    assert settings.resolve_db_url(str(tmp_path / "local.db")) == f"sqlite:///{tmp_path / 'local.db'}"
    # Resolving a resolved URL again changes nothing (the daemon does, through the CLI's open_log).
    assert settings.resolve_db_url(url) == url


@pytest.mark.parametrize("content, url, message", [
    (None, SERVER, "cannot read the database password file"),
    ("", SERVER, "is empty"),
    ("x", "postgresql+psycopg://tuner:pw@db/tunefleet", "does not apply to the tuning log's URL: it has a password"),
    ("x", "sqlite:///:memory:", "does not apply to the tuning log's URL: it is not a database server URL"),
])
def test_password_file_problems_are_one_line(clean_env, tmp_path, content, url, message):
    secret = tmp_path / "pw"
    if content is not None:
        secret.write_text(content)
    with pytest.raises(settings.SettingsError, match=message):
        settings.resolve_db_url(url, password_file=str(secret))


def test_daemon_db_password_file_is_refused_for_sqlite(tmp_path, cli_env):
    (tmp_path / "pw").write_text("secret\n")
    proc = subprocess.run(daemon_command(tmp_path, "--listen", "127.0.0.1:0", "--db-password-file",
                                         str(tmp_path / "pw")), capture_output=True, text=True, env=cli_env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("tuner: error: --db-password-file does not apply to the tuning log's URL: "
                                   "it is not a database server URL")
