"""Settings once (flag > environment > config file > default), for both command lines: the resolver,
bad config files, ``tuner config``, and commands that take their connection from the settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from measure_agent.settings import Settings, SettingsError
from measure_agent.templates import testing_catalog
from tuner.cli import build_parser
from tuner.cli import main as tuner_main
from tuner.cli.common import apply_settings
from tuner.log import TuningLog

from fleet_helpers import start_daemon, stop_all, wait_for


@pytest.fixture()
def config(tmp_path, monkeypatch):
    """The default config file of an isolated XDG_CONFIG_HOME: write TOML text to it."""
    home = tmp_path / "config-home"
    (home / "tunefleet").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    path = home / "tunefleet" / "config.toml"

    def write(text: str):
        path.write_text(text)
        return path

    return write


def test_flag_beats_environment_beats_file_beats_default(config, tmp_path):
    path = config('tracker = "file-host:9190"\ntls_ca = "certs/ca.crt"\ntls_key = "~/k.pem"\n'
                  '[tuner]\ntoken_file = "/abs/client-token"\n'
                  '[agent]\ntracker = "agent-host:9190"\nparallel = 3\n')
    env = {"XDG_CONFIG_HOME": str(path.parent.parent), "TUNEFLEET_TLS_CA": "/env/ca.crt",
           "TUNEFLEET_AGENT_KEY": "rpi4"}
    tuner = Settings("tuner", environ=env)
    resolved = {r.name: (r.value, r.source) for r in tuner.resolve_all({"tls_ca": "/flag/ca.crt"})}
    assert resolved["tls_ca"] == ("/flag/ca.crt", "flag --tls-ca")
    assert resolved["tracker"] == ("file-host:9190", f"file {path}")
    assert resolved["token_file"] == ("/abs/client-token", f"file {path}")
    assert resolved["tls_cert"] == (None, "default")
    assert resolved["tls_key"][0].endswith("/k.pem") and "~" not in resolved["tls_key"][0]
    assert tuner.resolve("tls_ca").value == "/env/ca.crt"  # no flag: the environment
    assert tuner.resolve("tls_ca").source == "env TUNEFLEET_TLS_CA"

    agent = {r.name: (r.value, r.source) for r in Settings("agent", environ=env).resolve_all()}
    assert agent["tracker"] == ("agent-host:9190", f"file {path}")  # its table overrides the top level
    assert agent["tls_ca"] == ("/env/ca.crt", "env TUNEFLEET_TLS_CA")
    assert agent["key"] == ("rpi4", "env TUNEFLEET_AGENT_KEY")
    assert agent["parallel"] == (3, f"file {path}")
    assert agent["token_file"] == (None, "default")  # the tuner's client token is not the agent's

    del env["TUNEFLEET_TLS_CA"]
    # a relative path in the file is relative to the file's directory
    assert Settings("agent", environ=env).resolve("tls_ca").value == str(path.parent / "certs" / "ca.crt")
    assert Settings("agent", environ={**env, "XDG_CONFIG_HOME": str(tmp_path / "none")}).resolve("parallel").source \
        == "default"


@pytest.mark.parametrize("text, message", [
    ("tracker = [", r"^{path}: not valid TOML: "),
    ('trackr = "h:1"', r"^{path}: unknown key trackr \(known here: tracker, tls_ca, tls_cert, tls_key, \[tuner\], \[agent\]\)$"),
    ("[agent]\nparallel = \"2\"", r"^{path}: agent.parallel must be an integer, not str$"),
    ("[agent]\ndb = \"x.db\"", r"^{path}: unknown key agent.db "),
    ("[tuner]\ntoken_file = 3", r"^{path}: tuner.token_file must be a string, not int$"),
    ("tuner = 1", r"^{path}: tuner must be a table \(\[tuner\]\)$"),
    ('tracker = "no-port"', r"^{path}: tracker: expected HOST:PORT"),
    ("[agent]\nparallel = 0", r"^{path}: agent.parallel: must be an integer from 1 to "),
])
def test_a_bad_config_file_is_one_line_naming_file_and_key(config, text, message):
    path = config(text)
    settings = Settings("agent")
    with pytest.raises(SettingsError, match=message.format(path=path)):
        for name in ("tracker", "parallel"):
            settings.resolve(name)


def test_a_bad_config_file_or_variable_stops_both_command_lines_with_exit_code_2(config, capsys, monkeypatch,
                                                                                 tmp_path):
    path = config('[agent]\nkey = "rpi4"\nfoo = 1\n')
    assert tuner_main(["jobs"]) == 2
    assert capsys.readouterr().err == f"tuner: error: {path}: unknown key agent.foo (known here: tracker, tls_ca, " \
                                      "tls_cert, tls_key, token_file, key, name, parallel)\n"
    from measure_agent.cli import main as agent_main

    assert agent_main([]) == 2
    assert capsys.readouterr().err.startswith(f"measure-agent: error: {path}: unknown key agent.foo")
    config("")
    monkeypatch.setenv("TUNEFLEET_TRACKER", "no-port")
    assert tuner_main(["jobs"]) == 2
    assert capsys.readouterr().err == "tuner: error: TUNEFLEET_TRACKER: expected HOST:PORT[,HOST:PORT...] with PORT 1-65535, " \
                                      "not 'no-port'\n"
    monkeypatch.delenv("TUNEFLEET_TRACKER")
    assert tuner_main(["jobs"]) == 2
    assert capsys.readouterr().err == f"tuner: error: no tracker: give --tracker, or set TUNEFLEET_TRACKER or " \
                                      f"tracker in {path}\n"
    monkeypatch.setenv("TUNEFLEET_CONFIG", str(tmp_path / "missing.toml"))
    assert tuner_main(["jobs"]) == 2
    assert capsys.readouterr().err == f"tuner: error: no config file {tmp_path / 'missing.toml'} (named by " \
                                      "$TUNEFLEET_CONFIG)\n"


def test_tuner_config_shows_each_value_and_its_source_never_a_secret(config, capsys, monkeypatch, tmp_path):
    token = tmp_path / "client-token"
    token.write_text("s3cret-token\n")
    path = config(f'tracker = "file-host:9190"\n[tuner]\ntoken_file = "{token}"\n'
                  'db = "postgresql+psycopg://tuner:pw-in-url@db/t"\n')
    monkeypatch.setenv("TUNEFLEET_TLS_CA", "/env/ca.crt")
    assert tuner_main(["config", "--tls-cert", "/flag/c.pem"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"tuner settings; config file {path}",
        "  tracker           file-host:9190  [file " + str(path) + "]",
        "  tls_ca            /env/ca.crt  [env TUNEFLEET_TLS_CA]",
        "  tls_cert          /flag/c.pem  [flag --tls-cert]",
        "  tls_key           (none)  [default]",
        f"  token_file        {token}  [file {path}]",
        f"  db                postgresql+psycopg://tuner:***@db/t  [file {path}]",
        "  db_password_file  (none)  [default]",
    ]
    assert "s3cret" not in out and "pw-in-url" not in out
    assert tuner_main(["config", "--json", "--agent"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["program"] == "agent" and data["config_file"] == str(path) and data["config_file_exists"]
    assert data["settings"]["tracker"] == {"value": "file-host:9190", "source": f"file {path}",
                                           "env": "TUNEFLEET_TRACKER", "flag": "--tracker"}
    assert data["settings"]["parallel"] == {"value": 1, "source": "default", "env": "TUNEFLEET_AGENT_PARALLEL",
                                            "flag": "--parallel"}
    assert data["settings"]["token_file"]["value"] is None  # [tuner] token_file is not the agent's


def test_the_database_comes_from_the_file_when_neither_flag_nor_environment_names_one(config, capsys, monkeypatch,
                                                                                       tmp_path):
    from tuner.settings import resolve_db_url

    monkeypatch.delenv("TUNEFLEET_DB", raising=False)
    config('[tuner]\ndb = "logs/from-file.db"\n')
    (tmp_path / "config-home" / "tunefleet" / "logs").mkdir()
    from_file = tmp_path / "config-home" / "tunefleet" / "logs" / "from-file.db"
    assert resolve_db_url(None) == f"sqlite:///{from_file}"
    monkeypatch.setenv("TUNEFLEET_DB", str(tmp_path / "env.db"))
    assert resolve_db_url(None) == f"sqlite:///{tmp_path / 'env.db'}"
    assert resolve_db_url(str(tmp_path / "flag.db")) == f"sqlite:///{tmp_path / 'flag.db'}"


def test_fleet_commands_reach_the_daemon_named_by_the_environment_or_the_file(config, capsys, monkeypatch, tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'fleet.db'}") as log:
        daemon = start_daemon(log)
        try:
            monkeypatch.setenv("TUNEFLEET_TRACKER", daemon.address)
            assert tuner_main(["jobs"]) == 0
            assert capsys.readouterr().out == "no jobs\n"
            monkeypatch.delenv("TUNEFLEET_TRACKER")
            config(f'tracker = "{daemon.address}"\n')
            assert tuner_main(["agents"]) == 0
            assert capsys.readouterr().out == "no agents\n"
        finally:
            daemon.stop()


def test_tune_uses_a_configured_tracker_only_with_rpc_key(monkeypatch):
    monkeypatch.setenv("TUNEFLEET_TRACKER", "server:9190")
    parser = build_parser()
    local = parser.parse_args(["tune", "--workload", "matmul_8x8x8"])
    apply_settings(local)
    assert local.tracker is None  # measures on this host
    fleet = parser.parse_args(["tune", "--workload", "matmul_8x8x8", "--rpc-key", "rpi4"])
    apply_settings(fleet)
    assert fleet.tracker == "server:9190"
    flagged = parser.parse_args(["verify", "--workload", "matmul_8x8x8", "--tracker", "other:1"])
    apply_settings(flagged)
    assert flagged.tracker == "other:1"  # a flag is always used (and then needs --rpc-key)


@pytest.mark.timeout(120)
def test_an_agent_joins_with_its_settings_from_the_environment_and_the_file(config, tmp_path, kernel_cache_dir):
    config('[agent]\nparallel = 3\nname = "from-file"\n')
    with TuningLog(f"sqlite:///{tmp_path / 'fleet.db'}") as log:
        daemon = start_daemon(log)
        env = dict(os.environ, XDG_CACHE_HOME=str(kernel_cache_dir), TUNEFLEET_TRACKER=daemon.address,
                   TUNEFLEET_AGENT_KEY="env-key", TUNEFLEET_AGENT_NAME="from-env")
        agent = subprocess.Popen([sys.executable, "-m", "measure_agent", "--templates", "testing"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            [joined] = wait_for(daemon.scheduler.agents, what="the agent joined")
            assert (joined.key, joined.name, joined.parallel) == ("env-key", "from-env", 3)
            assert joined.device_info["template_version"] == testing_catalog().version
        finally:
            stop_all([agent])
            daemon.stop()
