"""TVM target syntax (issue 24 point 2): -mtriple, -device=arm_cpu, -mcpu, -mattr with aliases, TVM's
tags, matching recorded devices, and a job no agent of its key can serve refused at submit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from measure_agent.device import DeviceInfo, detect_device
from measure_agent.protocol.convert import capabilities_to_json, capabilities_to_proto
from measure_agent.protocol.errors import InvalidRequest
from tuner.daemon import FleetClient
from tuner.fleet import JobSpec
from tuner.log import TuningLog
from tuner.steering import SteeringError, parse_target
from tuner.target_tags import TARGET_TAGS

from fleet_helpers import FakeAgent, start_daemon, wait_for

DEVICES = Path(__file__).parent / "data" / "devices"
PI4, PI5, ORIN, X86 = "raspberry_pi_4", "raspberry_pi_5", "jetson_orin_nano", "x86_avx512_server"


@pytest.fixture()
def log(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'targets.db'}") as log:
        yield log


def recorded(name: str) -> DeviceInfo:
    """A recorded machine (tests/data/devices) as its agent describes it."""
    facts = json.loads((DEVICES / name / "facts.json").read_text())
    return detect_device(str(DEVICES / name / "cpuinfo"), str(DEVICES / name / "model"), arch=facts["arch"],
                         cores=facts["cores"], gpu=facts["gpu"])


def as_registered(info: DeviceInfo) -> dict:
    """The scheduler's form: what the agent's capabilities become (GPU facts at the top level)."""
    return capabilities_to_json(capabilities_to_proto(info, "1", "v", []))


RECORDED = {name: recorded(name) for name in (PI4, PI5, ORIN, X86)}
# Boards without a recording, described as their agents would be.
JETSON_NANO = DeviceInfo("aarch64", "ARM Cortex-A57", 4, ("asimd",), board="NVIDIA Jetson Nano Developer Kit",
                         extra={"gpu_name": "NVIDIA Tegra X1", "compute_capability": "5.3"})
XAVIER = DeviceInfo("aarch64", "NVIDIA Carmel", 8, ("asimd", "asimdhp", "asimddp"),
                    board="NVIDIA Jetson AGX Xavier Developer Kit", extra={"gpu_name": "Xavier",
                                                                           "compute_capability": "7.2"})
PI_32BIT = DeviceInfo("armv7l", "ARM Cortex-A72", 4, ("neon",), board="Raspberry Pi 4 Model B Rev 1.4")
RTX_3090 = DeviceInfo("x86_64", "AMD Ryzen 9 5950X 16-Core Processor", 32, ("sse4_2", "avx", "avx2", "fma"),
                      extra={"gpu_name": "NVIDIA GeForce RTX 3090", "compute_capability": "8.6"})
H100 = DeviceInfo("x86_64", "Intel(R) Xeon(R) Platinum 8480+", 112, ("sse4_2", "avx", "avx2", "fma", "avx512f"),
                  extra={"gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"})


def matching(target: str, devices: dict[str, DeviceInfo] = RECORDED) -> set[str]:
    """The devices ``target`` accepts, checked in both recorded forms (which must agree)."""
    spec = parse_target(target)
    nested = {name for name, info in devices.items() if spec.matches(info.to_json())}
    flat = {name for name, info in devices.items() if spec.matches(as_registered(info))}
    assert nested == flat, target
    return nested


# -- syntax ------------------------------------------------------------------------------------------
def test_the_issue_target_parses_and_matches_the_aarch64_boards():
    target = "llvm -device=arm_cpu -mtriple=aarch64-linux-gnu -mattr=+neon"
    spec = parse_target(target)
    assert (spec.family, spec.cpu_archs, spec.mattr, spec.text) == ("cpu", ("aarch64",), ("+asimd",), target)
    assert matching(target) == {PI4, PI5, ORIN}  # aarch64 kernels say asimd, and +neon means it
    assert matching(target, {"pi-32": PI_32BIT}) == set()  # -mtriple says aarch64
    assert matching("llvm -device=arm_cpu -mattr=+neon", {"pi-32": PI_32BIT, **RECORDED}) == {"pi-32", PI4, PI5,
                                                                                               ORIN}


@pytest.mark.parametrize("target, expected", [
    ("llvm -mattr=+neon", {PI4, PI5, ORIN}),
    ("llvm -mattr=+asimd", {PI4, PI5, ORIN}),
    ("llvm -mattr=-neon", {X86}),
    ("llvm -mattr=+dotprod", {PI5, ORIN}),  # asimddp
    ("llvm -mattr=+fullfp16", {PI5, ORIN}),  # asimdhp
    ("llvm -mattr=+sse4.2,+avx2,+fma", {X86}),
    ("llvm -mattr=+avx512f,-avx512f", {PI4, PI5, ORIN}),  # the last sign counts
    ("llvm -mattr=+avx2,-avx512f", set()),
    ("llvm -mattr=+v8.2a,+neon", {PI4, PI5, ORIN}),  # a feature no device records does not constrain
    ("llvm -mtriple=x86_64-linux-gnu", {X86}),
    ("llvm -mtriple=aarch64-linux-gnu", {PI4, PI5, ORIN}),
    ("llvm -mtriple=arm64-apple-macos", {PI4, PI5, ORIN}),
    ("llvm -mtriple=armv7l-linux-gnueabihf", set()),
    ("llvm -device=arm_cpu", {PI4, PI5, ORIN}),
    ("llvm -mcpu=cortex-a72", {PI4}),
    ("llvm -mcpu=cortex-a76", {PI5}),
    ("llvm -mcpu=cortex-a78", {ORIN}),  # the Orin's core is a Cortex-A78AE
    ("llvm -mcpu=cortex-a7", set()),  # not a prefix match of Cortex-A72
    ("llvm -mcpu=skylake-avx512", {X86}),  # x86 names need their CPU's features: Ice Lake has them
    ("llvm -mcpu=icelake-server", {X86}),
    ("llvm -mcpu=haswell", {X86}),
    ("llvm -mcpu=native", {PI4, PI5, ORIN, X86}),
    ("llvm -keys=arm_cpu,cpu -libs=cblas -model=bcm2711 -num-cores=4 -system-lib", {PI4, PI5, ORIN, X86}),
    ("cuda -arch=sm_87", {ORIN}),
    ("cuda -arch=sm_90", set()),
    ("nvptx -mcpu=sm_87 -mtriple=nvptx64-nvidia-cuda", {ORIN}),
])
def test_options_against_recorded_devices(target, expected):
    assert matching(target) == expected


def test_the_last_sign_of_a_feature_counts():
    assert parse_target("llvm -mattr=+avx512f,-avx512f").mattr == ("-avx512f",)
    assert parse_target("llvm -mattr=+v8.2a,+neon").unchecked == ("+v8.2a",)


@pytest.mark.parametrize("bad, fragment", [
    ("fpga", "unknown target 'fpga'"),
    ("nvidia/jetson-orin-nanoo", "did you mean nvidia/jetson-orin-nano?"),
    ("cuda -arch=72", "sm_XY"),
    ("cuda -mcpu=x", "-mcpu is not understood for cuda"),
    ("llvm -arch=sm_80", "-arch is not understood for llvm"),
    ("llvm -mattr=avx2", "+feature"),
    ("llvm -mtriple=", "needs a value"),
    ("llvm -mtriple=aarch64 linux", "must start with -"),
    ("llvm -keys", "needs a value"),
    ("llvm -device=arm_cpu -mtriple=x86_64-linux-gnu", "no device is both x86_64 and aarch64/arm"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=skylake-avx512", "no device is both aarch64 and x86_64"),
    ("nvptx -mtriple=aarch64-linux-gnu", "nvptx64-nvidia-cuda"),
])
def test_bad_targets_are_refused_in_one_line(bad, fragment):
    with pytest.raises(SteeringError) as info:
        parse_target(bad)
    assert fragment in str(info.value) and "\n" not in str(info.value)


# -- tags --------------------------------------------------------------------------------------------
# What each tag must accept among the recorded machines and the described boards and GPUs.
DEVICES_FOR_TAGS = {**RECORDED, "jetson-nano": JETSON_NANO, "xavier": XAVIER, "pi-32": PI_32BIT,
                    "rtx-3090": RTX_3090, "h100": H100}
TAG_MATCHES = {
    "raspberry-pi/4b-aarch64": {PI4},
    "raspberry-pi/5": {PI5},
    "nvidia/jetson-nano": {"jetson-nano"}, "nvidia/jetson-tx1": {"jetson-nano"}, "nvidia/tegra-x1": {"jetson-nano"},
    "nvidia/jetson-tx2": set(),
    "nvidia/jetson-agx-xavier": {"xavier"},
    "nvidia/jetson-orin-nano": {ORIN}, "nvidia/jetson-agx-orin-32gb": {ORIN}, "nvidia/jetson-agx-orin-64gb": {ORIN},
    "nvidia/nvidia-h100": {"h100"},  # sm_90a: compute capability 9.0
    **{tag: {X86} for tag in TARGET_TAGS if tag.startswith("aws/cpu/c5.")},
}


@pytest.mark.parametrize("tag", sorted(TARGET_TAGS))
def test_every_tag_parses_to_its_family_and_requirements(tag):
    spec = parse_target(tag)
    tvm = TARGET_TAGS[tag].target
    assert (spec.text, spec.tag, spec.family) == (tag, tag, "cuda" if tvm.startswith("cuda") else "cpu")
    assert spec.has_requirements
    if spec.family == "cuda":
        assert spec.arch == tvm.split("-arch=")[1]
        assert spec.cpu_archs == (("aarch64",) if "jetson" in tag or "tegra" in tag else ())
    else:
        assert spec.mcpu and spec.cpu_archs
    sm86 = {"rtx-3090"} if spec.arch == "sm_86" else set()
    assert matching(tag, DEVICES_FOR_TAGS) == TAG_MATCHES.get(tag, sm86)


def test_a_tag_can_be_followed_by_options_that_override_it():
    assert matching("raspberry-pi/4b-aarch64 -mcpu=cortex-a76") == {PI5}
    assert parse_target("nvidia/jetson-orin-nano -max_threads_per_block=1024").arch == "sm_87"
    with pytest.raises(SteeringError, match="not understood for cuda"):
        parse_target("nvidia/nvidia-a100 -mcpu=cortex-a72")


def test_offered_says_what_the_devices_have_in_the_targets_terms():
    orin, pi4 = as_registered(RECORDED[ORIN]), as_registered(RECORDED[PI4])
    assert parse_target("cuda -arch=sm_90").offered([orin, orin, pi4]) == "sm_87; no CUDA GPU"
    assert parse_target("raspberry-pi/5").offered([pi4]) == "aarch64 ARM Cortex-A72 asimd"
    many = [dict(pi4, compute_capability=f"{i}.0") for i in range(1, 9)]
    assert parse_target("cuda -arch=sm_90").offered(many) == "sm_10; sm_20; sm_30; sm_40; sm_50 and 3 more kinds"


# -- refused at submit -------------------------------------------------------------------------------
def test_a_job_no_agent_of_its_key_can_serve_is_refused_at_submit(log):
    daemon = start_daemon(log)
    pi = FakeAgent(daemon.address, key="rpi4", name="pi-1", device=RECORDED[PI4])
    try:
        with FleetClient(daemon.address) as client:
            for target, offered in [("aws/cpu/c5.large", "aarch64 ARM Cortex-A72 asimd"),
                                    ("llvm -mattr=+avx512f", "asimd"),
                                    ("raspberry-pi/5", "aarch64 ARM Cortex-A72 asimd"),
                                    ("llvm -mtriple=x86_64-linux-gnu", "aarch64")]:
                with pytest.raises(InvalidRequest) as refused:
                    client.submit(JobSpec("matmul(M=2,N=2,K=2)", "rpi4", target=target, trials=2))
                assert str(refused.value) == f"target {target!r} matches no agent of key 'rpi4': they have {offered}"
            assert client.jobs() == [] and log.jobs() == []  # nothing recorded
            # a key no agent has registered under yet is not judged: its agents may still join
            waiting = client.submit(JobSpec("matmul(M=2,N=2,K=2)", "nobody-yet", target="aws/cpu/c5.large",
                                            trials=2))
            assert waiting.state in ("queued", "running")
            client.cancel(waiting.job_id)
            # the issue's target: the Pi serves it, and the job ends instead of waiting forever
            served = client.submit(JobSpec("matmul(M=2,N=2,K=2)", "rpi4", trials=2,
                                           target="llvm -device=arm_cpu -mtriple=aarch64-linux-gnu -mattr=+neon"))
            assert list(client.watch(served.job_id))[-1].state == "done"
            assert client.submit(JobSpec("matmul(M=2,N=2,K=2)", "rpi4", target="raspberry-pi/4b-aarch64",
                                         trials=2)).state in ("queued", "running", "done")
    finally:
        pi.stop()
        daemon.stop()


def test_a_kind_of_agent_that_has_left_still_counts_for_its_key(log):
    """What a key can serve is every kind of agent registered under it since the daemon started:
    an x86 agent that left may come back, so its jobs wait for it instead of being refused."""
    daemon = start_daemon(log)
    server = FakeAgent(daemon.address, key="mixed", name="x86-1", device=RECORDED[X86])
    pi = FakeAgent(daemon.address, key="mixed", name="pi-1", device=RECORDED[PI4])
    try:
        server.stop(leave=True)
        wait_for(lambda: len(daemon.scheduler.agents()) == 1, what="the x86 agent gone")
        with FleetClient(daemon.address) as client:
            job = client.submit(JobSpec("matmul(M=2,N=2,K=2)", "mixed", target="llvm -mattr=+avx512f", trials=2))
            status = wait_for(lambda: (s := client.job(job.job_id)).message and s, what="the job's note")
            assert status.state == "queued"
            assert "no registered agent of key mixed matches target 'llvm -mattr=+avx512f'" in status.message
            client.cancel(job.job_id)
            with pytest.raises(InvalidRequest, match="they have x86_64; aarch64"):
                client.submit(JobSpec("matmul(M=2,N=2,K=2)", "mixed", target="llvm -mtriple=riscv64-linux-gnu"))
    finally:
        pi.stop()
        daemon.stop()


def test_a_cuda_job_for_another_gpu_is_refused_naming_the_agents_gpu(log):
    from measure_agent.templates import default_catalog
    from tuner.daemon import Daemon

    catalog = default_catalog()
    daemon = Daemon(log, "127.0.0.1:0", catalog=catalog, heartbeat_interval_s=0.3, agent_timeout_s=2.0).start()
    jetson = FakeAgent(daemon.address, key="jetson", name="orin-1", device=RECORDED[ORIN],
                       template_version=catalog.version)
    try:
        with FleetClient(daemon.address) as client:
            with pytest.raises(InvalidRequest) as refused:
                client.submit(JobSpec("matmul(M=64,N=64,K=64)", "jetson", target="cuda -arch=sm_90"))
            assert str(refused.value) == "target 'cuda -arch=sm_90' matches no agent of key 'jetson': they have sm_87"
            with pytest.raises(InvalidRequest, match="'nvidia/nvidia-a100' matches no agent .* they have sm_87"):
                client.submit(JobSpec("matmul(M=64,N=64,K=64)", "jetson", target="nvidia/nvidia-a100"))
            accepted = client.submit(JobSpec("matmul(M=64,N=64,K=64)", "jetson", target="nvidia/jetson-orin-nano"))
            client.cancel(accepted.job_id)
    finally:
        jetson.stop()
        daemon.stop()


def test_cli_submit_of_an_unservable_target_is_one_line_and_exit_2(log, cli_env):
    daemon = start_daemon(log)
    pi = FakeAgent(daemon.address, key="rpi4", name="pi-1", device=RECORDED[PI4])
    try:
        proc = subprocess.run([sys.executable, "-m", "tuner", "submit", "--workload", "matmul(M=2,N=2,K=2)",
                               "--target", "aws/cpu/c5.large", "--rpc-key", "rpi4", "--tracker",
                               daemon.address], capture_output=True, text=True, env=cli_env, timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "matches no agent of key 'rpi4'" in lines[0]
    finally:
        pi.stop()
        daemon.stop()


def test_the_scheduler_remembers_each_kind_of_device_per_key_within_a_bound():
    from tuner.daemon.limits import MAX_DEVICE_KINDS_PER_KEY
    from tuner.daemon.scheduler import Scheduler

    scheduler = Scheduler(heartbeat_interval_s=1, agent_timeout_s=5)
    pi = as_registered(RECORDED[PI4])
    for cores in (2, 4):  # the same kind: no target names the core count
        scheduler.register("rpi4", f"pi-{cores}", dict(pi, cores=cores))
    assert len(scheduler.devices_seen("rpi4")) == 1 and scheduler.devices_seen("nobody") == []
    for i in range(MAX_DEVICE_KINDS_PER_KEY + 6):  # kinds that came and went
        gpu = scheduler.register("gpus", f"gpu-{i}", dict(pi, compute_capability=f"{i}.0"))
        scheduler.leave(gpu.agent_id)
    remembered = {d["compute_capability"] for d in scheduler.devices_seen("gpus")}
    assert remembered == {f"{i}.0" for i in range(6, MAX_DEVICE_KINDS_PER_KEY + 6)}  # the most recent
