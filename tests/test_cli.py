"""End to end through the real command line: tune, best, show-kernel, export/import."""

import json
import subprocess
import sys

import pytest

WORKLOAD = "matmul(M=24,N=40,K=16)"


def tuner(env, *args, check=True, stdin=None):
    proc = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, env=env,
                          timeout=900, input=stdin)
    if check:
        assert proc.returncode == 0, f"tuner {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_tune_best_show_kernel_export_import(cli_env, tmp_path):
    db = f"sqlite:///{tmp_path / 'tune.db'}"
    # serial kernels compile in about a second, parallel ones in several: keep CI quick
    out = tuner(cli_env, "tune", "--workload", WORKLOAD, "--trials", "8", "--strategy", "random", "--seed", "1",
                "--parallel", "2", "--repeat", "2", "--min-repeat-ms", "1", "--db", db, "--device-key", "ci-host",
                "--pin", "parallel=false").stdout
    assert "GFLOPS" in out and "speed-up:" in out and "over the default config" in out  # default is serial here
    assert "8 measured now, 8 in the log" in out

    best = json.loads(tuner(cli_env, "best", "--workload", WORKLOAD, "--db", db, "--device-key", "ci-host", "--json").stdout)
    assert best["workload"] == "matmul(M=24,N=40,K=16,dtype=float32)"
    assert best["device_key"] == "ci-host"
    assert best["mean_s"] > 0 and best["gflops"] > 0
    assert isinstance(best["config"], dict)

    kernel = tuner(cli_env, "show-kernel", "--workload", WORKLOAD, "--best", "--db", db, "--device-key", "ci-host").stdout
    assert "@njit" in kernel and "def " in kernel
    explicit = tuner(cli_env, "show-kernel", "--workload", WORKLOAD, "--config", json.dumps(best["config"])).stdout
    assert explicit == kernel
    default = tuner(cli_env, "show-kernel", "--workload", WORKLOAD, "--config", "default").stdout
    assert "@njit" in default

    exported = tuner(cli_env, "log", "export", "--db", db).stdout
    lines = exported.splitlines()
    assert len(lines) == 8
    for line in lines:
        row = json.loads(line)
        assert {"workload", "device_key", "config", "status", "costs"} <= set(row)
    dump = tmp_path / "log.jsonl"
    dump.write_text(exported)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert "8 imported" in tuner(cli_env, "log", "import", str(dump), "--db", other).stdout
    assert tuner(cli_env, "log", "export", "--db", other).stdout == exported
    assert "0 imported, 8 already present" in tuner(cli_env, "log", "import", str(dump), "--db", other).stdout

    # Same command again: resumes, measures nothing new.
    again = tuner(cli_env, "tune", "--workload", WORKLOAD, "--trials", "8", "--strategy", "random", "--seed", "1",
                  "--db", db, "--device-key", "ci-host", "--pin", "parallel=false", "--no-transfer",
                  "--time-budget", "600", "--reuse-share", "0.5").stdout
    assert "0 measured now, 8 in the log" in again
    from tuner.log import TuningLog

    with TuningLog(db, create=False) as log:
        first, second = sorted(log.jobs(), key=lambda job: job.id)
    assert (first.options["transfer"], first.options["time_budget_s"]) == (True, None)
    assert (second.options["transfer"], second.options["time_budget_s"]) == (False, 600.0)
    assert (first.options["reuse_share"], second.options["reuse_share"]) == (0.0, 0.5)


@pytest.mark.parametrize(
    "args, message",
    [
        (["tune", "--workload", "matmul(M=4,N=4)"], "missing size K"),
        (["tune", "--workload", "conv9(M=4)"], "unknown operator 'conv9'"),
        (["tune", "--workload", "matmul(M=0,N=4,K=4)"], "must be positive"),
        (["tune", "--workload", "matmul(M=4,N=4,K=4)", "--target", "fpga"], "unknown target 'fpga'"),
        (["show-kernel", "--workload", "matmul(M=4,N=4,K=4)", "--config", '{"nope": 1}'], "unknown knob 'nope'"),
        (["show-kernel", "--workload", "matmul(M=4,N=4,K=4)", "--config", "{bad"], "not valid JSON"),
        (["best", "--workload", "matmul(M=4,N=4,K=4)"], "no tuning log at"),
    ],
)
def test_bad_input_one_line_error_no_traceback(cli_env, args, message):
    proc = tuner(cli_env, *args, check=False)
    assert proc.returncode in (1, 2)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_import_of_a_broken_file_names_the_line_and_imports_nothing(cli_env, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "tunefleet-log"}\n{not json\n')
    db = f"sqlite:///{tmp_path / 'x.db'}"
    proc = tuner(cli_env, "log", "import", str(bad), "--db", db, check=False)
    assert proc.returncode == 2
    assert "line 1" in proc.stderr and "nothing imported" in proc.stderr
    assert tuner(cli_env, "log", "export", "--db", db).stdout == ""


def test_corrupt_database_is_a_one_line_error(cli_env, tmp_path):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    proc = tuner(cli_env, "best", "--workload", "matmul(M=4,N=4,K=4)", "--db", str(corrupt), check=False)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_python_dash_m_and_console_script_agree(cli_env):
    assert "tune" in tuner(cli_env, "--help").stdout


def test_cuda_on_a_host_without_a_gpu_is_refused_before_anything_is_recorded(cli_env, tmp_path):
    from measure_agent.device import detect_gpu

    if detect_gpu():
        pytest.skip("this host has a CUDA GPU")
    cli_env.pop("NUMBA_ENABLE_CUDASIM", None)
    db = tmp_path / "log.db"
    for args in (("tune", "--workload", "matmul(M=16,N=16,K=16)", "--target", "cuda", "--trials", "2", "--db", str(db)),
                 ("verify", "--workload", "matmul(M=16,N=16,K=16)", "--target", "cuda", "--samples", "1")):
        proc = tuner(cli_env, *args, check=False)
        assert proc.returncode == 1 and "no CUDA GPU on this host" in proc.stderr and "--tracker" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not db.exists()
