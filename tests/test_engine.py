"""The measurement engine under fault injection (testing templates: no real kernels needed)."""

import os
import subprocess
import sys
import time

import pytest

from measure_agent.engine import MeasureEngine, MeasureInput, MeasureStatus, TimingConfig
from measure_agent.space import Config
from measure_agent.templates import testing_catalog as fault_catalog
from measure_agent.workload import parse_workload

WORKLOAD = parse_workload("matmul(M=8,N=6,K=5)")
SPACE = fault_catalog().get("matmul", "cpu").space(WORKLOAD)


def candidate(behaviour, sleep_ms=0, variant=0):
    return MeasureInput(WORKLOAD, SPACE.make({"behaviour": behaviour, "sleep_ms": sleep_ms, "variant": variant}))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    timing = TimingConfig(number=1, repeat=2, min_repeat_ms=5, run_timeout_s=3, build_timeout_s=60)
    with MeasureEngine(timing, build_workers=2, catalog="testing", cache_dir=tmp_path_factory.mktemp("kc")) as e:
        yield e


def test_every_failure_gets_its_status_and_the_engine_carries_on(engine):
    behaviours = ["ok", "compile_error", "raise", "wrong", "hang", "abort", "segfault", "ok"]
    results = engine.measure([candidate(b, variant=i) for i, b in enumerate(behaviours)])
    statuses = [r.status for r in results]
    assert statuses == [
        MeasureStatus.OK,
        MeasureStatus.COMPILE_ERROR,
        MeasureStatus.RUNTIME_ERROR,
        MeasureStatus.WRONG_ANSWER,
        MeasureStatus.RUN_TIMEOUT,
        MeasureStatus.RUNTIME_ERROR,
        MeasureStatus.RUNTIME_ERROR,
        MeasureStatus.OK,
    ]
    assert "no_such_attribute" in results[1].message
    assert "injected runtime error" in results[2].message
    assert "max abs error" in results[3].message
    assert "SIGABRT" in results[5].message
    assert "SIGSEGV" in results[6].message
    for r in results:
        assert "\x1b[" not in r.message and "\n" not in r.message
    assert results[-1].mean_s is not None and results[-1].mean_s > 0
    assert results[1].mean_s is None


def test_timing_follows_number_repeat_and_min_repeat_ms(engine):
    [result] = engine.measure([candidate("sleep", sleep_ms=1, variant=1)])
    assert result.status is MeasureStatus.OK
    assert len(result.costs) == 2  # repeat
    # each cost is a per-call mean of a sleep of at least 1 ms
    assert all(c >= 0.001 for c in result.costs)
    # grown from number=1 until a repeat lasted min_repeat_ms (5 ms); how far depends on the host's
    # load (a 1 ms sleep takes longer on a busy one), so the exact growth is checked with a fake clock
    assert result.details["number"] > 1
    if sys.platform.startswith("linux"):  # how clean the timing was, and how often a repeat was redone
        assert 0 <= result.details["cpu_wait_share"] and 0 <= result.details["repeats_redone"] <= 2 * 2


def test_calls_per_repeat_grow_until_a_repeat_lasts_min_repeat_ms():
    from measure_agent.engine.worker import timed_costs

    calls: list[int] = []

    def time_calls(number: int) -> float:  # a kernel of exactly 1 ms per call
        calls.append(number)
        return number * 0.001

    costs, number = timed_costs(time_calls, TimingConfig(number=1, repeat=3, min_repeat_ms=5))
    assert number * 0.001 >= 0.005 and calls[0] == 1
    growth = calls[:-3]  # the calibration calls before the three timed repeats
    assert growth[-1] == number and all(earlier < later for earlier, later in zip(growth, growth[1:]))
    assert calls[-3:] == [number] * 3 and costs == [0.001] * 3

    costs, number = timed_costs(time_calls, TimingConfig(number=7, repeat=2, min_repeat_ms=0))
    assert number == 7 and costs == [0.001, 0.001]


class ScriptedHost:
    """A kernel of 1 ms per call on a host whose other work takes the CPU from its threads for
    ``waits[i]`` of the i-th timed attempt's wall time (then none)."""

    def __init__(self, waits):
        self.waits = list(waits)
        self.waited = 0.0
        self.attempts = 0

    def time_calls(self, number: int) -> float:
        share = self.waits[self.attempts] if self.attempts < len(self.waits) else 0.0
        self.attempts += 1
        elapsed = number * 0.001 * (1 + share)  # the kernel is slowed by as long as it waited
        self.waited += share * elapsed
        return elapsed

    def cpu_wait(self) -> float:
        return self.waited


