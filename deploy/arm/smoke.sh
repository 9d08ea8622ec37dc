#!/usr/bin/env bash
# A Raspberry Pi-class agent runs the fleet (issue 27): an arm64 Debian rootfs, built once and cached
# in ${XDG_CACHE_HOME:-/var/cache}/tunefleet-arm, gets the agent as the README tells a Pi user
# (a venv, `pip install -c deploy/constraints.txt tunefleet`), and its `measure-agent` runs under
# qemu-user (binfmt_misc) against a `tuner daemon` on this host's loopback, beside an x86 agent.
# Both tune a few trials of a small matmul, conv2d NCHW and NHWC, depthwise and dense; every trial
# must be ok (built, checked against numpy, recorded) with the aarch64 facts and NEON spaces on the
# aarch64 key; `tuner verify --tracker` passes on both keys. Prints what a Pi pays against x86.
#
# Exit 0: passed; 77: skipped, with the reason (no root, no binfmt_misc, no qemu); 124: stopped by
# SIGTERM (a deadline such as `timeout`'s: the step it was on is printed); else failed.
# Settings: SMOKE_TRIALS (per workload and key, default 2), TUNEFLEET_ARM_MIRROR (Debian mirror),
# PYTHON (the host's, with tunefleet[server]: default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
cache="${XDG_CACHE_HOME:-/var/cache}/tunefleet-arm"
rootfs="$cache/rootfs"
suite=bookworm  # Raspberry Pi OS 12's Debian, Python 3.11
mirror="${TUNEFLEET_ARM_MIRROR:-http://deb.debian.org/debian}"
python="${PYTHON:-python3}"
trials="${SMOKE_TRIALS:-2}"
workloads=(matmul_64x64x64 conv2d_nchw_1x16x16x16_k16_r3s3_s1_p1 conv2d_nhwc_1x16x16x16_k16_r3s3_s1_p1
           depthwise_conv2d_nchw_1x16x16x16_r3s3_s1_p1 dense_16x64x64)
started_at=$(date +%s)

step="starting"
say() { echo "smoke: $*" >&2; step="$*"; }
skip() { say "skipped: $*"; exit 77; }
fail() { say "FAILED: $*"; exit 1; }

