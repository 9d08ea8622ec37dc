"""Client of the daemon's ClientService; gRPC errors come back as protocol exceptions."""

from __future__ import annotations

import time
from typing import Callable, Iterator

import grpc

from measure_agent.engine import TimingConfig
from measure_agent.protocol.connection import TlsFiles, auth_metadata, open_channel
from measure_agent.protocol.convert import timing_to_proto
from measure_agent.protocol.errors import Unavailable, from_rpc_error
from measure_agent.protocol.v1 import fleet_pb2 as pb
from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc


class FleetClient:
    def __init__(self, address: str, timeout_s: float = 30.0, token: str | None = None,
                 tls: TlsFiles | None = None, on_outage: Callable[[str], None] | None = None) -> None:
        """``on_outage`` gets a note when a daemon that answered goes away and the client waits for it."""
        self.address = address
        self.timeout_s = timeout_s
        self.on_outage = on_outage or (lambda note: None)
        # Only a daemon that answered is waited for when it goes away (a restart); a daemon never
        # reached is a wrong address or one that is down: that fails at once.
        self._reached = False
        self._metadata = auth_metadata(token)
        self._channel = open_channel(address, tls)
        self._stub = pb_grpc.ClientServiceStub(self._channel)

    def _call(self, method, request, **kwargs):
        try:
            reply = method(request, timeout=kwargs.pop("timeout", self.timeout_s), metadata=self._metadata, **kwargs)
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            self._reached = self._reached or not isinstance(error, Unavailable)  # an error reply is an answer
            raise error from None
        self._reached = True
        return reply

    def submit(self, workload: str, device_key: str, *, target: str = "cpu", strategy: str = "xgb",
               trials: int = 64, seed: int = 0, early_stopping: int | None = None, priority: int = 0,
               timing: TimingConfig | None = None, wait_timeout_s: float = 0.0, pins: tuple[str, ...] = (),
               constraints: tuple[str, ...] = (), family: str = "", transfer: bool = True,
               time_budget_s: float | None = None) -> pb.JobStatus:
        spec = pb.JobSpec(workload=workload, device_key=device_key, target=target, strategy=strategy, trials=trials,
                          seed=seed, early_stopping=early_stopping or 0, priority=priority,
                          wait_timeout_s=wait_timeout_s, pins=list(pins), constraints=list(constraints),
                          family=family, no_transfer=not transfer, time_budget_s=time_budget_s or 0.0)
        if timing is not None:
            spec.timing.CopyFrom(timing_to_proto(timing))
        return self._call(self._stub.SubmitJob, spec)

    def job(self, job_id: int) -> pb.JobStatus:
        return self._call(self._stub.GetJob, pb.JobRef(job_id=job_id))

    def jobs(self) -> list[pb.JobStatus]:
        return list(self._call(self._stub.ListJobs, pb.ListJobsRequest()).jobs)

    def cancel(self, job_id: int) -> pb.JobStatus:
        return self._call(self._stub.CancelJob, pb.JobRef(job_id=job_id))

    def measure(self, workload: str, device_key: str, configs_json: list[str], *, target: str = "cpu",
                timing: TimingConfig | None = None, wait_timeout_s: float = 0.0) -> pb.MeasureReply:
        """Measure configs once on agents of ``device_key`` (not recorded in the log)."""
        request = pb.MeasureRequest(workload=workload, device_key=device_key, target=target,
                                    configs_json=configs_json, wait_timeout_s=wait_timeout_s)
        if timing is not None:
            request.timing.CopyFrom(timing_to_proto(timing))
        return self._call(self._stub.Measure, request, timeout=None)

    def agents(self) -> pb.AgentList:
        return self._call(self._stub.ListAgents, pb.ListAgentsRequest())

    def watch(self, job_id: int, reconnect_s: float = 600.0) -> Iterator[pb.JobStatus]:
        """Status after every change until the job ends.

        When a daemon that answered goes away (restart, crash) the watch reconnects with capped
        exponential backoff for up to ``reconnect_s`` seconds of outage, then raises :class:`Unavailable`.
        """
        outage = _Outage(self.address, reconnect_s, self.on_outage)
        while True:
            try:
                for status in self._stub.WatchJob(pb.JobRef(job_id=job_id), metadata=self._metadata):
                    self._reached = True
                    outage.over()
                    yield status
                    if status.state in ("done", "failed", "cancelled"):
                        return
                # The stream ended without a final state: the daemon stopped; follow it again.
                self._reached = True
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                lost = isinstance(error, Unavailable) or exc.code() == grpc.StatusCode.CANCELLED
                if not (lost and self._reached):
                    raise error from None
            outage.wait()

    def job_when_reachable(self, job_id: int, reconnect_s: float = 600.0) -> pb.JobStatus:
        """:meth:`job`, waiting through an outage of a daemon that answered before (it may be restarting)
        as :meth:`watch` does; a daemon this client never reached fails at once."""
        outage = _Outage(self.address, reconnect_s, self.on_outage)
        while True:
            try:
                return self.job(job_id)
            except Unavailable:
                if not self._reached:
                    raise
                outage.wait()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "FleetClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Outage:
    """Capped exponential backoff through a daemon outage of at most ``limit_s`` seconds; ``notify``
    hears when an outage starts and when it is over."""

    def __init__(self, address: str, limit_s: float, notify: Callable[[str], None]) -> None:
        self.address = address
        self.limit_s = limit_s
        self.notify = notify
        self._started, self._backoff = None, 0.25

    def over(self) -> None:
        if self._started is not None:
            self.notify(f"reconnected to the daemon at {self.address}")
        self._started, self._backoff = None, 0.25

    def wait(self) -> None:
        now = time.monotonic()
        if self._started is None:
            self._started = now
            self.notify(f"lost the daemon at {self.address}; retrying for up to {self.limit_s:g} s "
                        "(it may be restarting)")
        if now - self._started > self.limit_s:
            raise Unavailable(f"daemon at {self.address} unreachable for {self.limit_s:g} s")
        time.sleep(self._backoff)
        self._backoff = min(5.0, self._backoff * 2)