def test_repeats_whose_threads_waited_for_a_cpu_are_timed_again_and_the_cleanest_is_kept():
    from measure_agent.engine.worker import time_repeats

    # repeat 1 clean; repeat 2 disturbed twice, then clean; repeat 3 clean
    host = ScriptedHost([0.0, 0.6, 0.3, 0.0, 0.01])
    timed = time_repeats(host.time_calls, TimingConfig(number=10, repeat=3), host.cpu_wait)
    assert host.attempts == 5 and timed.redone == 2
    assert timed.costs == pytest.approx([0.001, 0.001, 0.00101])
    assert timed.wait_shares == pytest.approx([0.0, 0.0, 0.01], abs=1e-9)
    assert timed.details() == {"cpu_wait_share": pytest.approx(0.01), "repeats_redone": 2}


def test_an_always_busy_host_costs_at_most_three_times_the_timing():
    from measure_agent.engine.worker import time_repeats

    host = ScriptedHost([0.9, 0.5, 0.7, 0.9, 0.5, 0.5, 0.5])
    timed = time_repeats(host.time_calls, TimingConfig(number=10, repeat=2), host.cpu_wait)
    assert host.attempts == 2 + 2 * 2 and timed.redone == 4
    # each repeat keeps its least disturbed attempt, and the details say it was disturbed
    assert timed.wait_shares == pytest.approx([0.5, 0.5]) and timed.details()["cpu_wait_share"] == 0.5


def test_redoing_never_takes_more_than_a_quarter_of_the_run_timeout():
    from measure_agent.engine.worker import time_repeats

    host = ScriptedHost([0.5] * 20)  # 1 ms calls x 1000 = about 1.5 s an attempt, always disturbed
    timed = time_repeats(host.time_calls, TimingConfig(number=1000, repeat=3, run_timeout_s=10.0), host.cpu_wait)
    assert timed.redone == 1 and host.attempts == 3 + 1  # 2.5 s of redo allowed: one 1.5 s attempt


def test_without_a_wait_clock_repeats_are_taken_as_they_come():
    from measure_agent.engine.worker import time_repeats

    host = ScriptedHost([0.9, 0.9])
    timed = time_repeats(host.time_calls, TimingConfig(number=10, repeat=2))
    assert host.attempts == 2 and timed.redone == 0 and timed.details() == {}
    assert timed.costs == pytest.approx([0.0019, 0.0019])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux counts run-queue waits per thread")
def test_the_wait_clock_sees_another_process_take_this_ones_cpu():
    """A busy process pinned to this one's CPU takes about half of it: this process's threads
    wait for the CPU about as long as they run."""
    from measure_agent.engine.cpu_wait import cpu_wait_clock

    clock = cpu_wait_clock()
    assert clock is not None
    cpu = min(os.sched_getaffinity(0))
    before_affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        time.sleep(0.3)  # the hog is running
        waited_before, start = clock(), time.perf_counter()
        while time.perf_counter() - start < 0.4:
            pass
        share = (clock() - waited_before) / (time.perf_counter() - start)
    finally:
        hog.kill()
        hog.wait()
        os.sched_setaffinity(0, before_affinity)
    assert share > 0.2


def test_config_outside_the_space_is_refused_without_building(engine):
    from measure_agent.space import Config

    bad = MeasureInput(WORKLOAD, Config((("behaviour", "explode"), ("sleep_ms", 0), ("variant", 0))))
    [result] = engine.measure([bad])
    assert result.status is MeasureStatus.INVALID_CONFIG
    assert "explode" in result.message


def test_unknown_target_is_refused(engine):
    item = candidate("ok")
    [result] = engine.measure([MeasureInput(item.workload, item.config, target="fpga")])
    assert result.status is MeasureStatus.INVALID_CONFIG
    assert "no template for matmul on target fpga" in result.message


def test_build_timeout(tmp_path):
    # A compile cannot be made to hang on purpose; a tiny build limit stands in for it.
    timing = TimingConfig(build_timeout_s=0.01)
    with MeasureEngine(timing, catalog="testing", cache_dir=tmp_path) as e:
        [result] = e.measure([candidate("ok", variant=7)])
    assert result.status is MeasureStatus.BUILD_TIMEOUT


def test_prepare_then_run_equals_measure_and_overlap_only_off_the_host_cpu(engine):
    items = [candidate("ok", variant=v) for v in (1, 2)] + [candidate("compile_error")]
    prepared = engine.prepare(items)
    assert [p.failed is None for p in prepared] == [True, True, False]
    results = engine.run(prepared)
    assert [r.status for r in results] == [MeasureStatus.OK, MeasureStatus.OK, MeasureStatus.COMPILE_ERROR]
    sleeping = MeasureInput(parse_workload("matmul(M=2,N=2,K=1)"), Config((("variant", 0),)), "sleep")
    assert engine.builds_may_overlap_runs([sleeping])  # a sleep is not disturbed by a build elsewhere
    assert not engine.builds_may_overlap_runs([sleeping, items[0]])  # a CPU kernel's timing would be


