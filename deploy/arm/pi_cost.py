"""What deploy/arm/smoke.sh measures and checks, on the host (where /proc sees every process).

    pi_cost.py rss PID                      resident memory of a process now (MiB)
    pi_cost.py watch-builders PID OUT       until PID exits: the peak memory (VmHWM) of every build
                                            worker below PID, written to OUT (JSON) as it grows
    pi_cost.py check EXPORT --key K --arch A --isa I --vector V WORKLOAD...
                                            every trial of key K in a `tuner log export` file is ok,
                                            recorded with arch A, feature I, and lies in the space of
                                            vector ISA V; each workload has trials; prints a JSON
                                            summary (compile time per candidate)
    pi_cost.py table ARM.json X86.json      the Pi-cost table: each step under emulation and on x86

Under qemu-user a process's memory is the emulator's plus the program's: what the table calls
"emulated" is what this host pays, an upper bound of what a Pi pays for the same step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

BUILD_WORKER_MARKERS = ("measure_agent.engine.worker", "--role\0build")


def status_kib(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` memory field (``VmRSS``, ``VmHWM``) in KiB; 0 when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        for child in children(todo.pop()):
            seen.append(child)
            todo.append(child)
    return seen


def is_build_worker(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return False
    return all(marker in cmdline for marker in BUILD_WORKER_MARKERS)


def watch_builders(agent_pid: int, out: Path, interval_s: float = 0.5) -> None:
    peaks: dict[int, int] = {}
    while Path(f"/proc/{agent_pid}").exists():
        changed = False
        for pid in descendants(agent_pid):
            if is_build_worker(pid):
                peak = status_kib(pid, "VmHWM")
                if peak > peaks.get(pid, 0):
                    peaks[pid], changed = peak, True
        if changed:
            out.write_text(json.dumps({"build_worker_peak_kib": max(peaks.values()), "workers": len(peaks)}))
        time.sleep(interval_s)


def check(export: Path, key: str, arch: str, isa: str, vector: str, workloads: list[str]) -> dict:
    """Raise SystemExit naming the first trial that is not as the smoke requires."""
    from measure_agent.device import DeviceInfo
    from measure_agent.templates.catalog import default_catalog
    from measure_agent.templates.cpu._common import target_of
    from measure_agent.workload import parse_workload

    catalog = default_catalog()
    trials = [json.loads(line) for line in export.read_text().splitlines() if line.strip()]
    trials = [t for t in trials if t["device_key"] == key]
    per_workload: dict[str, int] = {}
    for trial in trials:
        device = DeviceInfo.from_json(trial["device_info"])
        where = f"{key} {trial['workload']} {json.dumps(trial['config'], sort_keys=True)}"
        if trial["status"] != "ok":
            raise SystemExit(f"smoke: trial {where} is {trial['status']}: {trial['message']}")
        if device.arch != arch or isa not in device.isa_features:
            raise SystemExit(f"smoke: trial {where} was measured on {device.arch} {list(device.isa_features)}, "
                             f"not {arch} with {isa}")
        workload = parse_workload(trial["workload"])
        space = catalog.space(workload, "cpu", device)
        if target_of(space).isa != vector or not space.is_valid(space.from_json(trial["config"])):
            raise SystemExit(f"smoke: trial {where} is not in the {vector} space ({target_of(space).isa})")
        per_workload[workload.key] = per_workload.get(workload.key, 0) + 1
    missing = [w for w in workloads if parse_workload(w).key not in per_workload]
    if missing:
        raise SystemExit(f"smoke: no trial of {', '.join(missing)} under key {key}")
    compile_s = sorted(t["compile_time_s"] for t in trials)
    device = DeviceInfo.from_json(trials[0]["device_info"])
    return {"key": key, "trials": len(trials), "per_workload": per_workload,
            "compile_median_s": statistics.median(compile_s), "compile_max_s": compile_s[-1],
            "arch": device.arch, "isa_features": list(device.isa_features),
            "float32_lanes": target_of(catalog.space(parse_workload(workloads[0]), "cpu", device)).float32_lanes}


def table(arm: dict, x86: dict) -> str:
    rows = [
        ("agent idle RSS (MiB)", arm["idle_rss_mib"], x86["idle_rss_mib"]),
        ("build worker peak RSS (MiB)", arm["build_worker_peak_mib"], x86["build_worker_peak_mib"]),
        ("compile per candidate, median (s)", arm["compile_median_s"], x86["compile_median_s"]),
        ("compile per candidate, max (s)", arm["compile_max_s"], x86["compile_max_s"]),
    ]
    lines = [f"What a Pi pays: {arm['key']} (qemu-user) vs {x86['key']}",
             f"{'step':36} {'aarch64 (emulated)':>19} {'x86_64':>9} {'ratio':>7}"]
    for name, a, x in rows:
        ratio = f"{a / x:.1f}x" if x else "-"
        lines.append(f"{name:36} {a:19.1f} {x:9.1f} {ratio:>7}")
    lines.append(f"trials: {arm['trials']} aarch64 ({arm['isa_features']}, {arm['float32_lanes']} fp32 lanes), "
                 f"{x86['trials']} x86_64 ({x86['float32_lanes']} fp32 lanes)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("rss").add_argument("pid", type=int)
    watch = commands.add_parser("watch-builders")
    watch.add_argument("pid", type=int)
    watch.add_argument("out", type=Path)
    checking = commands.add_parser("check")
    checking.add_argument("export", type=Path)
    for name in ("key", "arch", "isa", "vector"):
        checking.add_argument(f"--{name}", required=True)
    checking.add_argument("workloads", nargs="+")
    tabling = commands.add_parser("table")
    tabling.add_argument("arm", type=Path)
    tabling.add_argument("x86", type=Path)
    args = parser.parse_args(argv)
    if args.command == "rss":
        print(f"{status_kib(args.pid, 'VmRSS') / 1024:.1f}")
    elif args.command == "watch-builders":
        watch_builders(args.pid, args.out)
    elif args.command == "check":
        print(json.dumps(check(args.export, args.key, args.arch, args.isa, args.vector, args.workloads)))
    else:
        print(table(json.loads(args.arm.read_text()), json.loads(args.x86.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
