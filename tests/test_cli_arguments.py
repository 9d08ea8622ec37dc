"""Bad arguments get one clear line and exit 2 (1 for failures such as an unreachable daemon): never a
traceback from protobuf, SQLite, numpy or gRPC, never a silent hang."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fleet_helpers import free_port, start_daemon
from measure_agent.cli import build_parser as agent_parser
from measure_agent.cli import main as agent_main
from measure_agent.protocol.errors import Unavailable
from tuner.cli import build_parser as tuner_parser
from tuner.cli import main as tuner_main
from tuner.daemon import FleetClient
from tuner.fleet import JobSpec
from tuner.log import TuningLog

W = "matmul(M=16,N=16,K=16)"
SPACE = str(Path(__file__).parent / "data" / "pnpoly_trimmed.json.gz")
INT64_MAX = "9223372036854775807"
INT32_MAX = "2147483647"
HUGE = "99999999999999999999999"


def run_main(main, capsys, *argv) -> tuple[int, str]:
    """Exit code and stderr of a command line run in-process (argparse errors exit through SystemExit)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def last_line(err: str) -> str:
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def rejected(main, capsys, *argv) -> str:
    code, err = run_main(main, capsys, *argv)
    assert code == 2, err
    return last_line(err)


def run_cli(*argv, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=timeout)


# -- 1. tuner wait fails fast on a daemon it never reached; waits (with a note) for one that went away ----------
@pytest.mark.timeout(30)
@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "nohost.invalid:9190"])
def test_wait_on_a_daemon_never_reached_fails_at_once(address):
    proc = run_cli("tuner", "wait", "1", "--tracker", address.format(port=free_port()), timeout=25)
    assert proc.returncode == 1
    assert last_line(proc.stderr).startswith("tuner: error: daemon unreachable")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_client_retries_only_for_a_daemon_it_reached(tmp_path):
    never = FleetClient(f"127.0.0.1:{free_port()}", on_outage=pytest.fail)
    with never, pytest.raises(Unavailable):
        never.job_when_reachable(1)

    port = free_port()
    notes: list[str] = []
    with TuningLog(f"sqlite:///{tmp_path / 'd.db'}") as log:
        daemon = start_daemon(log, f"127.0.0.1:{port}")
        with FleetClient(daemon.address, on_outage=notes.append) as client:
            job = client.submit(JobSpec("matmul(M=2,N=2,K=4)", "nobody", target="sleep", strategy="random", trials=2))
            daemon.stop()
            with pytest.raises(Unavailable, match="unreachable for 0.5 s"):
                client.job_when_reachable(job.job_id, reconnect_s=0.5)
            assert len(notes) == 1 and notes[0].startswith(f"lost the daemon at {daemon.address}; retrying")

            restarted = []
            timer = threading.Timer(1.0, lambda: restarted.append(start_daemon(log, f"127.0.0.1:{port}")))
            timer.start()
            try:
                assert client.job_when_reachable(job.job_id, reconnect_s=60).job_id == job.job_id
            finally:
                timer.join()
                for again in restarted:
                    again.stop()
    assert len(notes) == 2


# -- 2. HOST:PORT -----------------------------------------------------------------------------------------------
BAD_ADDRESSES = ["localhost:99999", "localhost", "localhost:-1", "", ":9190", "::1:9190", "[::1", "local host:9190",
                 "localhost:9x"]


@pytest.mark.parametrize("address", BAD_ADDRESSES + ["localhost:0"])
def test_tracker_takes_host_and_port_1_to_65535(capsys, address):
    message = f"argument --tracker: expected HOST:PORT[,HOST:PORT...] with PORT 1-65535, not {address!r}"
    assert rejected(tuner_main, capsys, "status", "1", "--tracker", address).endswith(message)
    assert rejected(tuner_main, capsys, "tune", "--workload", W, "--tracker", address).endswith(message)
    assert rejected(agent_main, capsys, "--tracker", address, "--key", "k").endswith(message)
    # in a list of a leader and its standbys, the bad one is named
    assert rejected(agent_main, capsys, "--tracker", f"a:9190,{address}", "--key", "k").endswith(message)


@pytest.mark.parametrize("option", ["--listen", "--metrics-listen"])
@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_listen_addresses_take_port_0_to_65535(capsys, option, address):
    message = f"argument {option}: expected HOST:PORT with PORT 0-65535, not {address!r}"
    assert rejected(tuner_main, capsys, "daemon", option, address).endswith(message)


