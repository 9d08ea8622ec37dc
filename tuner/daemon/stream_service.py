"""Protocol v2's agent service: one stream per agent, served on the daemon's event loop.

An agent's stream is one coroutine (its writer) and one task (its reader), never a thread. Agents
with credit to spare wait in their key's queue of sessions; when the scheduler queues candidates
of a key it says so (:meth:`Scheduler.add_work_listener`) and the loop hands them to those
sessions, oldest waiter first. So a candidate costs the daemon a lease and a report on the
scheduler whatever the fleet's size, and a heartbeat is a dictionary look-up.

Everything else is the scheduler's, as for v1: lease deadlines, requeue when an agent is lost (here
also the moment its stream ends), late results refused, quarantine.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field

import grpc

from measure_agent.engine import TimingConfig
from measure_agent.protocol import PROTOCOL_VERSION
from measure_agent.protocol.convert import capabilities_to_json, timing_to_proto
from measure_agent.protocol.errors import FleetError, InvalidRequest, NotFound, shown
from measure_agent.protocol.v1 import fleet_pb2 as pb1
from measure_agent.protocol.v2 import agent_pb2 as pb
from measure_agent.protocol.v2 import agent_pb2_grpc as pb_grpc
from measure_agent.templates import TemplateCatalog
from tuner.daemon.limits import MAX_HELLO_WAIT_S, MAX_STREAM_CREDIT
from tuner.daemon.scheduler import Candidate, Scheduler
from tuner.daemon.service import arriving_result, check_registration, refusal

logger = logging.getLogger("tunefleet.daemon")



@dataclass(eq=False)
class _Session:
    agent_id: str
    key: str
    name: str
    outbox: asyncio.Queue  # DaemonMessage to write, or None: end the stream (with ``error`` if set)
    credit: int = 0
    error: FleetError | None = None
    ended: bool = False
    said_goodbye: bool = False  # it sent Leaving (else, a stream that ends is an agent lost)

    def send(self, message: pb.DaemonMessage) -> None:
        if not self.ended:
            self.outbox.put_nowait(message)

    def end(self, error: FleetError | None = None) -> None:
        if not self.ended:
            self.ended = True
            self.error = error
            self.outbox.put_nowait(None)


@dataclass
class _Waiting:
    """Sessions of one key with credit left, the longest waiting first."""

    sessions: dict[str, _Session] = field(default_factory=dict)


class StreamAgentService(pb_grpc.AgentServiceServicer):
    # told to agents in the welcome: they may send new credit on their results (one message a
    # batch, not two); False only in tests standing in for a daemon of an earlier release
    results_carry_credit = True

    def __init__(self, scheduler: Scheduler, catalog: TemplateCatalog,
                 hello_wait_s: float = MAX_HELLO_WAIT_S) -> None:
        self.scheduler = scheduler
        self.hello_wait_s = hello_wait_s  # tests shorten it
        self.catalog = catalog
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[str, _Waiting] = {}

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve on ``loop`` (the server's): from now on queued work is pushed to waiting agents."""
        self._loop = loop
        self.scheduler.add_work_listener(self._work_queued)

    @property
    def streams(self) -> int:
        """Agents waiting for work (for tests and metrics)."""
        return sum(len(w.sessions) for w in self._waiting.values())

    # -- one agent's stream -----------------------------------------------------------------
    async def Connect(self, request_iterator, context: grpc.aio.ServicerContext):
        try:
            first = await asyncio.wait_for(context.read(), self.hello_wait_s)
        except asyncio.TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no hello within {self.hello_wait_s:g} s")
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message of a stream must be hello")
        hello = first.hello
        try:
            check_registration(hello, self.catalog, PROTOCOL_VERSION)
        except FleetError as exc:
            logger.warning("refused agent %s (key %s) from %s: %s", shown(hello.name), shown(hello.key),
                           context.peer(), exc)
            self.scheduler.refuse(refusal(hello, context.peer(), self.catalog.version, exc, PROTOCOL_VERSION))
            await context.abort(exc.code, str(exc))
        agent = self.scheduler.register(hello.key, hello.name or context.peer(),
                                        capabilities_to_json(hello.capabilities), hello.parallel, context.peer(),
                                        templates=tuple(hello.capabilities.templates))
        logger.info("agent %s (%s) joined key %s from %s", agent.name, agent.agent_id[:8], agent.key, agent.peer)
        session = _Session(agent.agent_id, agent.key, agent.name, asyncio.Queue())
        await context.write(pb.DaemonMessage(welcome=pb.Welcome(
            agent_id=agent.agent_id, heartbeat_interval_s=self.scheduler.heartbeat_interval_s,
            agent_timeout_s=self.scheduler.agent_timeout_s, protocol_version=PROTOCOL_VERSION,
            results_carry_credit=self.results_carry_credit)))
        reader = asyncio.ensure_future(self._read(session, context))
        try:
            while (message := await session.outbox.get()) is not None:
                await context.write(message)
        finally:
            reader.cancel()
            self._stop_waiting(session)
            # what it held goes back to the queue at once, not after the agent timeout
            self.scheduler.leave(session.agent_id, lost=not session.said_goodbye)
            logger.info("agent %s (%s) left key %s", session.name, session.agent_id[:8], session.key)
        if session.error is not None:
            await context.abort(session.error.code, str(session.error))

    async def _read(self, session: _Session, context: grpc.aio.ServicerContext) -> None:
        try:
            while not session.ended:
                message = await context.read()
                if message is grpc.aio.EOF:
                    break
                self._handle(session, message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken stream is the agent leaving
            logger.info("stream of agent %s ended: %s", session.agent_id[:8], str(exc)[:200])
        session.end()

    def _handle(self, session: _Session, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "credit":
            self._grant(session, message.credit.candidates)
        elif kind == "results":
            self._accept(session, message.results.measurements)
            if message.results.credit:
                self._grant(session, message.results.credit)
        elif kind == "heartbeat":
            if self.scheduler.heartbeat(session.agent_id):
                session.send(pb.DaemonMessage(heartbeat_ack=pb.HeartbeatAck()))
            else:
                session.end(NotFound("the daemon does not know this agent any more (presumed dead): join again"))
        elif kind == "leaving":
            session.said_goodbye = True
            session.end()
        else:
            session.end(InvalidRequest(f"unexpected {kind or 'empty'} message on an open stream"))

    def _grant(self, session: _Session, candidates: int) -> None:
        session.credit = min(MAX_STREAM_CREDIT, session.credit + max(0, candidates))
        self._serve(session)

    def _accept(self, session: _Session, measurements) -> None:
        # one scheduler lock for the whole batch, not one per result
        refused = self.scheduler.report_many(session.agent_id, [
            (m.lease_id, arriving_result(m, measured_by=session.name)) for m in measurements])
        if refused:
            logger.info("rejected %d late or unknown results from agent %s", len(refused), session.agent_id[:8])
            session.send(pb.DaemonMessage(results_refused=pb.ResultsRefused(lease_ids=refused)))

    # -- handing out work --------------------------------------------------------------------
    def _serve(self, session: _Session) -> None:
        """Lease what the session has credit for; it waits in its key's queue while credit is left."""
        if session.ended or session.credit <= 0:
            self._stop_waiting(session)
            return
        # credit re-sent before results cannot make an agent hold more than the limit
        taken = self.scheduler.lease(session.agent_id, session.credit, 0.0, max_held=MAX_STREAM_CREDIT)
        if taken is None:
            session.end(NotFound("the daemon does not know this agent any more (presumed dead): join again"))
            return
        if taken:
            session.credit -= len(taken)
            session.send(pb.DaemonMessage(leases=pb.Leases(candidates=[_candidate_to_proto(c) for c in taken])))
        self._stop_waiting(session)
        if session.credit > 0:
            self._waiting.setdefault(session.key, _Waiting()).sessions[session.agent_id] = session

    def _stop_waiting(self, session: _Session) -> None:
        waiting = self._waiting.get(session.key)
        if waiting is not None:
            waiting.sessions.pop(session.agent_id, None)

    def _work_queued(self, key: str) -> None:
        """The scheduler's news (any thread, its lock held): dispatch on the loop, later."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._dispatch, key)
        except RuntimeError:  # the loop is closed: the daemon is stopping
            pass

    def _dispatch(self, key: str) -> None:
        waiting = self._waiting.get(key)
        if waiting is None:
            return
        for session in list(waiting.sessions.values()):
            if not self.scheduler.has_queued(key):
                break
            self._serve(session)


def _candidate_to_proto(candidate: Candidate) -> pb1.Candidate:
    return pb1.Candidate(lease_id=candidate.lease_id, workload=candidate.item.workload.key,
                         config_json=candidate.item.config.json_text(), target=candidate.item.target,
                         timing=_timing_proto(candidate.batch.timing))


@functools.lru_cache(maxsize=64)
def _timing_proto(timing: TimingConfig) -> pb1.Timing:
    """A job's timing as a message, built once (a candidate's message copies it, so it is never changed)."""
    return timing_to_proto(timing)
