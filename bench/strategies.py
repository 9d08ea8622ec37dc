"""Search strategies on the shared replay spaces: ``tuner bench-strategies`` over every file.

    python bench/strategies.py [--strategies default,random,ga] [--budgets 25,50,100,200]
                               [--repeats 20] [--jobs 2] [--transfer] [--json] [--spaces-dir DIR]

Reads every ``*.json`` / ``*.json.gz`` Kernel Tuner cache in ``../shared/spaces`` (relative to the
repository root) unless ``--spaces-dir`` says otherwise, and prints, per space, strategy and
budget, the mean fraction of the optimum found and the score against exact random search, then
the mean per kernel family and the wall time. Targets for the default strategy (issue 5): family
mean >= 0.90 at 50 evaluations and >= 0.98 at 200, and above exact random search at every budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.cli import main as tuner_main  # noqa: E402
from tuner.replay import find_cache_files  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], add_help=True)
    parser.add_argument("--spaces-dir", default=str(ROOT.parent / "shared" / "spaces"))
    parser.add_argument("--only", default="", help="comma-separated substrings of space names to keep")
    args, rest = parser.parse_known_args()
    spaces_dir = Path(args.spaces_dir)
    files = find_cache_files(spaces_dir, args.only.split(","))
    if not files:
        print(f"no Kernel Tuner cache files in {spaces_dir}", file=sys.stderr)
        return 1
    argv = ["bench-strategies"]
    for path in files:
        argv += ["--space", str(path)]
    return tuner_main(argv + rest)


if __name__ == "__main__":
    raise SystemExit(main())