@pytest.mark.parametrize("address", ["localhost:9190", "10.0.0.1:1", "[::1]:9190", "server.example:65535"])
def test_good_addresses_are_accepted(address):
    assert tuner_parser().parse_args(["status", "1", "--tracker", address]).tracker == address
    assert agent_parser().parse_args(["--tracker", address]).tracker == address
    daemon = tuner_parser().parse_args(["daemon", "--listen", address, "--metrics-listen", "[::]:0"])
    assert (daemon.listen, daemon.metrics_listen) == (address, "[::]:0")


@pytest.mark.parametrize("trackers", ["a:9190,b:9190", "[::1]:9190,10.0.0.1:1"])
def test_a_leader_and_its_standbys_are_one_tracker(trackers):
    assert tuner_parser().parse_args(["status", "1", "--tracker", trackers]).tracker == trackers
    assert agent_parser().parse_args(["--tracker", trackers]).tracker == trackers


# -- 3. integers within what protobuf and SQLite hold ----------------------------------------------------------
@pytest.mark.parametrize("argv, option, bounds", [
    (["tune", "--workload", W, "--seed", HUGE], "--seed", f"0 to {INT64_MAX}"),
    (["tune", "--workload", W, "--trials", HUGE], "--trials", f"1 to {INT32_MAX}"),
    (["tune", "--workload", W, "--trials", "2147483648"], "--trials", f"1 to {INT32_MAX}"),
    (["tune", "--workload", W, "--priority", HUGE], "--priority", f"-2147483648 to {INT32_MAX}"),
    (["tune", "--workload", W, "--early-stopping", HUGE], "--early-stopping", f"1 to {INT32_MAX}"),
    (["submit", "--workload", W, "--trials", HUGE, "--tracker", "h:1", "--rpc-key", "k"], "--trials",
     f"1 to {INT32_MAX}"),
    (["submit", "--workload", W, "--priority", "-2147483649", "--tracker", "h:1", "--rpc-key", "k"], "--priority",
     f"-2147483648 to {INT32_MAX}"),
    (["status", HUGE, "--tracker", "h:1"], "JOB", f"1 to {INT64_MAX}"),
    (["cancel", HUGE, "--tracker", "h:1"], "JOB", f"1 to {INT64_MAX}"),
    (["report", HUGE, "-o", "r.html"], "JOB", f"1 to {INT64_MAX}"),
    (["log", "prune", "--keep-best", HUGE, "--dry-run"], "--keep-best", f"0 to {INT64_MAX}"),
    (["log", "prune", "--keep-best", "-1", "--dry-run"], "--keep-best", f"0 to {INT64_MAX}"),
])
def test_integers_out_of_range_are_refused(capsys, argv, option, bounds):
    value = argv[argv.index(option) + 1] if option != "JOB" else argv[1]
    line = rejected(tuner_main, capsys, *argv)
    assert line.endswith(f"argument {option}: must be an integer from {bounds}, not {value!r}")


def test_largest_values_are_accepted():
    args = tuner_parser().parse_args(["tune", "--workload", W, "--seed", INT64_MAX, "--trials", INT32_MAX,
                                      "--priority", "-2147483648"])
    assert (args.seed, args.trials, args.priority) == (2**63 - 1, 2**31 - 1, -(2**31))


# -- 4. seeds are >= 0 everywhere -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["tune", "--workload", W],
    ["submit", "--workload", W, "--tracker", "h:1", "--rpc-key", "k"],
    ["tune-model", "model.onnx", "--trials", "4"],
    ["bench-strategies", "--space", SPACE],
    ["verify", "--workload", "matmul_16x16x16", "--samples", "1"],
])
def test_negative_seed_is_refused(capsys, argv):
    line = rejected(tuner_main, capsys, *argv, "--seed", "-1")
    assert line.endswith(f"argument --seed: must be an integer from 0 to {INT64_MAX}, not '-1'")


def test_bench_seeds_of_later_repeats_stay_in_range(capsys):
    line = rejected(tuner_main, capsys, "bench-strategies", "--space", SPACE, "--seed", INT64_MAX, "--repeats", "2")
    assert line == f"tuner: error: --seed + --repeats - 1 must be at most {INT64_MAX}"


# -- 5. output paths --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["/proc/no-such.json", "directory"])
def test_bench_json_out_is_checked_before_the_benchmark(capsys, tmp_path, target):
    path = str(tmp_path) if target == "directory" else target
    code = tuner_main(["bench-strategies", "--space", SPACE, "--budgets", "5", "--repeats", "1", "--json-out", path])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""  # nothing benchmarked
    assert last_line(err).startswith(f"tuner: error: cannot write {path}: ")
    assert len(err.strip().splitlines()) == 1


def test_bench_json_out_is_written(capsys, tmp_path):
    path = tmp_path / "out.json"
    assert tuner_main(["bench-strategies", "--space", SPACE, "--budgets", "5", "--repeats", "1",
                       "--strategies", "random", "--json-out", str(path)]) == 0
    assert path.read_text().startswith("[")


