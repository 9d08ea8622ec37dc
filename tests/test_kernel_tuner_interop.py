"""The Kernel Tuner round trip: Kernel Tuner's own cache reader resumes from a cache written by
``tune_function``, and a cache written by Kernel Tuner's own writer resumes ``tune_function`` and
replays (kernel_tuner is a test dependency; its simulation mode needs no GPU)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from kernel_tuner import tune_kernel, util
from kernel_tuner.interface import Options

from tuner.replay.cache import load_cache
from tuner.user_space import CacheFileError, prior_from_cache, tune_function

PARAMS = {"block_size_x": [32, 64, 128, 256], "unroll": [1, 2, 4]}
RESTRICTIONS = ["block_size_x * unroll <= 512"]
VALID = [(x, u) for x in PARAMS["block_size_x"] for u in PARAMS["unroll"] if x * u <= 512]
KERNEL_SOURCE = "__global__ void vector_add(float *c, const float *a, const float *b, int n) {}"
DEVICE = "NVIDIA A100-PCIE-40GB"


def vector_add(p):
    """A stand-in for timing the kernel: unroll 4 at block size 32 fails."""
    if (p["block_size_x"], p["unroll"]) == (32, 4):
        return None
    return 1.0 + abs(p["block_size_x"] - 128) / 64 + 0.1 * p["unroll"]


def kernel_tuner_resume(path, kernel_name="vector_add", device=DEVICE, problem_size=100):
    """Kernel Tuner's check and read of an existing cache before it tunes on (not simulated)."""
    runner = SimpleNamespace(get_device_info=lambda: SimpleNamespace(name=device), simulation_mode=False)
    return util.process_cache(str(path), Options(kernel_name=kernel_name, problem_size=problem_size),
                              Options(tune_params=PARAMS, simulation_mode=False, objective="time"), runner)


def test_kernel_tuner_resumes_from_a_cache_written_by_tune_function(tmp_path):
    path = tmp_path / "vector_add.json"
    ours = tune_function(PARAMS, vector_add, RESTRICTIONS, budget=100, cache=path, device_name=DEVICE, seed=1)
    assert ours.evaluated == len(VALID) and ours.stopped == "exhausted"

    data = util.read_cache(str(path), open_cache=False)
    assert (data["device_name"], data["kernel_name"]) == (DEVICE, "vector_add")
    assert data["tune_params_keys"] == list(PARAMS) and data["objective"] == "time"
    assert "__error__" in data["cache"]["32,4"] and data["cache"]["128,1"]["time"] == 1.1

    # Kernel Tuner's own tuning, in simulation mode, serves every config from our file.
    a = np.zeros(100, np.float32)
    results, env = tune_kernel("vector_add", KERNEL_SOURCE, 100, [a, a, a, np.int32(100)], PARAMS,
                               restrictions=RESTRICTIONS, cache=str(path), simulation_mode=True,
                               strategy="brute_force", quiet=True)
    assert env["device_name"] == DEVICE
    theirs = {(r["block_size_x"], r["unroll"]): (None if "__error__" in r else r["time"]) for r in results}
    assert theirs == {(p["block_size_x"], p["unroll"]): cost for p, cost in ours.evaluations}
    fastest = min((r for r in results if "__error__" not in r), key=lambda r: r["time"])
    assert {k: fastest[k] for k in PARAMS} == ours.best

    # A real (not simulated) run checks device, kernel and parameters before resuming from it.
    assert set(kernel_tuner_resume(path)) == {f"{x},{u}" for x, u in VALID}
    with pytest.raises(ValueError, match="different kernel"):
        kernel_tuner_resume(path, kernel_name="saxpy")
    with pytest.raises(ValueError, match="different device"):
        kernel_tuner_resume(path, device="NVIDIA H100")
    # Kernel Tuner reopened the file for appending; tune_function still resumes from it.
    again = tune_function(PARAMS, lambda p: pytest.fail("measured again"), RESTRICTIONS, budget=100, cache=path,
                          device_name=DEVICE)
    assert again.from_cache == len(VALID) and again.best == ours.best


