import os

import pytest


@pytest.fixture(scope="session")
def kernel_cache_dir(tmp_path_factory):
    """One numba kernel cache for the whole run: a variant compiled once is loaded afterwards. Under
    pytest-xdist every worker has its own base temp; the cache sits beside them, shared (kernel files
    and numba's index are written atomically, so workers may fill it at once)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "kernel-cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("kernel-cache")


@pytest.fixture()
def cli_env(kernel_cache_dir, tmp_path):
    """Environment for running the ``tuner`` CLI as a user would, isolated from the real home."""
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = str(kernel_cache_dir)
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env.pop("TUNEFLEET_DB", None)
    return env


@pytest.fixture(autouse=True)
def isolated_settings(monkeypatch, tmp_path_factory):
    """No test reads the developer's own config file or TUNEFLEET_* connection settings: an empty
    config directory, and none of the settings' variables (tests that need one set it)."""
    from measure_agent.settings import CONFIG_ENV_VAR, SCHEMA

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "no-config"))
    for name in {CONFIG_ENV_VAR} | {s.env for settings in SCHEMA.values() for s in settings} - {"TUNEFLEET_DB"}:
        monkeypatch.delenv(name, raising=False)