def test_log_export_into_a_directory_is_one_line(capsys, tmp_path):
    db = f"sqlite:///{tmp_path / 'log.db'}"
    TuningLog(db).close()
    code, err = run_main(tuner_main, capsys, "log", "export", "--db", db, "-o", str(tmp_path))
    assert code == 1
    assert err == f"tuner: error: cannot write {tmp_path}: Is a directory\n"
    assert [p.name for p in tmp_path.iterdir()] == ["log.db"]  # no temporary file left behind


# -- 6. measure-agent measure -----------------------------------------------------------------------------------
@pytest.mark.parametrize("option, value, message", [
    ("--timeout", "nan", "must be a finite number > 0, not 'nan'"),
    ("--timeout", "-1", "must be a finite number > 0, not '-1'"),
    ("--min-repeat-ms", "nan", "must be a finite number >= 0, not 'nan'"),
    ("--min-repeat-ms", "inf", "must be a finite number >= 0, not 'inf'"),
    ("--number", "99999999999999999999", f"must be an integer from 1 to {INT32_MAX}, not '99999999999999999999'"),
    ("--number", "0", f"must be an integer from 1 to {INT32_MAX}, not '0'"),
    ("--repeat", "0", f"must be an integer from 1 to {INT32_MAX}, not '0'"),
])
def test_agent_measure_refuses_bad_timing_up_front(capsys, option, value, message):
    line = rejected(agent_main, capsys, "measure", "--workload", W, option, value)
    assert line.endswith(f"argument {option}: {message}")
    assert "warmup" not in line


def test_agent_parallel_is_checked_by_the_parser(capsys):
    line = rejected(agent_main, capsys, "--tracker", "h:9190", "--key", "k", "--parallel", "0")
    assert line.endswith(f"argument --parallel: must be an integer from 1 to {INT32_MAX}, not '0'")


# -- 7. one message per float type, naming its real bound -------------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["tune", "--workload", W], "--time-budget"),
    (["tune", "--workload", W], "--timeout"),
    (["daemon"], "--heartbeat-interval"),
    (["daemon"], "--agent-timeout"),
])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "x"])
def test_positive_seconds_have_one_message(capsys, argv, option, value):
    line = rejected(tuner_main, capsys, *argv, option, value)
    assert line.endswith(f"argument {option}: must be a finite number > 0, not {value!r}")


@pytest.mark.parametrize("value", ["-1", "nan", "-inf"])
def test_non_negative_seconds_have_one_message(capsys, value):
    line = rejected(tuner_main, capsys, "tune", "--workload", W, f"--wait-timeout={value}")  # -inf is no option
    assert line.endswith(f"argument --wait-timeout: must be a finite number >= 0, not {value!r}")


@pytest.mark.parametrize("value", ["1", "-0.1", "nan", "x"])
def test_reuse_share_is_a_fraction_below_one(capsys, value):
    line = rejected(tuner_main, capsys, "tune", "--workload", W, f"--reuse-share={value}")
    assert line.endswith(f"argument --reuse-share: must be a finite number in [0, 1), not {value!r}")


# -- 8. --rpc-key without --tracker; a daemon that cannot bind --------------------------------------------------
@pytest.mark.parametrize("argv, command", [
    (["tune", "--workload", W, "--rpc-key", "k"], "tune"),
    (["tune-model", "model.onnx", "--trials", "4", "--rpc-key", "k"], "tune-model"),
])
def test_rpc_key_needs_a_tracker(capsys, argv, command):
    code, err = run_main(tuner_main, capsys, *argv)
    assert code == 2
    assert err == (f"tuner: error: --rpc-key needs --tracker HOST:PORT: without a daemon, {command} measures "
                   "on this host\n")


@pytest.mark.timeout(60)
def test_daemon_that_cannot_bind_says_why_in_one_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        in_use = f"127.0.0.1:{taken.getsockname()[1]}"
        for address, reason in ((in_use, "Address already in use"), ("nohost.invalid:9190", "")):
            proc = run_cli("tuner", "daemon", "--listen", address, "--db", f"sqlite:///{tmp_path / 'd.db'}")
            assert proc.returncode == 1
            assert proc.stderr.startswith(f"tuner: error: cannot start the daemon on {address}: {reason}")
            assert len(proc.stderr.strip().splitlines()) == 1  # no gRPC log line, no token warning first


@pytest.mark.timeout(60)
def test_a_free_port_still_binds(tmp_path):
    port = free_port()
    daemon = subprocess.Popen([sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{port}",
                               "--db", f"sqlite:///{tmp_path / 'd.db'}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert f"listening on 127.0.0.1:{port}" in daemon.stdout.readline()
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