def test_run_worker_answers_load_then_run_and_stops_after_a_failed_load(tmp_path):
    """The run worker's staged request: a "loaded" answer held to the build limit, then the run's;
    a kernel that fails to load ends the exchange with its one final answer."""
    from measure_agent.engine.process import WorkerProcess

    worker = WorkerProcess("testing", tmp_path)
    timing = {"number": 1, "repeat": 1, "min_repeat_ms": 0, "warmup": 1}

    def request(behaviour, variant):
        config = SPACE.make({"behaviour": behaviour, "sleep_ms": 0, "variant": variant}).to_json()
        return {"op": "run", "load_first": True, "workload": WORKLOAD.key, "config": config, "target": "cpu",
                "timing": timing}

    try:
        loaded, ran = worker.request_stages(request("ok", 11), [120, 30])
        assert loaded["stage"] is True and loaded["status"] == "ok"
        assert "stage" not in ran and ran["status"] == "ok" and len(ran["costs"]) == 1
        [failed] = worker.request_stages(request("compile_error", 12), [120, 30])
        assert failed["status"] == "compile_error" and "stage" not in failed
        assert worker.request_stages(request("ok", 13), [120, 30])[-1]["status"] == "ok"  # and it goes on
    finally:
        worker.stop()


def test_codegen_environment_turns_off_llvms_256_bit_preference_on_avx512_hosts_only(monkeypatch):
    from measure_agent.engine import build

    avx512 = build.codegen_environment("+64bit,+avx2,+avx512f,+fma")
    assert avx512 == {"NUMBA_CPU_FEATURES": "+64bit,+avx2,+avx512f,+fma,-prefer-256-bit"}
    assert build.codegen_environment("+64bit,+avx2,-avx512f,+fma") == {}  # AVX2 only: numba's defaults
    assert build.codegen_environment("+neon,+v8a") == {}
    assert build.codegen_environment("") == {}
    # Workers: the host's codegen unless the operator exported their own; what kernels need always.
    monkeypatch.setattr(build, "codegen_environment", lambda host_features=None: avx512)
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    monkeypatch.setenv("NUMBA_OPT", "0")
    env = build.worker_environment()
    assert env["NUMBA_CPU_FEATURES"].endswith("-prefer-256-bit") and env["NUMBA_OPT"] == "3"
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx2")
    assert build.worker_environment()["NUMBA_CPU_FEATURES"] == "+avx2"


def test_workers_show_their_role_on_the_command_line(tmp_path):
    """deploy/arm/smoke.sh finds the build workers by it (their peak memory is what a Pi pays)."""
    from pathlib import Path

    from measure_agent.engine.process import WorkerProcess

    timing = TimingConfig(number=1, repeat=1, min_repeat_ms=0, run_timeout_s=5, build_timeout_s=60)
    with MeasureEngine(timing, build_workers=2, catalog="testing", cache_dir=tmp_path) as engine:
        assert [w.role for w in engine._all_workers] == ["build", "build"] and engine._runner.role == "run"
        [result] = engine.measure([candidate("ok")])
        assert result.status == MeasureStatus.OK
        cmdlines = [Path(f"/proc/{w._proc.pid}/cmdline").read_bytes().split(b"\0")
                    for w in (*engine._all_workers, engine._runner) if w.alive]
        roles = sorted(c[c.index(b"--role") + 1].decode() for c in cmdlines)
        assert "build" in roles and "run" in roles
    with pytest.raises(ValueError, match="worker role must be one of build, run"):
        WorkerProcess("testing", tmp_path, role="compile")


def test_a_dead_workers_message_quotes_its_error_not_the_warnings_before_it():
    """numba-cuda's performance warnings (two lines each, coloured) came before the CUDA error a
    worker died of; the message quoted the warning and the error was cut off (seen on an H200)."""
    from measure_agent.engine.process import _error_lines

    stderr = ("/venv/numba_cuda/numba/cuda/dispatcher.py:748: NumbaPerformanceWarning: \x1b[1mGrid size 64 will "
              "likely result in GPU under-utilization due to low occupancy.\x1b[0m\n"
              "  warn(NumbaPerformanceWarning(msg))\n"
              "\n"
              "CUDA candidate failed, worker exits for a fresh CUDA context: CUDAError: "
              "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\n")
    assert _error_lines(stderr) == ["CUDA candidate failed, worker exits for a fresh CUDA context: CUDAError: "
                                    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"]
    traceback = "Traceback (most recent call last):\n  File \"w.py\", line 3, in <module>\nValueError: bad"
    assert _error_lines(traceback) == ["Traceback (most recent call last):", "File \"w.py\", line 3, in <module>",
                                       "ValueError: bad"]
