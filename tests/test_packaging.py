"""What an installed tunefleet carries: its version on both command lines, type markers, license."""

from __future__ import annotations

from pathlib import Path

import pytest

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
