"""``tuner log export|import|prune``: the tuning log as files, merging sites, pruning."""

from __future__ import annotations

import argparse
import contextlib
import sys

from tuner.cli.common import (
    EXIT_FAILURE,
    CliError,
    add_db_arguments,
    cannot_write,
    non_negative_int,
    open_log,
    positive_int,
    workload_arg,
)

DEVICE_KEY_HELP = "only this device; a glob such as 'x86_64-*' matches several"
PRUNE_DESCRIPTION = (
    "Delete all but the K fastest ok trials of every workload/device/target (optionally only those of "
    "--workload, --device-key, --target), in one transaction. Failed trials (compile errors, wrong answers, "
    "timeouts, crashes) are kept unless --drop-failed: they are small, and they are what stops 'tuner tune' from "
    "measuring a config that fails or hangs again. Pruned configs are forgotten: a later 'tuner tune' of the "
    "same workload may measure them again, and since --trials counts the distinct configs the log holds, it "
    "will measure new configs until the log holds that many again (the template's default config included, "
    "which tune always measures for its speed-up report). Safe while a tune runs; jobs are kept."
)


def register(subparsers) -> None:
    p = subparsers.add_parser("log", help="export, import (merge) or prune the tuning log")
    actions = p.add_subparsers(dest="log_command", required=True, metavar="ACTION")

    export = actions.add_parser(
        "export", help="write one JSON object per trial per line (or, --best-only, a best-configs file)",
        description="Write the trials as JSON lines (format tunefleet-log, version 1), or with --best-only the "
        "best configs per workload, device and target as one JSON object (format tunefleet-best, version 1) "
        "that tuner.best_kernel(db=FILE) reads without a database.")
    export.add_argument("--workload", help="only this workload")
    export.add_argument("--target", help="only this target")
    export.add_argument("--best-only", action="store_true",
                        help="write a best-configs file: the --top fastest ok trials per workload/device/target")
    export.add_argument("--top", type=positive_int, default=1,
                        help="with --best-only: configs kept per workload/device/target (default 1; more give "
                        "--nearest lookups alternatives when the best config does not fit another shape)")
    export.add_argument("-o", "--output", help="write to this file instead of stdout (replaced atomically)")
    add_db_arguments(export, device=False)
    export.add_argument("--device-key", help=DEVICE_KEY_HELP)
    export.set_defaults(func=run_export)

    imp = actions.add_parser(
        "import", help="read files written by 'tuner log export' (all or nothing; several files merge sites)",
        description="Import JSON-lines logs and best-configs files, all in one transaction: every line of every "
        "file is checked first and the first bad one is named; then everything is imported, or nothing. Trials "
        "already in the log are skipped. When a device's info differs between files or from the log's (a site "
        "upgraded numba, say), the conflict is reported on stderr and --device-info decides.")
    imp.add_argument("files", nargs="+", metavar="FILE", help="JSON-lines or best-configs file, or - for stdin")
    imp.add_argument("--device-info", choices=("keep", "replace", "error"), default="keep",
                     help="on conflicting device info: keep the log's (else the first file's; default), "
                     "replace it by the last file's, or import nothing")
    add_db_arguments(imp, device=False)
    imp.set_defaults(func=run_import)

    prune = actions.add_parser("prune", help="keep only the K best ok trials per workload/device/target",
                               description=PRUNE_DESCRIPTION)
    prune.add_argument("--keep-best", type=non_negative_int, required=True, metavar="K",
                       help="ok trials kept per group (>= 0)")
    prune.add_argument("--workload", help="only this workload")
    prune.add_argument("--target", help="only this target")
    prune.add_argument("--drop-failed", action="store_true", help="delete failed trials too")
    prune.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    add_db_arguments(prune, device=False)
    prune.add_argument("--device-key", help=DEVICE_KEY_HELP)
    prune.set_defaults(func=run_prune)


@contextlib.contextmanager
def _output(path: str | None):
    if path is None or path == "-":
        yield sys.stdout
        return
    import os
    import tempfile

    if os.path.isdir(path):  # found before exporting, not when replacing it with the export
        raise CliError(f"cannot write {path}: Is a directory", EXIT_FAILURE)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tunefleet-export-")
    except OSError as exc:
        raise cannot_write(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise cannot_write(path, exc) from None
        raise


def run_export(args: argparse.Namespace) -> int:
    from tuner.log import export_best, export_trials

    workload_key = workload_arg(args.workload).key if args.workload else None
    with open_log(args.db, existing=True) as log:
        keys = log.resolve_device_keys(args.device_key) if args.device_key else None
        with _output(args.output) as fh:
            if args.best_only:
                export_best(log, fh, top=args.top, workload_key=workload_key, device_key=keys, target=args.target)
            else:
                export_trials(log, fh, workload_key=workload_key, device_key=keys, target=args.target)
    return 0


def run_import(args: argparse.Namespace) -> int:
    from tuner.log import DeviceInfoConflict, LogFormatError, import_sources

    if args.files.count("-") > 1:
        raise CliError("stdin (-) can be read only once")
    handles = []
    try:
        for name in args.files:
            try:
                handles.append((name, sys.stdin if name == "-" else open(name, encoding="utf-8")))
            except OSError as exc:
                raise CliError(f"cannot read {name}: {exc.strerror}") from None
        with open_log(args.db) as log:
            try:
                summary = import_sources(log, handles, device_info=args.device_info)
            except LogFormatError as exc:
                source = exc.source or args.files[0]
                raise CliError(f"{source}: {exc}; nothing imported") from None
            except DeviceInfoConflict as exc:
                raise CliError(str(exc)) from None
    finally:
        for name, fh in handles:
            if fh is not sys.stdin:
                fh.close()
    for conflict in summary.conflicts:
        print(f"tuner: warning: {conflict.describe()}", file=sys.stderr)
    files = f" from {summary.sources} files" if summary.sources > 1 else ""
    print(f"read {summary.read} trials{files}: {summary.inserted} imported, {summary.duplicates} already present")
    return 0


def run_prune(args: argparse.Namespace) -> int:
    workload_key = workload_arg(args.workload).key if args.workload else None
    with open_log(args.db, existing=True) as log:
        keys = log.resolve_device_keys(args.device_key) if args.device_key else None
        summary = log.prune(args.keep_best, workload_key, keys, args.target,
                            drop_failed=args.drop_failed, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    failed = f" and {summary.deleted_failed} failed" if args.drop_failed else ""
    print(f"{verb} {summary.deleted} trials ({summary.deleted_ok} ok beyond the {args.keep_best} best{failed}) "
          f"in {summary.groups} workload/device/target groups; {summary.kept} kept")
    if summary.deleted and not args.dry_run:
        print("pruned configs may be measured again by a later 'tuner tune'")
    return 0
