"""The kernel cache's size cap: least recently used whole entries go first, kept ones never."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import measure_agent.engine.engine as engine_module
from measure_agent.cli import main as agent_main
from measure_agent.engine import MeasureEngine, MeasureInput, MeasureStatus, TimingConfig
from measure_agent.engine.build import source_digest
from measure_agent.engine.kernel_cache import Eviction, ScanSchedule, cache_entries, evict_to_cap, mark_used
from measure_agent.templates import testing_catalog
from measure_agent.workload import parse_workload

KB = 1024


def fake_entry(cache_dir: Path, digest: str, used_at: float, size_kb: int = 10) -> list[Path]:
    """A kernel's source and numba's index and data files, as numba lays them out, last used at ``used_at``."""
    kernels = cache_dir / "kernels"
    (kernels / "__pycache__").mkdir(parents=True, exist_ok=True)
    files = [kernels / f"k_{digest}.py", kernels / "__pycache__" / f"k_{digest}.kernel-3.py311.nbi",
             kernels / "__pycache__" / f"k_{digest}.kernel-3.py311.1.nbc"]
    files[0].write_text("def kernel(A, B, out):\n    pass\n")
    files[1].write_bytes(b"i" * KB)
    files[2].write_bytes(b"c" * (size_kb * KB - KB - files[0].stat().st_size))
    for path in files:
        os.utime(path, (used_at, used_at))
    return files


def total_bytes(cache_dir: Path) -> int:
    return sum(e.size_bytes for e in cache_entries(cache_dir))


def test_entries_group_a_kernels_source_with_numbas_files(tmp_path):
    files = fake_entry(tmp_path, "aaaa", used_at=1000)
    fake_entry(tmp_path, "bbbb", used_at=2000)
    (tmp_path / "kernels" / "tmpx1y2.tmp").write_text("half-written source")  # not an entry
    entries = cache_entries(tmp_path)
    assert [e.digest for e in entries] == ["aaaa", "bbbb"]
    assert set(entries[0].files) == set(files) and entries[0].size_bytes == 10 * KB
    assert entries[0].last_used == 1000


def test_eviction_removes_least_recently_used_whole_entries_until_under_the_cap(tmp_path):
    used = {"d1": 5000, "d2": 1000, "d3": 4000, "d4": 2000, "d5": 3000}  # oldest: d2, d4, d5, d3, d1
    files = {digest: fake_entry(tmp_path, digest, at) for digest, at in used.items()}
    stray = tmp_path / "kernels" / "tmpabc.tmp"
    stray.write_text("x")
    eviction = evict_to_cap(tmp_path, 25 * KB)
    assert [e.digest for e in eviction.evicted] == ["d2", "d4", "d5"]
    assert total_bytes(tmp_path) == eviction.remaining_bytes == 20 * KB <= 25 * KB
    assert eviction.remaining_entries == 2
    for digest in ("d2", "d4", "d5"):
        assert not any(path.exists() for path in files[digest])  # numba's files go with their source
    for digest in ("d1", "d3"):
        assert all(path.exists() for path in files[digest])
    assert stray.exists()
    assert evict_to_cap(tmp_path, 25 * KB).evicted == ()  # under the cap: nothing more


def test_eviction_goes_down_to_the_target_once_past_the_cap(tmp_path):
    for i in range(10):
        fake_entry(tmp_path, f"d{i}", used_at=1000 + i)  # 100 KB
    assert evict_to_cap(tmp_path, 100 * KB, target_bytes=50 * KB).evicted == ()  # at the cap: not past it
    eviction = evict_to_cap(tmp_path, 95 * KB, target_bytes=60 * KB)
    assert [e.digest for e in eviction.evicted] == ["d0", "d1", "d2", "d3"]
    assert eviction.remaining_bytes == 60 * KB == total_bytes(tmp_path)


def test_entries_in_use_are_never_evicted_even_when_oldest(tmp_path):
    for digest, at in {"old": 1000, "mid": 2000, "new": 3000}.items():
        fake_entry(tmp_path, digest, at)
    eviction = evict_to_cap(tmp_path, 15 * KB, keep={"old"})
    assert [e.digest for e in eviction.evicted] == ["mid", "new"]  # only the kept one is left
    assert [e.digest for e in cache_entries(tmp_path)] == ["old"]
    assert evict_to_cap(tmp_path, 1 * KB, keep={"old"}).evicted == ()  # over the cap, but all of it in use


def test_no_cap_evicts_nothing(tmp_path):
    fake_entry(tmp_path, "a", 1000, size_kb=50)
    assert evict_to_cap(tmp_path, 0).evicted == () and total_bytes(tmp_path) == 50 * KB
    assert evict_to_cap(tmp_path / "never-written", 1).evicted == ()


def test_a_use_moves_an_entry_to_the_back_without_touching_its_mtime(tmp_path):
    source = fake_entry(tmp_path, "first", 1000)[0]
    fake_entry(tmp_path, "second", 2000)
    mtime_ns = source.stat().st_mtime_ns
    mark_used(source)
    assert source.stat().st_mtime_ns == mtime_ns  # numba's index checks the source's mtime
    assert [e.digest for e in cache_entries(tmp_path)] == ["second", "first"]
    assert [e.digest for e in evict_to_cap(tmp_path, 10 * KB).evicted] == ["second"]


def age(cache_dir: Path, digest: str, used_at: float) -> None:
    for entry in cache_entries(cache_dir):
        if entry.digest == digest:
            for path in entry.files:
                os.utime(path, (used_at, used_at))


def test_scans_wait_until_the_kernels_built_since_may_have_filled_the_cap():
    schedule = ScanSchedule(max_bytes=1000 * KB)
    assert schedule.built(1)  # never scanned: due
    schedule.scanned(Eviction((), remaining_bytes=600 * KB, remaining_entries=6))  # 100 KB an entry
    assert [schedule.built(1) for _ in range(5)] == [False, False, False, False, True]  # 700 .. 1000, 1100 KB
    schedule.scanned(Eviction((), remaining_bytes=900 * KB, remaining_entries=9))
    assert schedule.built(2)  # 1100 KB
    assert not ScanSchedule(max_bytes=0).built(100)  # no cap, no scans


def test_engine_holds_its_cache_to_the_cap_and_never_evicts_a_batch_not_yet_run(tmp_path, monkeypatch):
    scans = []

    def counted(*args, **kwargs):
        scans.append(kwargs["target_bytes"])
        return evict_to_cap(*args, **kwargs)

    monkeypatch.setattr(engine_module, "evict_to_cap", counted)
    monkeypatch.setattr(ScanSchedule, "built", lambda self, kernels: True)  # every build scans here
    for i in range(4):
        fake_entry(tmp_path, f"stale{i}", used_at=1000 + i, size_kb=512)  # 2 MB of old kernels
    workload = parse_workload("matmul(M=4,N=3,K=2)")
    space = testing_catalog().get("matmul", "cpu").space(workload)
    a, b, c, d = (MeasureInput(workload, space.make({"behaviour": "ok", "sleep_ms": 0, "variant": v}))
                  for v in (0, 1, 2, 3))
    timing = TimingConfig(number=1, repeat=1, min_repeat_ms=0, build_timeout_s=120, run_timeout_s=30)
    with MeasureEngine(timing, catalog="testing", cache_dir=tmp_path, cache_max_mb=1) as engine:
        batch_a = engine.prepare([a])
        kernel_a = batch_a[0].kernel
        assert kernel_a == source_digest(testing_catalog().get("matmul", "cpu").render(workload, a.config))
        [entry_a] = [e for e in cache_entries(tmp_path) if e.digest == kernel_a]
        assert {p.suffix for p in entry_a.files} == {".py", ".nbi", ".nbc"}  # numba's real layout is one entry
        age(tmp_path, kernel_a, used_at=1)  # the oldest of all now, but prepared and not yet run
        assert scans == [int(0.9 * 1024 * KB)]  # eviction goes down to 90% of the cap
        batch_b = engine.prepare([b])
        left = {e.digest for e in cache_entries(tmp_path)}
        assert left == {kernel_a, batch_b[0].kernel, "stale3"} and total_bytes(tmp_path) <= 1024 * KB
        assert [r.status for r in engine.run(batch_a)] == [MeasureStatus.OK]  # A is run: no longer kept
        age(tmp_path, kernel_a, used_at=1)  # (running it was a use)
        for i in (4, 5):
            fake_entry(tmp_path, f"stale{i}", used_at=2000 + i, size_kb=512)
        batch_cd = engine.prepare([c, d])
        assert len(scans) == 3
        left = {e.digest for e in cache_entries(tmp_path)}
        assert kernel_a not in left  # no longer in use, and the oldest
        assert {batch_b[0].kernel, batch_cd[0].kernel, batch_cd[1].kernel} <= left
        assert left & {"stale3", "stale4", "stale5"} <= {"stale5"}  # oldest first (stale5 goes too if kernels are big)
        assert total_bytes(tmp_path) <= 0.9 * 1024 * KB
        assert [r.status for r in engine.run(batch_b)] == [MeasureStatus.OK]


def test_engine_refuses_a_negative_cap(tmp_path):
    with pytest.raises(ValueError, match="cache_max_mb"):
        MeasureEngine(catalog="testing", cache_dir=tmp_path, cache_max_mb=-1)


def test_agent_cache_cap_is_checked_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        agent_main(["--tracker", "h:9190", "--key", "k", "--cache-max-mb", "-5"])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith("argument --cache-max-mb: must be an integer from 0 to 1099511627776, not '-5'")