# The whole run is one function: bash parses it before running it.
main() {
  # -- emulation available? ---------------------------------------------------------------------------
  [ "$(uname -m)" = x86_64 ] || skip "this host is $(uname -m); the smoke emulates aarch64 on x86_64"
  [ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot, mounting binfmt_misc)"
  if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null \
      || ! command -v update-binfmts >/dev/null; then
    say "installing qemu-user-static debootstrap binfmt-support"
    (export DEBIAN_FRONTEND=noninteractive
     apt-get install -y -q qemu-user-static debootstrap binfmt-support \
       || { apt-get update -q && apt-get install -y -q qemu-user-static debootstrap binfmt-support; }) >/dev/null 2>&1 \
      || skip "cannot install qemu-user-static, debootstrap and binfmt-support"
  fi
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null \
      || skip "cannot mount binfmt_misc (a container without the privilege?)"
  fi
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || skip "no binfmt_misc handler for aarch64 (update-binfmts --enable qemu-aarch64 failed)"

  # -- the rootfs, once -------------------------------------------------------------------------------
  mkdir -p "$cache"
  if [ ! -e "$rootfs/.tunefleet-rootfs" ]; then
    say "building the arm64 $suite rootfs in $rootfs (once: it is cached; some 5-10 min)"
    rm -rf "$cache/rootfs.partial"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,procps \
        "$suite" "$cache/rootfs.partial" "$mirror" >"$cache/debootstrap.log" 2>&1 \
      || { tail -n 5 "$cache/debootstrap.log" >&2; fail "debootstrap (log: $cache/debootstrap.log)"; }
    touch "$cache/rootfs.partial/.tunefleet-rootfs"
    mv "$cache/rootfs.partial" "$rootfs"
  fi
  chroot "$rootfs" /bin/true 2>/dev/null || skip "the arm64 rootfs does not run here (binfmt_misc handler without qemu?)"

  # -- cleanup of what this run starts (by pid) and mounts ---------------------------------------------
  work="$(mktemp -d)"
  pids=()
  mounted=()
  agent_cache="/tmp/tunefleet-smoke-$$"  # inside the rootfs: a fresh kernel cache, so compiles are real
  cleanup() {
    local status=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$rootfs$agent_cache" "$rootfs/tmp/tunefleet-install"
    for ((i=${#mounted[@]}-1; i>=0; i--)); do umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" || true; done
    if [ "$status" -eq 0 ] || [ "$status" -eq 77 ]; then rm -rf "$work"; else say "logs kept in $work"; fi
  }
  trap cleanup EXIT
  mount -t proc proc "$rootfs/proc" && mounted+=("$rootfs/proc")  # /proc/self/auxv, /proc/cpuinfo
  mount --bind /dev "$rootfs/dev" && mounted+=("$rootfs/dev")
  in_rootfs() { chroot "$rootfs" env -i PATH=/opt/tunefleet/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 "$@"; }

  # -- the agent, as a Pi user installs it -------------------------------------------------------------
  # The wheels come from this host's pip (its index and proxy settings), for aarch64 and the rootfs's
  # Python; the rootfs installs from them offline, which is what `pip install` on a Pi fetches.
  say "installing the agent in the rootfs"
  "$python" -m pip wheel -q --no-deps -w "$work/dist" "$repo"
  wheel="$(ls "$work"/dist/tunefleet-*.whl)"
  constraints_sum="$(sha256sum deploy/constraints.txt | cut -c1-16)"
  if [ ! -e "$cache/wheels/.constraints-$constraints_sum" ]; then
    rm -rf "$cache/wheels"
    "$python" -m pip download -q --only-binary=:all: --implementation cp --python-version 3.11 \
        --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
        -c deploy/constraints.txt -d "$cache/wheels" "$wheel" 2>"$work/pip-download.log" \
      || { tail -n 5 "$work/pip-download.log" >&2; fail "pip download of the aarch64 wheels"; }
    rm -f "$cache"/wheels/tunefleet-*.whl
    touch "$cache/wheels/.constraints-$constraints_sum"
  fi
  install_dir="$rootfs/tmp/tunefleet-install"
  rm -rf "$install_dir" && mkdir -p "$install_dir"
  cp -r "$cache/wheels" deploy/constraints.txt "$wheel" "$install_dir/"
  [ -x "$rootfs/opt/tunefleet/bin/pip" ] || in_rootfs python3 -m venv /opt/tunefleet
  in_rootfs pip install -q --no-index --find-links /tmp/tunefleet-install/wheels \
      -c /tmp/tunefleet-install/constraints.txt "/tmp/tunefleet-install/$(basename "$wheel")"
  # this checkout's agent even where the rootfs holds an earlier build of the same version
  in_rootfs pip install -q --no-index --no-deps --force-reinstall "/tmp/tunefleet-install/$(basename "$wheel")"
  arm_key="$(in_rootfs measure-agent info | "$python" -c 'import json, sys; print(json.load(sys.stdin)["device_key"])')"
  x86_key="$(measure-agent info | "$python" -c 'import json, sys; print(json.load(sys.stdin)["device_key"])')"
  case "$arm_key" in
    aarch64-emulated-on-x86-*-asimd) say "the emulated agent's key: $arm_key; the x86 agent's: $x86_key" ;;
    *) fail "the emulated agent detects key '$arm_key', not aarch64-emulated-on-x86-<N>c-asimd" ;;
  esac

  # -- the fleet on loopback -----------------------------------------------------------------------------
  port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  tracker="127.0.0.1:$port"
  tuner daemon --listen "$tracker" --db "$work/log.sqlite" --agent-timeout 60 >"$work/daemon.log" 2>&1 &
  pids+=($!)
  # not through in_rootfs: a backgrounded function is a subshell, and $! would be its pid
  chroot "$rootfs" env -i PATH=/opt/tunefleet/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 XDG_CACHE_HOME="$agent_cache" \
      measure-agent --tracker "$tracker" --name pi-emulated >"$work/arm-agent.log" 2>&1 &
  arm_pid=$!; pids+=("$arm_pid")  # chroot, env and the shebang exec in place: this is the agent's pid
  XDG_CACHE_HOME="$work/x86-cache" measure-agent --tracker "$tracker" --name x86 >"$work/x86-agent.log" 2>&1 &
  x86_pid=$!; pids+=("$x86_pid")
  for _ in $(seq 1 120); do
    listed="$(tuner agents --tracker "$tracker" 2>/dev/null || true)"
    grep -q -- "$arm_key" <<<"$listed" && grep -q -- "$x86_key" <<<"$listed" && break
    sleep 2
  done
  grep -q -- "$arm_key" <<<"$listed" || { tail -n 20 "$work/arm-agent.log" >&2; fail "the emulated agent did not join"; }
  grep -q -- "$x86_key" <<<"$listed" || { tail -n 20 "$work/x86-agent.log" >&2; fail "the x86 agent did not join"; }
  sleep 5  # settled after registering
  for pid in "$arm_pid" "$x86_pid"; do
    grep -qa measure-agent "/proc/$pid/cmdline" || fail "pid $pid is not an agent: its memory would not be the agent's"
  done
  arm_idle="$("$python" deploy/arm/pi_cost.py rss "$arm_pid")"
  x86_idle="$("$python" deploy/arm/pi_cost.py rss "$x86_pid")"
  "$python" deploy/arm/pi_cost.py watch-builders "$arm_pid" "$work/arm-builders.json" & pids+=($!)
  "$python" deploy/arm/pi_cost.py watch-builders "$x86_pid" "$work/x86-builders.json" & pids+=($!)

  # -- tuning through the fleet, then verify -------------------------------------------------------------
  for key in "$x86_key" "$arm_key"; do
    for workload in "${workloads[@]}"; do
      say "tuning $workload on $key ($trials trials)"
      tuner tune --workload "$workload" --tracker "$tracker" --rpc-key "$key" --trials "$trials" \
          --strategy random --seed 1 --no-transfer --build-timeout 900 --timeout 120 >>"$work/tune.log" 2>&1 \
        || { tail -n 20 "$work/tune.log" >&2; fail "tuning $workload on $key"; }
    done
  done
  for key in "$arm_key" "$x86_key"; do
    say "tuner verify --tracker on $key"
    tuner verify --workload matmul_64x64x64 --samples 1 --tracker "$tracker" --rpc-key "$key" --build-timeout 900 \
        --timeout 120 >>"$work/verify.log" 2>&1 || { tail -n 20 "$work/verify.log" >&2; fail "tuner verify on $key"; }
  done
  tuner log export --db "$work/log.sqlite" -o "$work/trials.jsonl"
  "$python" deploy/arm/pi_cost.py check "$work/trials.jsonl" --key "$arm_key" --arch aarch64 --isa asimd \
      --vector neon "${workloads[@]}" >"$work/arm.json"
  "$python" deploy/arm/pi_cost.py check "$work/trials.jsonl" --key "$x86_key" --arch x86_64 --isa sse4_2 \
      --vector "$("$python" -c 'from measure_agent.device import detect_device; from measure_agent.templates.cpu._common import vector_target; print(vector_target(detect_device()).isa)')" \
      "${workloads[@]}" >"$work/x86.json"

  # -- what a Pi pays ------------------------------------------------------------------------------------
  for side in arm x86; do
    idle_var="${side}_idle"
    [ -s "$work/$side-builders.json" ] || fail "no $side build worker was seen"
    "$python" - "$work/$side.json" "$work/$side-builders.json" "${!idle_var}" <<'EOF'
import json, sys
summary, builders, idle = sys.argv[1], json.load(open(sys.argv[2])), float(sys.argv[3])
data = json.load(open(summary))
data.update(idle_rss_mib=idle, build_worker_peak_mib=builders["build_worker_peak_kib"] / 1024)
json.dump(data, open(summary, "w"))
EOF
  done
  grep -h "" "$work/verify.log" | grep -iE "ok|pass|fail|error" | tail -n 6 >&2 || true
  "$python" deploy/arm/pi_cost.py table "$work/arm.json" "$work/x86.json"

  # -- the Jetson image, where docker can build it for arm64 ---------------------------------------------
  # Its base (nvcr.io/nvidia/l4t-jetpack) is some 8 GB from NVIDIA's registry; the agent in it is the
  # same code as the rootfs's, so what is checked is that it installs and detects an aarch64 device.
  if ! docker info >/dev/null 2>&1; then
    say "Jetson image: not built: no docker daemon answers here ($({ docker info 2>&1 || true; } | grep -m1 -iE 'cannot connect|error|not found' || echo 'docker info fails'))"
  elif ! docker buildx build --platform linux/arm64 -f deploy/Dockerfile.agent-jetson -t tunefleet-agent-jetson:smoke \
      --load . >"$work/jetson-build.log" 2>&1; then
    say "Jetson image: not built for linux/arm64 here: $(tail -n 1 "$work/jetson-build.log")"
  else
    jetson_key="$(docker run --rm --platform linux/arm64 tunefleet-agent-jetson:smoke info \
        | "$python" -c 'import json, sys; print(json.load(sys.stdin)["device_key"])')"
    case "$jetson_key" in
      aarch64-*-asimd*) say "Jetson image: built; its agent detects $jetson_key" ;;
      *) fail "the Jetson image's agent detects key '$jetson_key', not an aarch64 one" ;;
    esac
  fi
  echo "smoke: passed in $(( $(date +%s) - started_at )) s"
}

# A deadline (`timeout` sends SIGTERM to the whole process group) ends the run through the EXIT
# trap's cleanup, which kills what the run started and unmounts what it mounted.
trap 'echo "smoke: stopped by SIGTERM after $(( $(date +%s) - started_at )) s, at: $step" >&2; exit 124' TERM
main "$@"
