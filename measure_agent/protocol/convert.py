"""Conversions between protocol messages and the engine's typed values (both sides use them)."""

from __future__ import annotations

import functools
import json
from typing import Sequence

from measure_agent.bounded_json import loads_bounded
from measure_agent.device import DeviceInfo
from measure_agent.engine.types import MeasureResult, MeasureStatus, TimingConfig
from measure_agent.protocol.v1 import fleet_pb2 as pb


def timing_to_proto(timing: TimingConfig) -> pb.Timing:
    return pb.Timing(
        number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms, warmup=timing.warmup,
        build_timeout_s=timing.build_timeout_s, run_timeout_s=timing.run_timeout_s,
    )


def timing_from_proto(message: pb.Timing, clamp: bool = False) -> TimingConfig:
    """A timing config; raises ValueError when the message is out of bounds, or with ``clamp``
    (agents) brings it within bounds instead."""
    default = TimingConfig()
    values = dict(
        number=message.number or default.number,
        repeat=message.repeat or default.repeat,
        min_repeat_ms=message.min_repeat_ms,
        warmup=message.warmup,
        build_timeout_s=message.build_timeout_s or default.build_timeout_s,
        run_timeout_s=message.run_timeout_s or default.run_timeout_s,
    )
    return TimingConfig.clamped(**values) if clamp else TimingConfig(**values)


def clamped_timing_from_proto(message: pb.Timing) -> TimingConfig:
    """``timing_from_proto(message, clamp=True)``, what an agent does with each leased candidate's
    timing; the candidates of a job all carry the same, so the config is made once per distinct one."""
    return _clamped_timing(message.number, message.repeat, message.min_repeat_ms, message.warmup,
                           message.build_timeout_s, message.run_timeout_s)


@functools.lru_cache(maxsize=256)  # NaN never equals itself: such keys miss, bounded by the size
def _clamped_timing(number: int, repeat: int, min_repeat_ms: float, warmup: int, build_timeout_s: float,
                    run_timeout_s: float) -> TimingConfig:
    return timing_from_proto(pb.Timing(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms, warmup=warmup,
                                       build_timeout_s=build_timeout_s, run_timeout_s=run_timeout_s), clamp=True)


def capabilities_to_proto(info: DeviceInfo, agent_version: str, template_version: str,
                          templates: list[str]) -> pb.Capabilities:
    extra = info.extra
    return pb.Capabilities(
        arch=info.arch, cpu_model=info.cpu_model, cores=info.cores, isa_features=list(info.isa_features),
        numba_version=info.numba_version, llvm_version=info.llvm_version, os=info.os, board=info.board,
        gpu_name=extra.get("gpu_name", ""), compute_capability=extra.get("compute_capability", ""),
        max_threads_per_block=int(extra.get("max_threads_per_block", 0)),
        max_shared_memory_per_block=int(extra.get("max_shared_memory_per_block", 0)),
        max_registers_per_block=int(extra.get("max_registers_per_block", 0)),
        agent_version=agent_version, template_version=template_version, templates=templates,
    )


def capabilities_to_json(caps: pb.Capabilities) -> dict:
    """The device-info dict recorded in the tuning log (same keys as ``DeviceInfo.to_json``)."""
    data = {
        "arch": caps.arch, "cpu_model": caps.cpu_model, "cores": caps.cores,
        "isa_features": list(caps.isa_features), "numba_version": caps.numba_version,
        "llvm_version": caps.llvm_version, "os": caps.os, "board": caps.board,
        "agent_version": caps.agent_version, "template_version": caps.template_version,
    }
    for name in ("gpu_name", "compute_capability", "max_threads_per_block", "max_shared_memory_per_block",
                 "max_registers_per_block"):
        value = getattr(caps, name)
        if value:
            data[name] = value
    return data


def is_repeated(field) -> bool:
    """Whether a field descriptor is ``repeated`` (protobuf 7 dropped ``label`` for ``is_repeated``)."""
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == field.LABEL_REPEATED


def capabilities_from_json(data: dict, templates: Sequence[str] = ()) -> pb.Capabilities:
    """Inverse of :func:`capabilities_to_json` (the daemon keeps agents' capabilities as that dict)."""
    caps = pb.Capabilities(templates=list(templates))
    for name, field in pb.Capabilities.DESCRIPTOR.fields_by_name.items():
        if name not in data or name == "templates":
            continue
        value = data[name]
        if is_repeated(field):
            getattr(caps, name).extend(str(v) for v in value)
        elif field.type == field.TYPE_INT32:
            setattr(caps, name, int(value))
        else:
            setattr(caps, name, str(value))
    return caps


_SORTED_JSON = json.JSONEncoder(sort_keys=True)  # json.dumps(..., sort_keys=True) without a new encoder per call


def result_to_proto(lease_id: str, result: MeasureResult) -> pb.Measurement:
    return pb.Measurement(
        lease_id=lease_id, status=result.status.value, costs=result.costs,
        compile_time_s=result.compile_time_s, message=result.message,
        details_json=_SORTED_JSON.encode(result.details) if result.details else "",
    )


def result_from_proto(message: pb.Measurement) -> MeasureResult:
    """A result; raises ValueError for an unknown status or malformed details."""
    status = MeasureStatus(message.status)
    costs = tuple(float(c) for c in message.costs)
    if status.is_ok and (not costs or any(not (c >= 0) for c in costs)):
        raise ValueError("an ok measurement needs non-negative costs")
    details = loads_bounded(message.details_json, "details") if message.details_json else {}
    if not isinstance(details, dict):
        raise ValueError("details must be a JSON object")
    return MeasureResult(status=status, costs=costs if status.is_ok else (), compile_time_s=message.compile_time_s,
                         message=message.message[:4000], details=details)
