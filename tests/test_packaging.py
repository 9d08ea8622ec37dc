"""What an installed tunefleet carries: its version on both command lines, type markers, license; what
the wheel holds; an agent's plain install and the tuner as the server extra."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from measure_agent import __version__
from measure_agent.agent import jittered
from measure_agent.cli import main as agent_main
from tuner.cli import main as tuner_main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("main, prog", [(tuner_main, "tuner"), (agent_main, "measure-agent")])
def test_both_command_lines_tell_their_version(capsys, main, prog):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"{prog} {__version__}"


def test_packages_are_marked_typed_and_licensed():
    assert (ROOT / "tuner" / "py.typed").is_file() and (ROOT / "measure_agent" / "py.typed").is_file()
    assert "py.typed" in (ROOT / "pyproject.toml").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and (ROOT / "CHANGELOG.md").is_file()


def test_reconnect_pauses_are_spread_between_half_and_all_of_the_step():
    pauses = [jittered(8.0) for _ in range(200)]
    assert all(4.0 <= p <= 8.0 for p in pauses) and len({round(p, 3) for p in pauses}) > 100


def test_the_wheel_carries_templates_type_markers_protocol_code_migrations_and_license(tmp_path):
    """What .ci/run builds: the wheel of a copy of the source (the build leaves no files in the checkout)."""
    source = tmp_path / "source"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("tuner", "measure_agent"):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=source, capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("tunefleet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("measure_agent/templates/cpu/matmul.py", "measure_agent/templates/cuda/gemm.py",
                 "measure_agent/py.typed", "tuner/py.typed",
                 "measure_agent/protocol/v1/fleet_pb2.py", "measure_agent/protocol/v1/fleet_pb2_grpc.py",
                 "measure_agent/protocol/v1/fleet_pb2.pyi",
                 "tuner/log/migrations/env.py", "tuner/log/migrations/script.py.mako",
                 "tuner/log/migrations/versions/0001_initial.py"):
        assert path in names, path
    revisions = {p.name for p in (ROOT / "tuner/log/migrations/versions").glob("0*.py")}
    assert revisions <= {n.rsplit("/", 1)[-1] for n in names if "/migrations/versions/" in n}
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Provides-Extra: server" in text and "Provides-Extra: postgres" in text


def project_table() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement_names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name.lower() for r in requirements}


def test_an_agent_installs_only_what_measure_agent_imports_and_the_tuner_is_the_server_extra():
    project = project_table()
    # tomli: the config file on Python < 3.11 (measure_agent/settings.py; tomllib from 3.11 on)
    assert requirement_names(project["dependencies"]) == {"numpy", "numba", "grpcio", "protobuf", "tomli"}
    extras = project["optional-dependencies"]
    assert {"sqlalchemy", "alembic", "rich", "grpcio-health-checking"} <= requirement_names(extras["server"])
    assert "psycopg" in requirement_names(extras["postgres"])
    assert "psycopg" not in requirement_names(extras["server"])
    test_extra = " ".join(extras["test"])
    assert "tunefleet[server" in test_extra and "kernel_tuner" in test_extra.replace("-", "_")
    assert project["scripts"]["tuner"] == "tuner.entry_point:main"


@pytest.mark.parametrize("system, machine, chosen", [
    ("linux", "x86_64", "xgboost-cpu"), ("linux", "aarch64", "xgboost-cpu"),
    ("linux", "armv7l", "xgboost"), ("darwin", "arm64", "xgboost"), ("win32", "AMD64", "xgboost"),
])
def test_the_server_extra_installs_exactly_one_xgboost_distribution(system, machine, chosen):
    """xgboost and xgboost-cpu install the same module: never both, the CPU-only one where it is published."""
    server = project_table()["optional-dependencies"]["server"]
    environment = {"sys_platform": system, "platform_machine": machine, "extra": "server"}
    xgboosts = [r.name for r in map(Requirement, server)
                if r.name.startswith("xgboost") and (r.marker is None or r.marker.evaluate(environment))]
    assert xgboosts == [chosen]


BLOCK_SERVER = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from tuner.entry_point import main
sys.exit(main(["tune", "--workload", "matmul(M=8,N=8,K=8)", "--trials", "1"]))
"""


@pytest.mark.parametrize("blocked, named", [
    ({"xgboost", "sqlalchemy", "alembic", "rich", "grpc_health"}, "xgboost, SQLAlchemy, alembic, rich"),
    ({"xgboost"}, "(xgboost not installed)"),  # imported only on first training: checked up front
])
def test_tuner_without_the_server_extra_says_how_to_install_it_in_one_line(tmp_path, blocked, named):
    proc = subprocess.run([sys.executable, "-c", f"BLOCKED = {blocked!r}\n" + BLOCK_SERVER],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TUNEFLEET_DB": str(tmp_path / "t.db")})
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert named in proc.stderr and proc.stderr.rstrip().endswith("pip install 'tunefleet[server]'")
    assert not (tmp_path / "t.db").exists()


def test_the_fleet_constraints_pin_every_runtime_requirement_within_its_bounds():
    pins = {}
    for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version.strip()
    project = project_table()
    extras = project["optional-dependencies"]
    for text in project["dependencies"] + extras["server"] + extras["postgres"]:
        requirement = Requirement(text)
        if requirement.name == "tunefleet":
            continue
        version = pins.get(requirement.name.lower())
        assert version is not None, f"{requirement.name} is not pinned in deploy/constraints.txt"
        assert requirement.specifier.contains(version), f"{requirement.name}=={version} outside {requirement.specifier}"


def test_a_postgresql_log_without_the_postgres_extra_says_how_to_install_it(monkeypatch):
    from tuner.log import TuningLog, TuningLogError

    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ModuleNotFoundError
    with pytest.raises(TuningLogError) as info:
        TuningLog("postgresql+psycopg://tuner:secret@127.0.0.1:1/tuning")
    message = str(info.value)
    assert message.endswith("pip install 'tunefleet[postgres]'") and "\n" not in message and "secret" not in message
