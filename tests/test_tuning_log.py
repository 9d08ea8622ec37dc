"""Tests of the tuning log (tuner.log) on SQLite and PostgreSQL, and of tuner.settings.

PostgreSQL tests use the server at ``$TUNEFLEET_TEST_PG`` (default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``): each test creates its own databases through
the server's ``postgres`` database and drops them afterwards. They are skipped only when the server
cannot be reached.
"""

from __future__ import annotations

import io
import re
import json
import os
import threading
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from measure_agent.engine.types import MeasureResult, MeasureStatus
from measure_agent.space import Config
from measure_agent.workload import WorkloadError
from tuner import settings
from tuner.log import (
    LogFormatError,
    NotFoundError,
    RecordError,
    TrialRecord,
    TuningLog,
    TuningLogError,
    export_trials,
    import_trials,
)

PG_URL = os.environ.get("TUNEFLEET_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
WL = "matmul(M=64,N=64,K=64,dtype=float32)"
WL2 = "matmul(M=128,N=64,K=32,dtype=float64)"
T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def pg_admin():
    """An AUTOCOMMIT engine on the server's ``postgres`` database, or a skip if unreachable."""
    url = make_url(PG_URL).set(database="postgres")
    engine = create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        engine.dispose()
        pytest.skip(f"PostgreSQL unreachable at {PG_URL}: {str(exc).splitlines()[0]}")
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def new_db(request, tmp_path):
    """Factory of URLs of fresh, empty databases on the parametrised backend."""
    if request.param == "sqlite":
        paths = iter(range(1000))
        yield lambda: f"sqlite:///{tmp_path / f'log{next(paths)}.db'}"
        return
    admin = request.getfixturevalue("pg_admin")
    created: list[str] = []

    def make() -> str:
        name = f"tf_test_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        created.append(name)
        return make_url(PG_URL).set(database=name).render_as_string(hide_password=False)

    yield make
    with admin.connect() as conn:
        for name in created:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def log(new_db):
    with TuningLog(new_db()) as opened:
        yield opened


def trial(config: dict, status: str = "ok", mean: float | None = 1.0, *, workload: str = WL,
          device: str = "dev-a", target: str = "cpu", at: int = 0, **extra) -> TrialRecord:
    """A record; ``at`` is microseconds after T0, so tests control the order in time."""
    ok = status == "ok"
    return TrialRecord(
        workload_key=workload,
        device_key=device,
        target=target,
        config=config,
        status=status,
        costs=(mean, mean) if ok else (),
        mean_s=mean if ok else None,
        created_at=T0 + timedelta(microseconds=at),
        **extra,
    )


# -- recording ----------------------------------------------------------------------------------
def test_record_then_duplicate_is_a_noop(log):
    first = trial({"tile": 8}, mean=0.5, message="first")
    assert log.record_trial(first) is True
    again = trial({"tile": 8}, mean=0.1, message="second", at=5)
    assert log.record_trial(again) is False
    # Another spelling of the same workload is the same workload.
    assert log.record_trial(trial({"tile": 8}, workload="matmul(M=64, N=64, K=64)")) is False
    stored = log.trials()
    assert stored == [first]
    assert stored[0].created_at == T0 and stored[0].created_at.tzinfo is timezone.utc
    # The same config on another device or target is a different measurement.
    assert log.record_trial(trial({"tile": 8}, device="dev-b")) is True
    assert log.record_trial(trial({"tile": 8}, target="cpu-avx512")) is True
    assert log.record_trials([trial({"tile": 8}), trial({"tile": 16}), trial({"tile": 16})]) == 1
    assert len(log.trials()) == 4
    assert log.workload_keys() == [WL]
    assert log.device_keys() == ["dev-a", "dev-b"]


def test_a_large_group_is_recorded_in_order_and_counted_exactly(log):
    """A group of trials is one statement (in pages): duplicates within it and of earlier rows are
    skipped, the first of a config is the one kept, and the count says how many were new."""
    log.record_trial(trial({"i": 7}, message="earlier"))
    group = [trial({"i": i % 2100}, at=i, message=str(i)) for i in range(2300)]
    assert log.record_trials(group) == 2099
    stored = log.trials()
    assert len(stored) == 2100
    assert stored[0].message == "earlier"
    assert [t.message for t in stored[1:]] == [str(i) for i in range(2100) if i != 7]


def test_measured_digests_cover_every_status(log):
    configs = [Config((("tile", t), ("split", (2, t)))) for t in (4, 8, 16)]
    log.record_trial(trial(configs[0].to_json(), "ok", 0.2))
    log.record_trial(trial(configs[1].to_json(), "compile_error"))
    log.record_trial(trial(configs[2].to_json(), "run_timeout", device="dev-b"))
    assert log.measured_digests(WL, "dev-a", "cpu") == {configs[0].digest, configs[1].digest}
    assert log.measured_digests("matmul(K=64,N=64,M=64)", "dev-b", "cpu") == {configs[2].digest}
    assert log.measured_digests(WL, "dev-a", "gpu") == set()
    assert log.measured_digests(WL2, "dev-a", "cpu") == set()


def test_best_orders_ok_trials_by_mean_and_limits_to_top(log):
    means = [0.30, 0.10, 0.20, 0.10, 0.05]
    log.record_trials(trial({"i": i}, mean=m, at=i) for i, m in enumerate(means))
    log.record_trial(trial({"i": 99}, "wrong_answer", at=99))
    log.record_trial(trial({"i": 98}, mean=0.001, target="other"))
    log.record_trial(trial({"i": 97}, mean=0.001, device="dev-b"))

    assert [r.config["i"] for r in log.best(WL, "dev-a")] == [4]
    # Equal means: the earlier trial first.
    assert [r.config["i"] for r in log.best(WL, "dev-a", "cpu", top=3)] == [4, 1, 3]
    assert [r.mean_s for r in log.best(WL, "dev-a", top=100)] == sorted(means)
    assert log.best(WL2, "dev-a") == []
    with pytest.raises(ValueError):
        log.best(WL, "dev-a", top=0)


def test_trials_filters_and_order(log):
    log.record_trial(trial({"k": 1}, at=30))
    log.record_trial(trial({"k": 2}, "compile_error", at=10))
    log.record_trial(trial({"k": 3}, workload=WL2, at=20))
    log.record_trial(trial({"k": 4}, device="dev-b", target="gpu", at=0))
    log.record_trial(trial({"k": 5}, "runtime_error", at=10))  # same time as k=2: insertion order

    def ks(**filters):
        return [r.config["k"] for r in log.trials(**filters)]

    assert ks() == [4, 2, 5, 3, 1]
    assert ks(workload_key=WL) == [4, 2, 5, 1]
    assert ks(workload_key="matmul(M=128,N=64,K=32,dtype=float64)") == [3]
    assert ks(device_key="dev-b") == [4]
    assert ks(target="cpu") == [2, 5, 3, 1]
    assert ks(status="ok") == [4, 3, 1]
    assert ks(workload_key=WL, device_key="dev-a", target="cpu", status="compile_error") == [2]
    assert ks(device_key="nobody") == []
    # by config: its trials on every workload, device and target, or on one of them
    digest = Config((("k", 1),)).digest
    assert ks(config_digest=digest) == [1] and ks(config_digest=digest, device_key="dev-b") == []
    assert ks(config_digest="0" * 16) == []
    with pytest.raises(ValueError):
        log.trials(status="bogus")
    with pytest.raises(WorkloadError):
        log.trials(workload_key="conv(X=1)")


def test_devices_are_upserted(log):
    log.upsert_device("dev-a", {"arch": "x86_64", "cores": 4})
    log.upsert_device("dev-a", {"arch": "x86_64", "cores": 8, "isa_features": ["avx2"]})
    assert log.device_info("dev-a") == {"arch": "x86_64", "cores": 8, "isa_features": ["avx2"]}
    log.record_trial(trial({"t": 1}, device="dev-z"))
    assert log.device_info("dev-z") == {}
    assert log.device_keys() == ["dev-a", "dev-z"]
    with pytest.raises(NotFoundError):
        log.device_info("missing")


def test_job_lifecycle(log):
    job = log.create_job("matmul(M=64,N=64,K=64)", "dev-a", "cpu", "random", 32, {"seed": 7})
    record = log.get_job(job)
    assert (record.id, record.workload_key, record.device_key, record.target) == (job, WL, "dev-a", "cpu")
    assert (record.strategy, record.trials, record.options, record.status) == ("random", 32, {"seed": 7}, "running")
    assert record.finished_at is None and not record.is_finished
    assert record.created_at.tzinfo is timezone.utc

    assert log.record_trial(trial({"t": 1}, job_id=job)) is True
    assert log.record_trial(trial({"t": 2})) is True
    assert [r.config for r in log.trials(job_id=job)] == [{"t": 1}]
    assert log.trials(job_id=job)[0].job_id == job

    # A trial naming a job of another workload, or an unknown job, is refused; the batch is atomic.
    with pytest.raises(TuningLogError):
        log.record_trials([trial({"t": 3}), trial({"t": 4}, workload=WL2, job_id=job)])
    with pytest.raises(NotFoundError):
        log.record_trial(trial({"t": 5}, job_id=job + 100))
    assert len(log.trials()) == 2

    assert log.finish_job(job, "done") is True
    assert log.finish_job(job, "cancelled") is False  # first final status wins
    done = log.get_job(job)
    assert done.status == "done" and done.is_finished
    assert done.finished_at is not None and done.finished_at >= done.created_at
    with pytest.raises(ValueError):
        log.finish_job(job, "running")
    with pytest.raises(NotFoundError):
        log.finish_job(job + 100, "failed")
    with pytest.raises(NotFoundError):
        log.get_job(job + 100)
    with pytest.raises(ValueError):
        log.create_job(WL, "dev-a", "cpu", "random", 0)


# -- JSON lines -------------------------------------------------------------------------------
def _rich_log(log: TuningLog) -> None:
    log.upsert_device("dev-a", {"arch": "x86_64", "cpu_model": "Épyc™ 7B13", "cores": 2,
                                "isa_features": ["avx2", "fma"], "numba_version": "0.60.0"})
    log.upsert_device("dev-b", {"arch": "aarch64", "cores": 4, "extra": {"board": "pi"}})
    awkward = [0.1, 1e-300, 5e-324, 1 / 3, 123456789.123456789, 2.0 ** -40]
    records = []
    for i, value in enumerate(awkward):
        records.append(TrialRecord(
            workload_key=WL if i % 2 else WL2, device_key="dev-a" if i < 4 else "dev-b",
            target="cpu", config={"tile": [i, 2 * i], "unroll": i % 2 == 0, "name": f"ü{i}\x00😀"},
            status="ok", costs=(value, value * 2, 0.0), mean_s=value, compile_time_s=value / 7,
            message="", agent="agent-1", template_version="v2",
            created_at=T0 + timedelta(seconds=i, microseconds=i)))
    records.append(TrialRecord(WL, "dev-a", "gpu", {"tile": 1}, "compile_error", (), None, 0.25,
                               "error:\n\tline \"2\" \u2603", "agent-2", "v2", T0))
    records.append(TrialRecord(WL, "dev-a", "cpu", {"tile": 2}, "run_timeout", (), None, 1.5,
                               "timed out", "agent-2", "v1", T0 + timedelta(days=400)))
    # A non-UTC input time is stored as the same instant in UTC.
    records.append(TrialRecord(WL, "dev-b", "cpu", {"tile": 3}, "ok", (2.5,), 2.5, 0.0, "", "a", "v1",
                               datetime(2024, 5, 1, 14, 0, 0, 1, tzinfo=timezone(timedelta(hours=2)))))
    assert log.record_trials(records) == len(records)


def test_export_import_export_is_byte_identical(new_db):
    with TuningLog(new_db()) as source:
        _rich_log(source)
        first = io.StringIO()
        count = export_trials(source, first)
        expected = {(r.workload_key, r.device_key, r.target, r.config_digest): r for r in source.trials()}
    text = first.getvalue()
    lines = text.splitlines()
    assert count == len(lines) == 9
    for line in lines:
        obj = json.loads(line)
        assert line == json.dumps(obj, sort_keys=True, separators=(",", ":"))
        assert (obj["format"], obj["version"]) == ("tunefleet-log", 1)
        assert obj["timestamp"].endswith("Z") and len(obj["timestamp"]) == len("2024-05-01T12:00:00.123456Z")
    order = [(o["workload"], o["device_key"], o["target"], o["timestamp"]) for o in map(json.loads, lines)]
    assert order == sorted(order)

    with TuningLog(new_db()) as copy:
        summary = import_trials(copy, io.StringIO(text))
        assert (summary.read, summary.inserted, summary.duplicates) == (9, 9, 0)
        second = io.StringIO()
        export_trials(copy, second)
        assert second.getvalue() == text
        assert copy.device_info("dev-a")["cpu_model"] == "Épyc™ 7B13"
        for record in copy.trials():
            original = expected[(record.workload_key, record.device_key, record.target, record.config_digest)]
            assert record == original
        # Importing again changes nothing.
        again = import_trials(copy, io.StringIO(text))
        assert (again.read, again.inserted, again.duplicates) == (9, 0, 9)
        filtered = io.StringIO()
        assert export_trials(copy, filtered, workload_key=WL, device_key="dev-a") == 4
        assert filtered.getvalue().splitlines() == [l for l in lines if f'"workload":"{WL}"' in l
                                                    and '"device_key":"dev-a"' in l]


def test_import_keeps_info_of_known_devices(log):
    log.upsert_device("dev-a", {"cores": 8})
    line = json.dumps(trial({"t": 1}).to_json({"cores": 2}))
    assert import_trials(log, io.StringIO(line + "\n")).inserted == 1
    assert log.device_info("dev-a") == {"cores": 8}


def _good_lines() -> list[str]:
    return [json.dumps(trial({"t": i}, at=i).to_json({"cores": 2}), sort_keys=True) for i in range(3)]


def _set(field, value):
    def change(obj):
        obj[field] = value
    return change


def _drop(field):
    def change(obj):
        del obj[field]
    return change


BAD_LINES = {
    "missing field": (_drop("costs"), "missing field 'costs'"),
    "wrong type": (_set("costs", "0.1"), "'costs' must be a list"),
    "wrong element type": (_set("costs", [0.1, "x"]), "costs[1]"),
    "bool as number": (_set("compile_time_s", True), "compile_time_s"),
    "unknown status": (_set("status", "fast"), "status 'fast'"),
    "bad workload": (_set("workload", "conv2d(N=1)"), "unknown operator"),
    "version": (_set("version", 2), "unsupported version 2"),
    "format": (_set("format", "other"), "format"),
    "mean for failure": (_set("status", "compile_error"), "mean_s must be null"),
    "naive timestamp": (_set("timestamp", "2024-05-01T12:00:00.000001"), "no time zone"),
    "bad timestamp": (_set("timestamp", "yesterday"), "not ISO-8601"),
    "negative cost": (_set("costs", [-1.0]), "non-negative"),
    "not an object": (lambda obj: obj.clear() or obj.update(x=1), "missing field"),
    "device info disagrees": (_set("device_info", {"cores": 3}), "differs from line 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_import_rejects_a_bad_line_and_imports_nothing(tmp_path, case):
    change, problem = BAD_LINES[case]
    lines = _good_lines()
    obj = json.loads(lines[1])
    change(obj)
    lines[1] = json.dumps(obj)
    with TuningLog(f"sqlite:///{tmp_path / 'log.db'}") as log:
        with pytest.raises(LogFormatError) as info:
            import_trials(log, io.StringIO("\n".join(lines) + "\n"))
        assert info.value.line == 2
        assert str(info.value).startswith("line 2: ") and problem in str(info.value)
        assert "\n" not in str(info.value)
        assert log.trials() == [] and log.workload_keys() == [] and log.device_keys() == []


def test_truncated_or_garbled_file_names_the_line_and_imports_nothing(log):
    text = "".join(line + "\n" for line in _good_lines())
    truncated = text[: len(text) - 40]
    with pytest.raises(LogFormatError, match=r"^line 3: not valid JSON"):
        import_trials(log, io.StringIO(truncated))
    with pytest.raises(LogFormatError, match=r"^line 2: not valid JSON"):
        import_trials(log, io.StringIO(text.replace("\n", "\n{oops\n", 1)))
    with pytest.raises(LogFormatError, match=r"^line 1: a line must be a JSON object"):
        import_trials(log, io.StringIO("[1, 2]\n" + text))
    assert log.trials() == [] and log.workload_keys() == []
    # Blank lines are not trials, but they count for line numbers.
    assert import_trials(log, io.StringIO("\n" + text + "\n\n")).read == 3


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("url", [
    "not a url",
    "nosuchdialect://host/db",
    "postgresql+psycopg://postgres:secret@127.0.0.1:1/nothing",
    "sqlite:////nonexistent-dir/sub/log.db",
])
def test_bad_urls_raise_tuning_log_error(url):
    with pytest.raises(TuningLogError) as info:
        TuningLog(url)
    message = str(info.value)
    assert "\n" not in message and "secret" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_corrupt_or_foreign_sqlite_file_raises_tuning_log_error(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(os.urandom(8192))
    with pytest.raises(TuningLogError, match="garbage.db") as info:
        TuningLog(f"sqlite:///{garbage}")
    assert "\n" not in str(info.value)

    foreign = tmp_path / "foreign.db"
    engine = create_engine(f"sqlite:///{foreign}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE trials (id INTEGER PRIMARY KEY, what TEXT)")
    engine.dispose()
    with pytest.raises(TuningLogError, match="is not a tunefleet tuning log") as info:
        TuningLog(f"sqlite:///{foreign}")
    assert "\n" not in str(info.value)


def test_closed_log_refuses_calls(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'log.db'}") as log:
        pass
    log.close()
    with pytest.raises(TuningLogError, match="closed"):
        log.trials()


def test_sqlite_pragmas(tmp_path):
    path = tmp_path / "log.db"
    with TuningLog(f"sqlite:///{path}") as log:
        with log._engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def test_concurrent_writers_insert_each_config_once(new_db):
    url = new_db()
    records = [trial({"t": i}, at=i) for i in range(25)]
    results: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def writer(seed: int) -> None:
        try:
            start.wait()
            with TuningLog(url) as log:  # opening a fresh database concurrently is part of the test
                for record in records[seed::2] + records:
                    results.append(int(log.record_trial(record)))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(results) == len(records)
    with TuningLog(url) as log:
        assert len(log.trials()) == len(records)


# -- records -----------------------------------------------------------------------------------
def test_record_validation_and_canonical_form():
    config = Config((("tile", 8), ("split", (2, 4))))
    record = TrialRecord("matmul(N=64,M=64,K=64)", "dev", "cpu", config, MeasureStatus.OK, [1, 2], 1.5)
    assert record.workload_key == WL
    assert record.config == {"tile": 8, "split": [2, 4]}
    assert record.config_text == config.json_text() and record.config_digest == config.digest
    assert record.costs == (1.0, 2.0) and record.status == "ok"
    assert hash(record) == hash(TrialRecord(WL, "dev", "cpu", {"split": [2, 4], "tile": 8}, "ok", (1.0, 2.0), 1.5,
                                            created_at=record.created_at))
    with pytest.raises(RecordError):
        TrialRecord(WL, "dev", "cpu", {}, "ok", (), None)
    with pytest.raises(RecordError):
        TrialRecord(WL, "dev", "cpu", {}, "compile_error", (), 1.0)
    with pytest.raises(RecordError):
        TrialRecord(WL, "dev", "cpu", {}, "ok", (1.0,), 1.0, created_at=datetime(2024, 1, 1))
    with pytest.raises(RecordError):
        TrialRecord(WL, "dev", "cpu", {}, "ok", (float("nan"),), 1.0)
    with pytest.raises(RecordError):
        TrialRecord(WL, " dev", "cpu", {}, "ok", (1.0,), 1.0)
    for non_finite in (float("nan"), float("inf")):  # a Config's own text is not trusted with them
        with pytest.raises(RecordError, match="JSON-serialisable"):
            TrialRecord(WL, "dev", "cpu", Config((("scale", non_finite),)), "ok", (1.0,), 1.0)
    spelled = TrialRecord(WL, "dev", "cpu", Config((("mode", "NaN"),)), "ok", (1.0,), 1.0)
    assert spelled.config == {"mode": "NaN"} and spelled.config_digest == Config((("mode", "NaN"),)).digest
    with pytest.raises(RecordError):
        TrialRecord("nope", "dev", "cpu", {}, "ok", (1.0,), 1.0)
    for bad_text in ("nul\x00inside", "lone \ud800 surrogate"):
        with pytest.raises(RecordError):
            TrialRecord(WL, "dev", "cpu", {}, "compile_error", message=bad_text)
    assert TrialRecord(WL, "dev", "cpu", {"k": "nul\x00ok in config"}, "compile_error").config_text.endswith('\\u0000ok in config"}')

    result = MeasureResult(MeasureStatus.OK, costs=(0.5, 1.5), compile_time_s=2.0)
    from_result = TrialRecord.from_result(WL, "dev", "cpu", config, result, agent="a", template_version="v1")
    assert from_result.mean_s == 1.0 and from_result.compile_time_s == 2.0 and from_result.agent == "a"
    failed = TrialRecord.from_result(WL, "dev", "cpu", config, MeasureResult(MeasureStatus.WRONG_ANSWER, message="x"))
    assert failed.mean_s is None and failed.status == "wrong_answer"


finite_seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
json_scalars = st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.text(max_size=8), finite_seconds)


@hsettings(max_examples=150, deadline=None)
@given(
    config=st.dictionaries(st.text(min_size=1, max_size=6), st.one_of(json_scalars, st.lists(json_scalars, max_size=3)),
                           max_size=4),
    status=st.sampled_from([s.value for s in MeasureStatus]),
    costs=st.lists(finite_seconds, max_size=4),
    compile_time=finite_seconds,
    message=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
    micros=st.integers(0, 10**15),
)
def test_json_line_round_trip(config, status, costs, compile_time, message, micros):
    record = TrialRecord(WL, "dev", "cpu", config, status, costs, max(costs, default=0.0) if status == "ok" else None,
                         compile_time, message, "agent", "v1",
                         datetime(2000, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=micros))
    line = json.dumps(record.to_json({"cores": 1}), sort_keys=True)
    assert TrialRecord.from_json(json.loads(line)) == record


# -- settings ----------------------------------------------------------------------------------
def test_resolve_db_url_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(settings.DB_ENV_VAR, raising=False)
    default = settings.resolve_db_url(None)
    assert default == f"sqlite:///{tmp_path / 'xdg' / 'tunefleet' / 'tuning.db'}"
    assert (tmp_path / "xdg" / "tunefleet").is_dir()  # the default location is created

    monkeypatch.setenv(settings.DB_ENV_VAR, "postgresql+psycopg://u@db/tuning")
    assert settings.resolve_db_url(None) == "postgresql+psycopg://u@db/tuning"
    assert settings.resolve_db_url("") == "postgresql+psycopg://u@db/tuning"
    (tmp_path / "cli").mkdir()  # explicit locations must exist
    assert settings.resolve_db_url("sqlite:///" + str(tmp_path / "cli" / "x.db")) == f"sqlite:///{tmp_path}/cli/x.db"

    (tmp_path / "env").mkdir()
    monkeypatch.setenv(settings.DB_ENV_VAR, str(tmp_path / "env" / "log.db"))
    assert settings.resolve_db_url(None) == f"sqlite:///{tmp_path}/env/log.db"

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel").mkdir()
    assert settings.resolve_db_url("rel/t.db") == f"sqlite:///{tmp_path}/rel/t.db"

    monkeypatch.delenv(settings.DB_ENV_VAR)
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert settings.resolve_db_url(None) == f"sqlite:///{tmp_path}/home/.local/share/tunefleet/tuning.db"


def test_resolve_db_url_works_with_the_log(monkeypatch, tmp_path):
    monkeypatch.delenv(settings.DB_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "deep" / "er"))
    with TuningLog(settings.resolve_db_url(None)) as log:
        assert log.record_trial(trial({"t": 1}))
    assert Path(tmp_path / "deep" / "er" / "tunefleet" / "tuning.db").is_file()


def test_resolve_db_url_reports_uncreatable_directory(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.delenv(settings.DB_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(blocker / "sub"))
    with pytest.raises(settings.SettingsError, match="cannot create directory"):
        settings.resolve_db_url(None)
    # An explicit path is never created: a missing directory is refused, naming it.
    with pytest.raises(settings.SettingsError, match=f"no directory {blocker / 'sub'} for the tuning log"):
        settings.resolve_db_url(str(blocker / "sub" / "tuning.db"))


# -- device patterns, history, best per group -------------------------------------------------------
def test_device_key_patterns_and_best_across_devices(log):
    log.record_trials([
        trial({"i": 1}, mean=0.30, device="x86_64-epyc-2c-avx2"),
        trial({"i": 2}, mean=0.10, device="x86_64-xeon-8c-avx512", at=1),
        trial({"i": 3}, mean=0.05, device="aarch64-pi-4c-neon", at=2),
        trial({"i": 4}, mean=0.20, device="X86_64-upper", at=3),
    ])
    assert log.device_keys("x86_64-*") == ["x86_64-epyc-2c-avx2", "x86_64-xeon-8c-avx512"]  # case-sensitive
    assert log.device_keys("*-[0-9]c-*") == ["aarch64-pi-4c-neon", "x86_64-epyc-2c-avx2", "x86_64-xeon-8c-avx512"]
    assert log.resolve_device_keys("x86_64-?pyc*") == ["x86_64-epyc-2c-avx2"]
    assert log.resolve_device_keys("unknown-host") == ["unknown-host"]
    assert log.resolve_device_keys("nothing-*") == []
    keys = log.resolve_device_keys("x86_64-*")
    assert [(r.config["i"], r.device_key) for r in log.best(WL, keys, top=5)] == [
        (2, "x86_64-xeon-8c-avx512"), (1, "x86_64-epyc-2c-avx2")]
    assert log.best(WL, [], top=5) == []
    assert log.best(WL, "aarch64-pi-4c-neon")[0].config == {"i": 3}
    assert log.tuned_workload_keys("matmul", "float32", keys) == [WL]
    assert log.tuned_workload_keys("matmul", "float64", keys) == []


def test_trials_limit_keeps_the_most_recent_and_count(log):
    log.record_trials(trial({"k": i}, "ok" if i % 3 else "compile_error", at=100 - i) for i in range(10))
    assert [r.config["k"] for r in log.trials(WL, limit=3)] == [2, 1, 0]  # newest three, oldest first
    assert [r.config["k"] for r in log.trials(WL, "dev-a", "cpu", "ok", limit=2)] == [2, 1]
    assert len(log.trials(WL, limit=100)) == 10
    assert log.count_trials(WL) == 10 and log.count_trials(WL, status="compile_error") == 4
    assert log.count_trials(WL, ["dev-a", "dev-b"], "cpu") == 10 and log.count_trials(WL2) == 0
    with pytest.raises(ValueError):
        log.trials(limit=0)


def test_best_per_group_ranks_like_best(log):
    for device in ("dev-a", "dev-b"):
        log.record_trials(trial({"i": i}, mean=m, device=device, at=i) for i, m in enumerate([0.3, 0.1, 0.2, 0.1]))
    log.record_trial(trial({"i": 9}, mean=0.5, workload=WL2))
    log.record_trial(trial({"i": 8}, "runtime_error", workload=WL2))
    groups = log.best_per_group(2)
    assert [(r.workload_key, r.device_key, r.config["i"]) for r in groups] == [  # WL2 sorts first: "M=1" < "M=6"
        (WL2, "dev-a", 9), (WL, "dev-a", 1), (WL, "dev-a", 3), (WL, "dev-b", 1), (WL, "dev-b", 3)]
    assert log.best_per_group(2, workload_key=WL, device_key="dev-b") == log.best(WL, "dev-b", top=2)
    assert log.best_per_group(1, device_key=["dev-b"], target="gpu") == []


# -- pruning -------------------------------------------------------------------------------------------
def test_prune_keeps_the_k_best_ok_trials_and_failed_ones(log):
    job = log.create_job(WL, "dev-a", "cpu", "random", 10)
    means = [0.5, 0.1, 0.4, 0.2, 0.3]
    log.record_trials(trial({"i": i}, mean=m, at=i, job_id=job) for i, m in enumerate(means))
    log.record_trials([trial({"f": 1}, "compile_error"), trial({"f": 2}, "run_timeout")])
    log.record_trials(trial({"i": i}, mean=m, device="dev-b", at=i) for i, m in enumerate(means))
    log.record_trials(trial({"i": i}, mean=m, workload=WL2, at=i) for i, m in enumerate(means))

    dry = log.prune(2, WL, dry_run=True)
    assert (dry.groups, dry.deleted_ok, dry.deleted_failed, dry.kept) == (2, 6, 0, 6)
    assert log.count_trials() == 17
    summary = log.prune(2, WL, "dev-a")
    assert (summary.groups, summary.deleted_ok, summary.deleted_failed, summary.kept) == (1, 3, 0, 4)
    assert sorted(r.config.get("i", r.config.get("f")) for r in log.trials(WL, "dev-a")) == [1, 1, 2, 3]
    assert [r.config["i"] for r in log.best(WL, "dev-a", top=10)] == [1, 3]
    # Pruned configs are no longer "measured": a tuner may measure them again.
    assert len(log.measured_digests(WL, "dev-a", "cpu")) == 4
    assert log.get_job(job).status == "running"  # jobs are untouched
    assert log.record_trial(trial({"i": 0}, mean=0.5, job_id=job)) is True

    everything = log.prune(1, drop_failed=True)
    assert (everything.deleted_ok, everything.deleted_failed, everything.groups) == (2 + 4 + 4, 2, 3)
    assert sorted((r.workload_key, r.device_key) for r in log.trials()) == sorted(
        [(WL, "dev-a"), (WL, "dev-b"), (WL2, "dev-a")])
    assert log.prune(0, device_key=["dev-b"]).deleted_ok == 1
    assert log.prune(0, device_key=[]).deleted == 0
    with pytest.raises(ValueError):
        log.prune(-1)


# -- nearest ---------------------------------------------------------------------------------------------
class _StubTemplate:
    """A matmul template with one split knob, one shape-dependent choice and one plain choice."""

    op, target, version = "matmul", "cpu", "stub"

    def space(self, workload, device=None):
        from measure_agent.space import ChoiceKnob, ConfigSpace, SplitKnob

        k = workload["K"]
        return ConfigSpace([
            SplitKnob("tile_m", workload["M"], ((2, 4, 8, 16),)),
            ChoiceKnob("kc", tuple(sorted(({16, 32, 64} & set(range(1, k + 1))) | {k}))),
            ChoiceKnob("unroll", (1, 2)),
        ])


def _stub_catalog():
    from measure_agent.templates import TemplateCatalog

    return TemplateCatalog("stub", [_StubTemplate()])


def _mm(m, n, k, dtype="float32"):
    return f"matmul(M={m},N={n},K={k},dtype={dtype})"


def test_workload_distance_is_log_distance_over_sizes():
    from measure_agent.workload import parse_workload
    from tuner.log import workload_distance

    a = parse_workload(_mm(64, 64, 64))
    assert workload_distance(a, parse_workload(_mm(128, 64, 64))) == 1.0
    assert workload_distance(a, parse_workload(_mm(32, 64, 64))) == 1.0
    assert workload_distance(a, parse_workload(_mm(128, 128, 32))) == pytest.approx(3 ** 0.5)
    assert workload_distance(a, parse_workload(_mm(64, 64, 64, "float64"))) == float("inf")


def test_find_best_exact_then_nearest_valid_config(log):
    from tuner.log import find_best

    catalog = _stub_catalog()
    want = _mm(64, 64, 48)
    # Distance from want: (128,64,48) is 1, (64,64,96) is 1 with a smaller FLOP gap? no: equal gaps -> key.
    log.record_trials([
        trial({"tile_m": [8, 16], "kc": 64, "unroll": 1}, mean=0.1, workload=_mm(128, 64, 64)),   # kc 64 > 48
        trial({"tile_m": [8, 16], "kc": 32, "unroll": 2}, mean=0.2, workload=_mm(128, 64, 64), at=1),
        trial({"tile_m": [1, 8], "kc": 48, "unroll": 1}, mean=0.01, workload=_mm(1024, 1024, 48)),  # far away
        trial({"tile_m": [16, 4], "kc": 16, "unroll": 1}, mean=0.05, workload=_mm(64, 64, 48, "float64")),
        trial({"tile_m": [8, 8], "kc": 16, "unroll": 1}, mean=0.05, workload=_mm(64, 64, 16), device="dev-b"),
        trial({"tile_m": [1, 8], "kc": 16, "unroll": 1}, mean=0.3, workload=_mm(64, 64, 16), target="gpu"),
    ])
    assert find_best(log, want, ["dev-a"], catalog=catalog) == []
    [match] = find_best(log, want, ["dev-a"], nearest=True, catalog=catalog)
    assert match.approximate and match.tuned_workload == _mm(128, 64, 64)
    assert match.distance == pytest.approx((1 + __import__("math").log2(64 / 48) ** 2) ** 0.5)
    # The fastest config (kc=64) is not valid for K=48; the next one is, its split outer recomputed.
    assert match.record.config == {"tile_m": [8, 16], "kc": 32, "unroll": 2}
    assert match.config == {"tile_m": [4, 16], "kc": 32, "unroll": 2}
    data = match.to_json()
    assert data["approximate"] is True and data["tuned_workload"] == _mm(128, 64, 64)
    assert data["workload"] == want and data["tuned_config"] == match.record.config
    assert data["gflops"] == pytest.approx(2 * 128 * 64 * 64 / 0.2 / 1e9)

    # Several devices: the nearest over all of them (dev-b's (64,64,16) is at distance log2(3)).
    [both] = find_best(log, want, ["dev-a", "dev-b"], nearest=True, catalog=catalog)
    assert both.tuned_workload == _mm(128, 64, 64)
    [other] = find_best(log, want, ["dev-b"], nearest=True, catalog=catalog)
    assert other.tuned_workload == _mm(64, 64, 16) and other.config == {"tile_m": [8, 8], "kc": 16, "unroll": 1}
    assert find_best(log, want, ["dev-c"], nearest=True, catalog=catalog) == []
    assert find_best(log, _mm(64, 64, 48, "float64"), ["dev-a"], nearest=True, catalog=catalog)[0].approximate is False

    # An exact match wins, and comes alone; top K.
    log.record_trial(trial({"tile_m": [4, 16], "kc": 48, "unroll": 1}, mean=0.9, workload=want))
    [exact] = find_best(log, want, ["dev-a"], nearest=True, top=3, catalog=catalog)
    assert not exact.approximate and exact.distance == 0 and exact.config == {"tile_m": [4, 16], "kc": 48, "unroll": 1}
    assert exact.to_json()["tuned_workload"] == want and "distance" not in exact.to_json()
    # validate drops exact configs the template no longer accepts.
    log.record_trial(trial({"tile_m": [4, 16], "kc": 48, "unroll": 3}, mean=0.01, workload=want))
    assert find_best(log, want, ["dev-a"], catalog=catalog)[0].config["unroll"] == 3
    assert find_best(log, want, ["dev-a"], validate=True, catalog=catalog)[0].config["unroll"] == 1


# -- best-configs files --------------------------------------------------------------------------------
def test_best_file_round_trip_and_queries(log, tmp_path):
    from tuner.log import BestConfigs, BestFileError, export_best, find_best, load_best_file
    from tuner.log.bestfile import loads_best

    log.upsert_device("dev-a", {"arch": "x86_64", "cores": 2})
    for device in ("dev-a", "dev-b"):
        log.record_trials(trial({"tile_m": [16, 4], "kc": 16, "unroll": u}, mean=m, device=device, at=u)
                          for u, m in ((1, 0.2), (2, 0.1)))
    log.record_trial(trial({"tile_m": [16, 4], "kc": 16, "unroll": 1}, "compile_error", workload=WL2))
    buffer = io.StringIO()
    assert export_best(log, buffer, top=1) == 2
    doc = json.loads(buffer.getvalue())
    assert (doc["format"], doc["version"], doc["top"]) == ("tunefleet-best", 1, 1)
    assert doc["devices"] == {"dev-a": {"arch": "x86_64", "cores": 2}, "dev-b": {}}
    assert [(e["device_key"], e["rank"], e["config"]["unroll"]) for e in doc["entries"]] == [("dev-a", 1, 2), ("dev-b", 1, 2)]
    assert set(doc["entries"][0]) == {"workload", "device_key", "target", "rank", "config", "status", "mean_s", "costs",
                                      "compile_time_s", "message", "agent", "template_version", "timestamp"}
    again = io.StringIO()
    export_best(log, again, top=1)
    assert again.getvalue() == buffer.getvalue()  # deterministic

    path = tmp_path / "best.json"
    top2 = io.StringIO()
    export_best(log, top2, top=2, device_key=["dev-a"])
    path.write_text(top2.getvalue())
    configs = load_best_file(path)
    assert isinstance(configs, BestConfigs) and len(configs) == 2
    assert configs.best(WL, "dev-a", top=2) == log.best(WL, "dev-a", top=2)
    assert configs.best("matmul(K=64,N=64,M=64)", ["dev-a", "dev-b"]) == log.best(WL, "dev-a")
    assert configs.device_keys("dev-*") == ["dev-a"] and configs.device_info("dev-a")["cores"] == 2
    assert configs.tuned_workload_keys("matmul", "float32", "dev-a") == [WL]
    [near] = find_best(configs, _mm(32, 64, 64), "dev-a", nearest=True, catalog=_stub_catalog())
    assert near.approximate and near.config == {"tile_m": [8, 4], "kc": 16, "unroll": 2}

    for text, problem in [
        ("{", "line 1: not valid JSON"),
        ('{"format": "tunefleet-log"}', "JSON-lines tuning log"),
        ('{"format": "tunefleet-best", "version": 2, "entries": []}', "unsupported version 2"),
        ('{"format": "tunefleet-best", "version": 1, "entries": {}}', "'entries' must be a list"),
        ('{"format": "tunefleet-best", "version": 1, "entries": [{"workload": "x"}]}', "entries[0]: missing field"),
    ]:
        with pytest.raises(BestFileError, match=re.escape(problem)) as info:
            loads_best(text, "f.json")
        assert str(info.value).startswith("f.json: ") and "\n" not in str(info.value)
    bad = json.loads(top2.getvalue())
    bad["entries"][1]["status"] = "compile_error"
    bad["entries"][1]["mean_s"] = None
    with pytest.raises(BestFileError, match=r"entries\[1\]: status is 'compile_error'"):
        loads_best(json.dumps(bad))


# -- merging logs from several sites ------------------------------------------------------------------------
def _jsonl(records, info):
    return "".join(json.dumps(r.to_json(info), sort_keys=True) + "\n" for r in records)


def test_import_of_several_sites_merges_and_reports_device_conflicts(new_db):
    from tuner.log import DeviceInfoConflict, import_sources

    site_a = _jsonl([trial({"t": i}, at=i) for i in range(3)], {"cores": 2, "numba_version": "0.59"})
    site_b = _jsonl([trial({"t": i}, at=i) for i in range(2, 5)], {"cores": 2, "numba_version": "0.60"})
    site_c = _jsonl([trial({"t": 9}, device="dev-c")], {})
    with TuningLog(new_db()) as log:
        summary = import_sources(log, [("a.jsonl", io.StringIO(site_a)), ("b.jsonl", io.StringIO(site_b)),
                                       ("c.jsonl", io.StringIO(site_c))])
        assert (summary.read, summary.inserted, summary.duplicates, summary.sources) == (7, 6, 1, 3)
        [conflict] = summary.conflicts
        assert (conflict.device_key, conflict.kept, conflict.other, conflict.fields) == (
            "dev-a", "a.jsonl line 1", "b.jsonl line 1", ("numba_version",))
        assert "b.jsonl line 1 differs from a.jsonl line 1 in numba_version" in conflict.describe()
        assert log.device_info("dev-a")["numba_version"] == "0.59" and log.device_info("dev-c") == {}

        # Against the log: keep (default) reports, replace overwrites, error imports nothing.
        again = import_sources(log, [("b.jsonl", io.StringIO(site_b))])
        assert again.inserted == 0 and again.conflicts[0].kept == "the log"
        with pytest.raises(DeviceInfoConflict, match="device dev-a: info from b.jsonl line 1 differs from the log"):
            import_sources(log, [("c.jsonl", io.StringIO(site_c)), ("b.jsonl", io.StringIO(site_b))],
                           device_info="error")
        assert log.device_keys() == ["dev-a", "dev-c"]
        replaced = import_sources(log, [("b.jsonl", io.StringIO(site_b))], device_info="replace")
        assert replaced.conflicts[0].kept == "b.jsonl line 1"
        assert log.device_info("dev-a")["numba_version"] == "0.60"
        # An empty info never replaces a real one.
        import_sources(log, [("x", io.StringIO(_jsonl([trial({"t": 7})], {})))], device_info="replace")
        assert log.device_info("dev-a")["numba_version"] == "0.60"

        # A bad line in any file: nothing of any file is imported, and the file is named.
        broken = site_b.splitlines()[0] + "\n{oops\n"
        with pytest.raises(LogFormatError) as info:
            import_sources(log, [("new.jsonl", io.StringIO(_jsonl([trial({"t": 50})], {}))),
                                 ("broken.jsonl", io.StringIO(broken))])
        assert (info.value.source, info.value.line) == ("broken.jsonl", 2)
        assert not any(r.config == {"t": 50} for r in log.trials())


def test_import_reads_best_configs_files(log, tmp_path):
    from tuner.log import export_best

    with TuningLog(f"sqlite:///{tmp_path / 'site.db'}") as site:
        site.upsert_device("dev-s", {"cores": 64})
        site.record_trials(trial({"t": i}, mean=0.1 * (i + 1), device="dev-s", at=i) for i in range(4))
        buffer = io.StringIO()
        export_best(site, buffer, top=2)
        expected = site.best(WL, "dev-s", top=2)
    summary = import_trials(log, io.StringIO(buffer.getvalue()))
    assert (summary.read, summary.inserted) == (2, 2)
    assert log.best(WL, "dev-s", top=5) == expected and log.device_info("dev-s") == {"cores": 64}
    compact = json.dumps(json.loads(buffer.getvalue()))  # one line: recognised by its format
    assert import_trials(log, io.StringIO(compact)).duplicates == 2
    with pytest.raises(LogFormatError, match="best-configs file: entries"):
        import_trials(log, io.StringIO(buffer.getvalue().replace('"status": "ok"', '"status": "fast"', 1)))


# -- processes -------------------------------------------------------------------------------------------------
WRITER = r"""
import os, sys, time
from datetime import datetime, timedelta, timezone
from tuner.log import TrialRecord, TuningLog

url, seed, go, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
t0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
records = [TrialRecord("matmul(M=64,N=64,K=64)", f"dev-{i % 3}", "cpu", {"t": i}, "ok", (1.0,), 1.0 + i,
                       created_at=t0 + timedelta(microseconds=i)) for i in range(count)]
print("ready", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("no go")
    time.sleep(0.005)
inserted = 0
with TuningLog(url) as log:  # opening (and creating) a fresh database at once is part of the test
    mine = records[seed::4]
    inserted += log.record_trials(mine[: len(mine) // 2])
    for record in (records[::-1] if seed % 2 else records):
        inserted += log.record_trial(record)
print(inserted, flush=True)
"""


def test_processes_writing_at_once_lose_and_duplicate_nothing(new_db, tmp_path):
    import subprocess
    import sys

    url, count, writers = new_db(), 24, 4
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(script), url, str(n), str(go), str(count)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(writers)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        go.touch()
        outputs = [proc.communicate(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in procs] == [0] * writers, [err for _, err in outputs]
    assert sum(int(out.split()[-1]) for out, _ in outputs) == count
    with TuningLog(url) as log:
        stored = log.trials()
        assert len(stored) == count
        assert sorted(r.config["t"] for r in stored) == list(range(count))
        assert log.device_keys() == ["dev-0", "dev-1", "dev-2"]
        assert log.workload_keys() == ["matmul(M=64,N=64,K=64,dtype=float32)"]


# -- aggregates the dashboard reads ---------------------------------------------------------------
def test_job_agent_and_failure_aggregates_on_both_backends(log):
    job = log.create_job(WL, "dev-a", "cpu", "random", 10)
    log.record_trials([
        trial({"t": 1}, mean=2.0, agent="a1", job_id=job, at=1),
        trial({"t": 2}, mean=0.5, agent="a1", job_id=job, at=2),
        trial({"t": 3}, "compile_error", message="boom", agent="a2", job_id=job, at=3),
        trial({"t": 4}, "run_timeout", agent="a2", at=4),  # no job
        trial({"t": 5}, mean=0.1, at=5),  # no job, no agent
    ])
    stats = log.job_trial_stats()
    assert list(stats) == [job]
    assert (stats[job].trials, stats[job].failed, stats[job].best_mean_s) == (3, 1, 0.5)
    agents = log.agent_trial_stats()
    assert {name: (s.trials, s.failed) for name, s in agents.items()} == {"a1": (2, 0), "a2": (2, 2)}
    assert agents["a2"].last_at == T0 + timedelta(microseconds=4)  # an aware UTC time, on both backends
    assert [t.status for t in log.recent_failures(5)] == ["run_timeout", "compile_error"]
    assert [t.message for t in log.recent_failures(1)] == [""]
    assert log.count_trials_since(T0 + timedelta(microseconds=3)) == 3
    assert [t.config for t in log.trials(created_before=T0 + timedelta(microseconds=3))] == [{"t": 1}, {"t": 2}]
    with pytest.raises(ValueError, match="positive integer"):
        log.recent_failures(0)
