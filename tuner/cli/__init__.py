"""The ``tuner`` command line: one module per command group, each with a ``register(subparsers)``."""

from __future__ import annotations

import argparse
import sys

from measure_agent.engine.runtime import RuntimeSettingsError
from tuner.cli import (
    best,
    config,
    daemon,
    dashboard,
    db,
    fleet,
    history,
    kernel,
    logfile,
    model,
    report,
    space,
    strategies,
    tune,
    verify,
)
from tuner.cli.common import CliError, apply_settings

EPILOG = """\
workloads:
  OP(NAME=SIZE,...[,dtype=float32|float64]), e.g. matmul(M=512,N=512,K=512), with OP one of
  matmul(M,N,K), dense(M,N,K), batch_matmul(B,M,N,K), conv2d_nchw / conv2d_nhwc(N,C,H,W,K,R,S,
  [stride],[pad],[dilation]), depthwise_conv2d_nchw / _nhwc(N,C,H,W,R,S,[stride],[pad],[dilation],
  [multiplier]); stride/pad/dilation set both axes, or give stride_h=,stride_w= (and so on).
  compact forms, as TVM users write them:
    matmul_MxNxK   dense_MxNxK   batch_matmul_BxMxNxK
    conv2d_nchw_NxCxHxW_kK_rRsS[_sS|_sHxW][_pP|_pHxW][_dD]     (also conv2d_nhwc_...)
    depthwise_conv2d_nchw_NxCxHxW_rRsS[_sS][_pP][_dD][_mM]     (M: channel multiplier)
    optional last segment: _float64
  anything ambiguous is refused with the canonical syntax.

The tuning log is SQLite at ~/.local/share/tunefleet/tuning.db unless --db or TUNEFLEET_DB says otherwise.
--tracker, --tls-ca, --token-file and --db default to TUNEFLEET_* variables, then to
~/.config/tunefleet/config.toml; 'tuner config' shows what is in effect and where each value came from.
"""

COMMAND_MODULES = (tune, best, kernel, space, logfile, daemon, fleet, db, history, strategies, report, model, verify,
                   config, dashboard)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuner",
        description="tunefleet: auto-tune tensor kernels, record results, query the best configs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from measure_agent import __version__  # one version for the whole distribution

    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        apply_settings(args)
        return args.func(args)
    except CliError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return exc.code
    except RuntimeSettingsError as exc:  # an exported kernel runtime setting, e.g. NUMBA_NUM_THREADS=two
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tuner: interrupted; measured results are in the log, re-run the same command to resume", file=sys.stderr)
        return 130
