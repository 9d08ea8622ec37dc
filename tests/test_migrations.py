"""The tuning log's schema migrations (Alembic, packaged), on SQLite and PostgreSQL.

Uses the ``new_db`` fixture of ``test_tuning_log`` (fresh databases on both backends, created and
dropped by the tests).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from sqlalchemy import create_engine, inspect, text

from test_tuning_log import new_db, pg_admin, trial  # noqa: F401 - fixtures
from tuner.log import TuningLog, TuningLogError, schema
from tuner.log import migrate
from tuner.log.migrate import INITIAL_REVISION, VERSION_TABLE

T = datetime(2024, 5, 1, 12, 0, 0, 5, tzinfo=timezone.utc)


def _engine(url):
    return create_engine(url)


def _execute(url, *statements):
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def _scalar(url, statement):
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(statement)).scalar()
    finally:
        engine.dispose()


def _old_log(url):
    """A database at the initial revision holding one workload, device, job and trial."""
    before, after = migrate.upgrade(url, INITIAL_REVISION)
    assert (before.kind, after) == ("empty", INITIAL_REVISION)
    _execute(
        url,
        "INSERT INTO workloads (id, key, op, params, dtype) VALUES "
        "(1, 'matmul(M=64,N=64,K=64,dtype=float32)', 'matmul', '{\"M\":64,\"N\":64,\"K\":64}', 'float32')",
        "INSERT INTO devices (id, key, info, first_seen, last_seen) VALUES "
        "(1, 'dev-old', '{\"cores\":2}', '2024-05-01 12:00:00.000005', '2024-05-01 12:00:00.000005')",
        "INSERT INTO jobs (id, workload_id, device_id, target, strategy, trials, options, status, created_at) VALUES "
        "(1, 1, 1, 'cpu', 'random', 8, '{}', 'done', '2024-05-01 12:00:00.000005')",
        "INSERT INTO trials (job_id, workload_id, device_id, target, config_json, config_digest, status, costs, "
        "mean_s, compile_time_s, message, agent, template_version, created_at) VALUES "
        "(1, 1, 1, 'cpu', '{\"tile\":8}', 'c0ffee0000000000', 'ok', '[0.25]', 0.25, 1.5, '', 'a', '1', "
        "'2024-05-01 12:00:00.000005')",
    )
    if url.startswith("postgresql"):  # explicit ids: move the sequences past them, as a real log would be
        _execute(url, *(f"SELECT setval('{t}_id_seq', 1)" for t in ("workloads", "devices", "jobs")))


def _assert_old_data_survived(url):
    with TuningLog(url, create=False) as log:
        [old] = log.trials()
        assert (old.workload_key, old.device_key, old.config, old.mean_s, old.job_id) == (
            "matmul(M=64,N=64,K=64,dtype=float32)", "dev-old", {"tile": 8}, 0.25, 1)
        assert old.created_at == T
        assert log.device_info("dev-old") == {"cores": 2}
        assert log.get_job(1).status == "done"
        # The log keeps working: new rows get fresh ids next to the old ones.
        assert log.record_trial(trial({"tile": 16}, workload="matmul(M=64,N=64,K=64)", device="dev-old"))
        assert len(log.best("matmul(M=64,N=64,K=64)", "dev-old", top=5)) == 2
        assert log.create_job("matmul(M=8,N=8,K=8)", "dev-new", "cpu", "random", 4) == 2


def test_revisions_are_one_chain_ending_at_head():
    known = migrate.revisions()
    assert known[0] == INITIAL_REVISION and known[-1] == migrate.head_revision()
    assert len(known) == len(set(known)) >= 2
    assert (migrate.MIGRATIONS_DIR / "env.py").is_file()
    # Shipped as packages, so that setuptools installs the revisions with tunefleet.
    assert (migrate.MIGRATIONS_DIR / "__init__.py").is_file()
    assert (migrate.MIGRATIONS_DIR / "versions" / "__init__.py").is_file()


def test_fresh_database_is_created_at_head_and_matches_the_models(new_db):
    url = new_db()
    assert migrate.schema_state(url).kind in ("empty", "missing")
    with pytest.raises(TuningLogError, match="has no tuning log yet: run 'tuner db upgrade|no tuning log at"):
        TuningLog(url, create=False)
    TuningLog(url).close()  # create=True: an empty database is migrated to head
    assert _scalar(url, f"SELECT version_num FROM {VERSION_TABLE}") == migrate.head_revision()
    assert migrate.schema_state(url).kind == "current"
    TuningLog(url, create=False).close()

    # The migrations build exactly the models of tuner.log.schema.
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = _engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
            assert compare_metadata(context, schema.metadata) == []
            indexes = {i["name"] for i in inspect(conn).get_indexes("workloads")}
            assert "ix_workloads_op_dtype" in indexes
    finally:
        engine.dispose()


def test_old_revision_is_refused_then_upgraded_with_its_data(new_db):
    url = new_db()
    _old_log(url)
    state = migrate.schema_state(url)
    assert (state.kind, state.revision) == ("outdated", INITIAL_REVISION)
    for create in (True, False):  # an old revision is never upgraded behind the user's back
        with pytest.raises(TuningLogError) as info:
            TuningLog(url, create=create)
        message = str(info.value)
        assert f"schema revision {INITIAL_REVISION}" in message and "run 'tuner db upgrade --db " in message
        assert "\n" not in message
    before, after = migrate.upgrade(url)
    assert (before.kind, before.revision, after) == ("outdated", INITIAL_REVISION, migrate.head_revision())
    _assert_old_data_survived(url)
    again, _ = migrate.upgrade(url)
    assert again.kind == "current"


def test_legacy_log_from_before_migrations_is_adopted(new_db):
    url = new_db()
    _old_log(url)
    _execute(url, f"DROP TABLE {VERSION_TABLE}")  # what metadata.create_all used to leave behind
    assert migrate.schema_state(url).kind == "legacy"
    with pytest.raises(TuningLogError, match="predates schema versioning: run 'tuner db upgrade"):
        TuningLog(url)
    before, after = migrate.upgrade(url)
    assert before.kind == "legacy" and after == migrate.head_revision()
    _assert_old_data_survived(url)


def test_newer_or_foreign_databases_are_refused(new_db):
    newer = new_db()
    TuningLog(newer).close()
    _execute(newer, f"UPDATE {VERSION_TABLE} SET version_num = '0099_from_the_future'")
    state = migrate.schema_state(newer)
    assert (state.kind, state.revision) == ("newer", "0099_from_the_future")
    with pytest.raises(TuningLogError, match="0099_from_the_future, which this tunefleet does not know .*upgrade tunefleet"):
        TuningLog(newer)
    with pytest.raises(TuningLogError, match="upgrade tunefleet"):
        migrate.upgrade(newer)

    foreign = new_db()
    _execute(foreign, "CREATE TABLE trials (id INTEGER PRIMARY KEY, what TEXT)")
    with pytest.raises(TuningLogError, match=r"not a tunefleet tuning log \(it has table trials but no table workloads\)"):
        TuningLog(foreign)
    with pytest.raises(TuningLogError, match="refusing to use it"):
        migrate.upgrade(foreign)

    shaped = new_db()
    migrate.upgrade(shaped, INITIAL_REVISION)
    _execute(shaped, f"DROP TABLE {VERSION_TABLE}", "DROP TABLE trials",
             "CREATE TABLE trials (id INTEGER PRIMARY KEY, what TEXT)")
    assert migrate.schema_state(shaped).detail == "table trials lacks column job_id"


def test_unrelated_database_is_refused_until_upgrade_creates_the_log_beside(new_db):
    url = new_db()
    _execute(url, "CREATE TABLE inventory (id INTEGER PRIMARY KEY, item TEXT)", "INSERT INTO inventory VALUES (1, 'x')")
    with pytest.raises(TuningLogError, match="is not empty and holds no tuning log: run 'tuner db upgrade"):
        TuningLog(url)
    before, _ = migrate.upgrade(url)
    assert before.kind == "unversioned"
    with TuningLog(url) as log:
        assert log.record_trial(trial({"t": 1}))
    assert _scalar(url, "SELECT item FROM inventory") == "x"


def test_upgrade_refuses_unknown_revisions_and_downgrades(new_db):
    url = new_db()
    with pytest.raises(TuningLogError, match="unknown schema revision 'nope'"):
        migrate.upgrade(url, "nope")
    migrate.upgrade(url)
    with pytest.raises(TuningLogError, match="downgrades are not supported"):
        migrate.upgrade(url, INITIAL_REVISION)


def test_schema_state_creates_no_sqlite_file(tmp_path):
    path = tmp_path / "sub" / "none.db"
    state = migrate.schema_state(f"sqlite:///{path}")
    assert state.kind == "missing" and not state.up_to_date and state.upgradable
    assert not path.exists() and not path.parent.exists()


def test_alembic_env_works_without_a_connection(tmp_path):
    """``alembic -x url=...`` by hand (e.g. to write SQL offline) uses the packaged env too."""
    import io

    from alembic import command

    url = f"sqlite:///{tmp_path / 'by-hand.db'}"
    config = migrate.alembic_config()
    config.cmd_opts = type("Opts", (), {"x": [f"url={url}"]})()
    command.upgrade(config, "head")
    assert migrate.schema_state(url).kind == "current"
    buffer = io.StringIO()
    offline = migrate.alembic_config()
    offline.cmd_opts = type("Opts", (), {"x": ["url=postgresql+psycopg://u@h/db"]})()
    offline.output_buffer = buffer
    command.upgrade(offline, "head", sql=True)
    sql = buffer.getvalue()
    assert "CREATE TABLE trials" in sql and f"CREATE TABLE {VERSION_TABLE}" in sql
    assert json.dumps(sql)  # plain text
