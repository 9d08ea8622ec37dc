"""A device finds what the fleet measured for it, whatever key the fleet used (issue 24, point 1).

A fleet records trials under its ``--rpc-key`` (``rpi4``); the board itself looks up its detected key
(``aarch64-raspberry-pi-4-model-b-4c-asimd``). The recorded device info gives every key an identity
(the detected key of the device that measured it), and lookups for "this host" match on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from measure_agent.device import DeviceInfo, detect_device
from measure_agent.engine import MeasureResult, MeasureStatus, TimingConfig
from measure_agent.templates import testing_catalog
from tuner.log import BestConfigs, TuningLog, keys_of_device, resolve_best_config
from tuner.log.records import TrialRecord

from fleet_helpers import agent_names, start_agent, start_daemon, stop_all, wait_for

PI4 = DeviceInfo(arch="aarch64", cpu_model="Cortex-A72", cores=4, isa_features=("asimd",),
                 board="Raspberry Pi 4 Model B Rev 1.4")
PI5 = DeviceInfo(arch="aarch64", cpu_model="Cortex-A76", cores=4, isa_features=("asimd", "asimddp"),
                 board="Raspberry Pi 5 Model B Rev 1.0")
WORKLOAD = "matmul(M=16,N=16,K=16)"


def record(device_key: str, seconds: float, config: dict, agent: str = "") -> TrialRecord:
    return TrialRecord.from_result(WORKLOAD, device_key, "cpu", config,
                                   MeasureResult(MeasureStatus.OK, costs=(seconds,)), agent=agent,
                                   created_at=datetime(2026, 1, 1, tzinfo=timezone.utc))


def valid_configs(device: DeviceInfo, n: int) -> list[dict]:
    """``n`` distinct configs of WORKLOAD valid in ``device``'s space."""
    import numpy as np

    from measure_agent.templates import default_catalog
    from measure_agent.workload import parse_workload

    space = default_catalog().space(parse_workload(WORKLOAD), "cpu", device)
    distinct: dict[str, dict] = {}
    for config in space.sample(np.random.default_rng(0), count=50):
        distinct.setdefault(config.digest, config.to_json())
    assert len(distinct) >= n
    return list(distinct.values())[:n]


@pytest.fixture()
def fleet_log(tmp_path):
    """A log as a fleet leaves it: a Pi 4 measured under 'rpi4', a Pi 5 under 'rpi5', and an info-less key."""
    with TuningLog(f"sqlite:///{tmp_path / 'fleet.db'}") as log:
        pi4_configs = valid_configs(PI4, 2)
        pi5_configs = valid_configs(PI5, 1)
        log.record_trials([record("rpi4", 2e-3, pi4_configs[0], "pi-a"), record("rpi4", 1e-3, pi4_configs[1], "pi-b"),
                           record("rpi5", 1e-4, pi5_configs[0]), record("old-key", 1e-5, pi4_configs[0])],
                          device_info={"rpi4": PI4.to_json(), "rpi5": PI5.to_json()})
        yield log, pi4_configs


def test_keys_of_device_match_the_recorded_identity(fleet_log):
    log, _ = fleet_log
    assert keys_of_device(log, PI4.default_key) == ["rpi4"]
    assert keys_of_device(log, PI5.default_key) == ["rpi5"]
    assert keys_of_device(log, "x86_64-something-2c-avx2") == []  # and the info-less key has no identity


def test_the_board_finds_the_fleet_key_and_says_so(fleet_log):
    log, pi4_configs = fleet_log
    identity = PI4.default_key
    assert identity == "aarch64-raspberry-pi-4-model-b-4c-asimd"
    best = resolve_best_config(log, WORKLOAD, identity, "cpu", device_identity=identity)
    assert best.found and best.kind == "tuned"
    assert best.record.device_key == "rpi4" and best.config == pi4_configs[1]  # the faster Pi 4 trial, not the Pi 5's
    assert "rpi4" in best.why and identity in best.why
    assert best.tuned_on == PI4  # checked against the space of the device that measured it
    # an explicit key means exactly that key: no identity, nothing found
    assert not resolve_best_config(log, WORKLOAD, identity, "cpu").found


def test_a_best_configs_file_keeps_the_identity(fleet_log):
    from tuner.log.bestfile import best_configs_from_log, loads_best, dumps_best

    log, pi4_configs = fleet_log
    shipped = loads_best(dumps_best(best_configs_from_log(log, top=1), top=1))
    assert isinstance(shipped, BestConfigs)
    best = resolve_best_config(shipped, WORKLOAD, PI4.default_key, "cpu", device_identity=PI4.default_key)
    assert best.found and best.record.device_key == "rpi4" and best.config == pi4_configs[1]


def test_tuner_best_and_best_kernel_on_this_host_find_its_fleet_key(tmp_path, cli_env):
    """This host measured under a fleet key ('lab-x86'): `tuner best` and best_kernel without a key find it."""
    import tuner

    host = detect_device()
    db = tmp_path / "host.db"
    with TuningLog(f"sqlite:///{db}") as log:
        config = valid_configs(host, 1)[0]
        log.record_trials([record("lab-x86", 1e-3, config, "agent-1")], device_info={"lab-x86": host.to_json()})
    done = subprocess.run([sys.executable, "-m", "tuner", "best", "--workload", WORKLOAD, "--db", str(db), "--json"],
                          capture_output=True, text=True, env=cli_env, timeout=120)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["device_key"] == "lab-x86" and row["config"] == config
    text = subprocess.run([sys.executable, "-m", "tuner", "best", "--workload", WORKLOAD, "--db", str(db)],
                          capture_output=True, text=True, env=cli_env, timeout=120)
    assert text.returncode == 0 and "FROM KEY lab-x86" in text.stdout
    explicit = subprocess.run([sys.executable, "-m", "tuner", "best", "--workload", WORKLOAD, "--db", str(db),
                               "--device-key", host.default_key], capture_output=True, text=True, env=cli_env,
                              timeout=120)
    assert explicit.returncode == 1 and "no successful trial" in explicit.stderr

    kernel = tuner.best_kernel(WORKLOAD, db=str(db), cache_dir=tmp_path / "kernels")
    assert kernel.kind == "tuned" and kernel.device_key == "lab-x86" and kernel.config == config


def test_an_agent_without_key_joins_under_its_detected_key(tmp_path, kernel_cache_dir):
    """`measure-agent --tracker ...` without --key: the detected key, so the board finds its trials."""
    with TuningLog(f"sqlite:///{tmp_path / 'fleet.db'}") as log:
        daemon = start_daemon(log)
        agent = subprocess.Popen(
            [sys.executable, "-m", "measure_agent", "--tracker", daemon.address, "--name", "keyless",
             "--templates", "testing"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            expected = detect_device().default_key
            wait_for(lambda: agent_names(daemon, expected) == {"keyless"}, what="agent under its detected key")
        finally:
            stop_all([agent])
            daemon.stop()
        assert expected in agent.stderr.read()
