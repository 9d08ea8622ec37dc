"""Database faults lose nothing: while the tuning log is away a job holds its results and retries;
when it returns the job finishes with exactly its budget of distinct trials (SQLite and PostgreSQL)."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time

import pytest
from sqlalchemy.engine import make_url

from measure_agent.engine import TimingConfig
from tuner.daemon import FleetClient
from tuner.fleet import JobSpec
from tuner.log import TuningLog

from fleet_helpers import FakeAgent, start_daemon, wait_for
from test_leadership import pg_url  # noqa: F401 - fixture
from test_tuning_log import pg_admin  # noqa: F401 - fixture of pg_url

pytestmark = pytest.mark.timeout(180)
JOB = JobSpec("matmul(M=2,N=2,K=1)", "fake", target="sleep", strategy="random", trials=24,
              timing=TimingConfig(repeat=1, warmup=0, run_timeout_s=5, build_timeout_s=5))


def slow_costs(n: int) -> float:
    time.sleep(0.1)  # the job spans a few seconds, so the outage falls in its middle
    return 1e-3 * (n + 1)


def _run_through_outage(log: TuningLog, outage) -> tuple[object, list[str]]:
    """Run JOB on a fake agent; ``outage()`` (called once 4 trials are in) takes the log away and
    returns after bringing it back. The statuses' messages seen meanwhile are returned too."""
    daemon = start_daemon(log)
    agent = FakeAgent(daemon.address, cost_of=slow_costs)
    notes: list[str] = []
    try:
        with FleetClient(daemon.address) as client:
            job = client.submit(JOB)
            wait_for(lambda: len(log.trials(job_id=job.job_id)) >= 4, what="trials before the outage")
            watcher = threading.Thread(target=lambda: notes.extend(s.message for s in client.watch(job.job_id)),
                                       daemon=True)
            watcher.start()
            outage()
            watcher.join(timeout=120)
            final = client.job(job.job_id)
        return final, notes
    finally:
        agent.stop()
        daemon.stop()


def _assert_exact_budget(log: TuningLog, final) -> None:
    assert final.state == "done", final.message
    trials = log.trials(job_id=final.job_id)
    digests = [t.config_digest for t in trials]
    assert len(trials) == JOB.trials and len(set(digests)) == JOB.trials  # nothing lost, nothing twice
    assert final.done == JOB.trials


def test_sqlite_locked_past_its_busy_timeout(tmp_path, monkeypatch):
    from tuner.log import database

    monkeypatch.setattr(database, "SQLITE_BUSY_TIMEOUT_S", 1)
    path = tmp_path / "locked.db"
    with TuningLog(f"sqlite:///{path}") as log:
        def hold_the_lock() -> None:
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN EXCLUSIVE")
            time.sleep(4)  # well past the 1 s busy timeout
            other.execute("ROLLBACK")
            other.close()

        final, notes = _run_through_outage(log, hold_the_lock)
        _assert_exact_budget(log, final)
    assert any("the tuning log is unavailable" in note for note in notes)


class CuttableProxy:
    """A TCP proxy to ``target`` that can drop every connection and refuse new ones for a while."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = threading.Event()
        self.open.set()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open.is_set():
                client.close()  # refused while cut
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.open.clear()
        with self._lock:
            for s in self._sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._sockets.clear()

    def restore(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture()
def pg_database(pg_url):
    """A fresh PostgreSQL database's URL (dropped afterwards); skipped when the server is unreachable."""
    return make_url(pg_url)


def test_postgresql_connections_cut_mid_job(pg_database):
    proxy = CuttableProxy((pg_database.host or "127.0.0.1", pg_database.port or 5432))
    url = pg_database.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    try:
        with TuningLog(url) as log:
            def cut_for_a_while() -> None:
                proxy.cut()
                time.sleep(3)
                proxy.restore()

            final, notes = _run_through_outage(log, cut_for_a_while)
            _assert_exact_budget(log, final)
        assert any("the tuning log is unavailable" in note for note in notes)
    finally:
        proxy.close()


@pytest.fixture()
def tiny_disk(tmp_path):
    """A 4 MiB tmpfs (needs root and mount permission; skipped with the reason otherwise)."""
    import subprocess

    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill: {done.stderr.strip() or done.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def test_a_full_disk_mid_job(tiny_disk):
    filler = tiny_disk / "filler"
    with TuningLog(f"sqlite:///{tiny_disk / 'full.db'}") as log:
        def fill_then_free() -> None:
            with open(filler, "wb") as out:  # take every free block
                try:
                    while True:
                        out.write(b"\0" * 65536)
                        out.flush()
                except OSError:
                    pass
            time.sleep(3)
            filler.unlink()

        final, notes = _run_through_outage(log, fill_then_free)
        _assert_exact_budget(log, final)
    assert any("the tuning log is unavailable" in note for note in notes)