def write_with_kernel_tuner(path):
    """A cache as Kernel Tuner's writer leaves it mid-run: header, appended entries, no closing braces."""
    runner = SimpleNamespace(get_device_info=lambda: SimpleNamespace(name=DEVICE), simulation_mode=False)
    cache = util.process_cache(str(path), Options(kernel_name="vector_add", problem_size=100),
                               Options(tune_params=PARAMS, simulation_mode=False, objective="time"), runner)
    for x, u in [(64, 1), (64, 2), (128, 1), (128, 2)]:
        entry = {"block_size_x": x, "unroll": u, "time": x / 100 + u, "times": [1.0, 2.0], "compile_time": 3.0}
        util.store_cache(f"{x},{u}", entry, str(path), cache)
    util.store_cache("256,2", {"block_size_x": 256, "unroll": 2, "time": util.CompilationFailedConfig()},
                     str(path), cache)


def test_a_cache_written_by_kernel_tuner_replays_and_resumes_tune_function(tmp_path):
    path = tmp_path / "kt.json"
    write_with_kernel_tuner(path)
    assert not path.read_text().rstrip().endswith("}")  # left open, as Kernel Tuner leaves it

    replay = load_cache(path)
    assert replay.size == 5 and replay.optimum == pytest.approx(1.64) and replay.device == DEVICE
    assert len(prior_from_cache(path)) == 5

    before = path.read_text()
    with pytest.raises(CacheFileError, match="device_name"):  # default: this host's CPU, not the A100
        tune_function(PARAMS, vector_add, RESTRICTIONS, budget=8, cache=path)
    assert path.read_text() == before

    calls = []
    result = tune_function(PARAMS, lambda p: calls.append(p) or vector_add(p), RESTRICTIONS, budget=8,
                           cache=path, device_name=DEVICE)
    assert result.from_cache == 5 and len(calls) == 3 and result.evaluated == 8
    assert not {(p["block_size_x"], p["unroll"]) for p in calls} & {(64, 1), (64, 2), (128, 1), (128, 2), (256, 2)}

    # Kernel Tuner's header and entry fields survive, and Kernel Tuner resumes from the result.
    data = json.loads(path.read_text())
    assert data["problem_size"] == 100 and data["kernel_name"] == "vector_add"
    assert data["cache"]["64,1"]["compile_time"] == 3.0 and data["cache"]["256,2"]["time"] == "CompilationFailedConfig"
    assert len(kernel_tuner_resume(path)) == 8
    with pytest.raises(ValueError, match="problem_size"):
        kernel_tuner_resume(path, problem_size=200)


def test_a_cache_without_entries_stays_one_kernel_tuner_reads_and_names_are_checked(tmp_path):
    path = tmp_path / "empty.json"

    def crashes(p):
        raise RuntimeError("no device")

    with pytest.raises(RuntimeError):
        tune_function(PARAMS, crashes, RESTRICTIONS, cache=path, device_name=DEVICE, kernel_name="vector_add")
    assert kernel_tuner_resume(path) == {} and kernel_tuner_resume(path) == {}
    result = tune_function(PARAMS, vector_add, RESTRICTIONS, budget=2, cache=path, device_name=DEVICE)
    assert result.evaluated == 2 and len(kernel_tuner_resume(path)) == 2
    with pytest.raises(CacheFileError, match="kernel_name 'vector_add'"):
        tune_function(PARAMS, vector_add, RESTRICTIONS, cache=path, device_name=DEVICE, kernel_name="saxpy")
    with pytest.raises(CacheFileError, match="device_name must be a non-empty string"):
        tune_function(PARAMS, vector_add, RESTRICTIONS, cache=tmp_path / "other.json", device_name=" ")


def test_a_cache_written_before_the_names_were_recorded_resumes_and_gains_them(tmp_path):
    path = tmp_path / "old.json"
    tune_function(PARAMS, vector_add, RESTRICTIONS, budget=3, cache=path)
    data = json.loads(path.read_text())
    del data["device_name"], data["kernel_name"]
    path.write_text(json.dumps(data))
    result = tune_function(PARAMS, vector_add, RESTRICTIONS, budget=5, cache=path, device_name=DEVICE)
    assert result.from_cache == 3 and result.evaluated == 5
    assert len(kernel_tuner_resume(path)) == 5  # now named: vector_add on the A100
