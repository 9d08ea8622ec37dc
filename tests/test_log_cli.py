"""The command line of the best-config database: db, best (patterns, --nearest), history, log
export --best-only / import (several sites) / prune, and one-line errors.

Most commands run in-process (``tuner.cli.main``) on both backends; the error paths run as real
subprocesses, as a user would meet them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from measure_agent.templates import default_catalog
from measure_agent.workload import parse_workload
from test_tuning_log import new_db, pg_admin  # noqa: F401 - fixtures
from tuner.cli import main
from tuner.log import TrialRecord, TuningLog

TUNED = parse_workload("matmul(M=64,N=48,K=32)")
WANTED = parse_workload("matmul(M=48,N=48,K=32)")
HOSTS = ("x86_64-epyc-2c-avx2", "x86_64-xeon-8c-avx512", "aarch64-pi-4c-neon")


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _configs(workload, count):
    template = default_catalog().get("matmul", "cpu")
    space = template.space(workload)
    configs = [template.default_config(workload, space)]
    for config in space.neighbours(configs[0]):
        if len(configs) == count:
            break
        configs.append(config)
    return configs


@pytest.fixture
def tuned_url(new_db):
    url = new_db()
    configs = _configs(TUNED, 4)
    with TuningLog(url) as log:
        for d, host in enumerate(HOSTS):
            log.upsert_device(host, {"arch": host.split("-")[0], "cores": 2})
            log.record_trials(
                TrialRecord(TUNED.key, host, "cpu", c.to_json(), "ok", (m,), m)
                for c, m in zip(configs, [0.004 + d * 1e-4, 0.002 + d * 1e-4, 0.003, 0.005])
            )
        log.record_trial(TrialRecord(TUNED.key, HOSTS[0], "cpu", {"bogus": 1}, "compile_error", message="boom"))
    return url


def test_db_upgrade_and_current(new_db, capsys):
    url = new_db()
    code, out, _ = run(capsys, "db", "current", "--db", url, "--check")
    assert code == 1 and ("empty: no tuning log yet" in out or "no database file yet" in out)
    assert "run 'tuner db upgrade --db" in out
    code, out, _ = run(capsys, "db", "upgrade", "--db", url)
    assert code == 0 and "created the tuning log at revision" in out
    code, out, _ = run(capsys, "db", "current", "--db", url, "--check")
    assert code == 0 and "(head): up to date" in out
    code, out, _ = run(capsys, "db", "upgrade", "--db", url)
    assert code == 0 and "already at revision" in out
    code, _, err = run(capsys, "db", "upgrade", "--db", url, "--revision", "nope")
    assert code == 1 and "unknown schema revision 'nope'" in err


def test_best_with_device_patterns_and_nearest(tuned_url, capsys):
    # Exact workload, exact device, --top.
    code, out, _ = run(capsys, "best", "--workload", TUNED.key, "--device-key", HOSTS[0], "--db", tuned_url,
                       "--json", "--top", "2")
    rows = json.loads(out)
    assert code == 0 and [r["mean_s"] for r in rows] == [0.002, 0.003]
    assert all(r["approximate"] is False and r["tuned_workload"] == TUNED.key for r in rows)

    # A glob ranks the matching devices together.
    code, out, _ = run(capsys, "best", "--workload", TUNED.key, "--device-key", "x86_64-*", "--db", tuned_url,
                       "--json", "--top", "3")
    assert [(r["device_key"], r["mean_s"]) for r in json.loads(out)] == [
        (HOSTS[0], 0.002), (HOSTS[1], 0.0021), (HOSTS[0], 0.003)]
    code, out, _ = run(capsys, "best", "--workload", TUNED.key, "--device-key", "x86_64-*", "--db", tuned_url)
    assert code == 0 and HOSTS[0] in out.splitlines()[0]
    code, _, err = run(capsys, "best", "--workload", TUNED.key, "--device-key", "riscv-*", "--db", tuned_url)
    assert code == 1 and "devices matching riscv-* (0)" in err

    # Never tuned: an error without --nearest, an approximate answer with it.
    code, _, err = run(capsys, "best", "--workload", WANTED.key, "--device-key", HOSTS[2], "--db", tuned_url)
    assert code == 1 and "no successful trial of matmul(M=48,N=48,K=32" in err
    code, out, _ = run(capsys, "best", "--workload", WANTED.key, "--device-key", HOSTS[2], "--db", tuned_url,
                       "--nearest", "--json")
    row = json.loads(out)
    assert code == 0 and row["approximate"] is True and row["tuned_workload"] == TUNED.key
    assert row["workload"] == WANTED.key and row["distance"] == pytest.approx(0.415, abs=1e-3)
    template = default_catalog().get("matmul", "cpu")
    assert template.space(WANTED).from_json(row["config"])
    code, out, _ = run(capsys, "best", "--workload", WANTED.key, "--device-key", HOSTS[2], "--db", tuned_url,
                       "--nearest")
    assert code == 0 and "APPROXIMATE" in out and TUNED.key in out
    code, _, err = run(capsys, "best", "--workload", "matmul(M=48,N=48,K=32,dtype=float64)", "--device-key",
                       HOSTS[2], "--db", tuned_url, "--nearest")
    assert code == 1 and "no tuned matmul/float64 workload" in err


def test_history(tuned_url, capsys):
    code, out, _ = run(capsys, "history", "--workload", TUNED.key, "--db", tuned_url, "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 13
    assert {"workload", "device_key", "target", "config", "status", "mean_s", "timestamp"} <= set(rows[0])
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    code, out, _ = run(capsys, "history", "--workload", TUNED.key, "--db", tuned_url, "--device-key", "x86_64-*",
                       "--limit", "3")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4 and lines[-1].startswith("the 3 most recent of 9 trials")
    code, out, _ = run(capsys, "history", "--workload", TUNED.key, "--db", tuned_url, "--status", "compile_error")
    assert "compile_error" in out and out.splitlines()[-1] == f"1 trials of {TUNED.key}"
    code, out, _ = run(capsys, "history", "--workload", WANTED.key, "--db", tuned_url)
    assert code == 0 and out.startswith("no trials of")


def test_export_best_only_import_sites_and_prune(tuned_url, new_db, tmp_path, capsys):
    best = tmp_path / "best.json"
    code, out, _ = run(capsys, "log", "export", "--best-only", "--db", tuned_url, "-o", str(best))
    doc = json.loads(best.read_text())
    assert code == 0 and out == "" and (doc["format"], doc["version"]) == ("tunefleet-best", 1)
    assert [(e["device_key"], e["mean_s"]) for e in doc["entries"]] == [
        (HOSTS[2], 0.0022), (HOSTS[0], 0.002), (HOSTS[1], 0.0021)]
    code, out, _ = run(capsys, "log", "export", "--best-only", "--top", "2", "--device-key", "x86_64-*",
                       "--db", tuned_url)
    assert len(json.loads(out)["entries"]) == 4

    # Two sites, the same device with different info: merged, the conflict reported.
    site_a, site_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    code, out, _ = run(capsys, "log", "export", "--db", tuned_url, "--device-key", HOSTS[0])
    site_a.write_text(out)
    site_b.write_text(out.replace('"cores":2', '"cores":4'))
    merged = new_db()
    code, out, err = run(capsys, "log", "import", str(site_a), str(site_b), str(best), "--db", merged)
    assert code == 0 and "read 13 trials from 3 files: 7 imported, 6 already present" in out
    assert f"tuner: warning: device {HOSTS[0]}: info from {site_b} line 1 differs from {site_a} line 1 in cores" in err
    code, _, err = run(capsys, "log", "import", str(site_b), "--db", merged, "--device-info", "error")
    assert code == 2 and "differs from the log in cores" in err and "nothing imported" in err
    code, out, _ = run(capsys, "log", "import", str(site_b), "--db", merged, "--device-info", "replace")
    with TuningLog(merged) as log:
        assert log.device_info(HOSTS[0])["cores"] == 4

    # Prune: the K best ok trials per workload/device/target, failed trials kept.
    code, out, _ = run(capsys, "log", "prune", "--keep-best", "1", "--db", tuned_url, "--dry-run")
    assert code == 0 and out.startswith("would delete 9 trials (9 ok beyond the 1 best) in 3 workload/device/target")
    code, out, _ = run(capsys, "log", "prune", "--keep-best", "1", "--device-key", "x86_64-*", "--db", tuned_url)
    assert "deleted 6 trials" in out and "may be measured again" in out
    with TuningLog(tuned_url) as log:
        assert log.count_trials(TUNED.key, HOSTS[0]) == 2  # the best and the failed one
        assert log.count_trials(TUNED.key, HOSTS[2]) == 4
    with pytest.raises(SystemExit):
        main(["log", "prune", "--help"])
    assert "measure them again" in capsys.readouterr().out


# -- errors, as a user meets them ---------------------------------------------------------------------
def tuner_cli(env, *args):
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, env=env, timeout=300)


def _assert_one_line_error(proc, *needles):
    assert proc.returncode in (1, 2), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_corrupt_sqlite_and_unreachable_postgres_are_one_line_errors(cli_env, tmp_path, capsys):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"\x00garbage, not SQLite" * 500)
    down = "postgresql+psycopg://postgres:secret@127.0.0.1:1/tuning"
    _assert_one_line_error(tuner_cli(cli_env, "history", "--workload", "matmul(M=4,N=4,K=4)", "--db", str(corrupt)),
                           "corrupt.db", "file is not a database")
    proc = tuner_cli(cli_env, "best", "--workload", "matmul(M=4,N=4,K=4)", "--device-key", "d", "--db", down)
    _assert_one_line_error(proc, "127.0.0.1", "port 1")
    assert "secret" not in proc.stderr
    # The same paths in-process, for the db commands (a traceback would fail the test here).
    for args, needle in [(("db", "current", "--db", str(corrupt)), "file is not a database"),
                         (("db", "upgrade", "--db", down), "port 1"),
                         (("log", "export", "--best-only", "--db", down), "port 1")]:
        code, out, err = run(capsys, *args)
        assert code == 1 and out == "" and needle in err and len(err.strip().splitlines()) == 1
        assert "secret" not in err


def test_unmigrated_database_is_refused_by_tune(cli_env, tmp_path, capsys):
    from sqlalchemy import create_engine

    legacy = tmp_path / "legacy.db"
    engine = create_engine(f"sqlite:///{legacy}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE notes (id INTEGER PRIMARY KEY)")
    engine.dispose()
    proc = tuner_cli(cli_env, "tune", "--workload", "matmul(M=8,N=8,K=8)", "--trials", "1", "--db", str(legacy))
    _assert_one_line_error(proc, "holds no tuning log", "run 'tuner db upgrade --db sqlite:///")
    assert run(capsys, "db", "upgrade", "--db", str(legacy))[0] == 0
    code, _, err = run(capsys, "log", "import", str(tmp_path / "none.jsonl"), "--db", str(legacy))
    assert code == 2 and "cannot read" in err
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("")
    bad.write_text('{"format": "tunefleet-log"')
    proc = tuner_cli(cli_env, "log", "import", str(good), str(bad), "--db", str(legacy))
    _assert_one_line_error(proc, f"{bad}: line 1: not valid JSON", "nothing imported")


def test_a_corrupt_row_or_a_lost_table_is_a_one_line_error_naming_it(tuned_url, capsys):
    from sqlalchemy import create_engine, text

    engine = create_engine(tuned_url)
    with engine.begin() as conn:
        bad_id = conn.execute(text("SELECT id FROM trials WHERE status = 'ok' ORDER BY mean_s LIMIT 1")).scalar()
        conn.execute(text("UPDATE trials SET config_json = '{not json' WHERE id = :id"), {"id": bad_id})
    for args in (("best", "--workload", TUNED.key, "--device-key", HOSTS[0]),
                 ("history", "--workload", TUNED.key),
                 ("log", "export", "--best-only")):
        code, out, err = run(capsys, *args, "--db", tuned_url)
        assert code == 1 and f"holds a corrupt trial (id {bad_id})" in err, (args, err)
        assert len(err.strip().splitlines()) == 1
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE trials"))
    engine.dispose()
    code, _, err = run(capsys, "history", "--workload", TUNED.key, "--db", tuned_url)
    assert code == 1 and "cannot read trials" in err and len(err.strip().splitlines()) == 1


def test_reading_commands_never_create_a_log(tmp_path, capsys):
    missing = tmp_path / "typo" / "tuning.db"
    for args in (("best", "--workload", TUNED.key), ("history", "--workload", TUNED.key),
                 ("log", "export", "--best-only"), ("log", "prune", "--keep-best", "1", "--dry-run"),
                 ("report", "1", "-o", str(tmp_path / "r.html"))):
        code, out, err = run(capsys, *args, "--db", str(missing))
        assert code == 1 and f"no tuning log at {missing}" in err, (args, err)
    assert not missing.parent.exists()

    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    code, _, err = run(capsys, "best", "--workload", TUNED.key, "--db", str(empty))
    assert code == 1 and "no tuning log yet" in err
    assert run(capsys, "db", "current", "--db", str(empty))[0] in (0, 1)
    from tuner import best_kernel
    with pytest.raises(Exception, match="no tuning log yet"):
        best_kernel(TUNED, db=str(empty))
    assert empty.stat().st_size == 0  # nothing wrote a SQLite header into it


def test_import_refuses_malformed_device_info_and_best_skips_configs_the_template_rejects(new_db, tmp_path, capsys):
    url = new_db()
    good = TrialRecord(TUNED.key, HOSTS[0], "cpu", _configs(TUNED, 1)[0].to_json(), "ok", (0.004,), 0.004)
    line = json.loads(json.dumps(good.to_json({"arch": "x86_64", "cores": 2, "isa_features": ["avx2"]})))
    for field, value in (("isa_features", 5), ("cores", "two"), ("arch", 3)):
        bad = dict(line, device_info=dict(line["device_info"], **{field: value}))
        path = tmp_path / f"bad_{field}.jsonl"
        path.write_text(json.dumps(bad) + "\n")
        code, _, err = run(capsys, "log", "import", str(path), "--db", url)
        assert code == 2 and "line 1" in err and f"'{field}'" in err and "nothing imported" in err, err

    alien = dict(line, config={"kc": "x"}, mean_s=0.001, costs=[0.001])
    path = tmp_path / "alien.jsonl"
    path.write_text(json.dumps(alien) + "\n")
    assert run(capsys, "log", "import", str(path), "--db", url)[0] == 0  # the log keeps what was measured
    code, _, err = run(capsys, "best", "--workload", TUNED.key, "--device-key", HOSTS[0], "--db", url)
    assert code == 1 and "not valid for the installed matmul template" in err
    path.write_text(json.dumps(line) + "\n")
    assert run(capsys, "log", "import", str(path), "--db", url)[0] == 0
    code, out, _ = run(capsys, "best", "--workload", TUNED.key, "--device-key", HOSTS[0], "--db", url, "--json")
    best = json.loads(out)
    assert code == 0 and best["config"] != {"kc": "x"} and best["mean_s"] == 0.004  # the faster alien is skipped
