"""measure_agent must import and run with only numpy, numba, grpcio and protobuf."""

import subprocess
import sys
import textwrap

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"xgboost", "sqlalchemy", "alembic", "psycopg", "rich", "tuner"}:
                raise ImportError(f"{name} is not installed on this agent")
            return None

    sys.meta_path.insert(0, Block())
    """
)


def run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def test_agent_modules_import_without_tuner_dependencies():
    proc = run_blocked(
        """
        import measure_agent, measure_agent.cli, measure_agent.engine, measure_agent.engine.worker
        import measure_agent.templates, measure_agent.device
        from measure_agent.templates import default_catalog
        for template in default_catalog():
            pass
        bad = [m for m in sys.modules if m.split('.')[0] in {'xgboost', 'sqlalchemy', 'tuner'}]
        assert not bad, bad
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_agent_measures_without_tuner_dependencies():
    proc = run_blocked(
        """
        from measure_agent.engine import MeasureEngine, MeasureInput, TimingConfig
        from measure_agent.templates import testing_catalog
        from measure_agent.workload import parse_workload
        w = parse_workload("matmul(M=3,N=2,K=2)")
        space = testing_catalog().get("matmul", "cpu").space(w)
        config = space.make({"behaviour": "ok", "sleep_ms": 0, "variant": 0})
        import tempfile
        with MeasureEngine(TimingConfig(repeat=1), catalog="testing", cache_dir=tempfile.mkdtemp()) as e:
            [r] = e.measure([MeasureInput(w, config)])
        print(r.status.value)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
