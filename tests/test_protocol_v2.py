"""Protocol v2 on the wire: one stream per agent carries registration, leases, batched results and
heartbeats; the scheduler's rules hold as for v1 (late results refused, requeue on agent loss,
template-version check, tokens)."""

from __future__ import annotations

import grpc
import pytest

from measure_agent.engine import MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.protocol.convert import result_to_proto
from measure_agent.protocol.v2 import agent_pb2 as pb2
from measure_agent.space import Config
from measure_agent.workload import parse_workload
from tuner.daemon.limits import MAX_STREAM_CREDIT
from tuner.log import TuningLog

from fleet_helpers import RawStream, start_daemon, wait_for

pytestmark = pytest.mark.timeout(120)
FAST = TimingConfig(repeat=1, warmup=0, run_timeout_s=10)
ITEM = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")
OK = MeasureResult(MeasureStatus.OK, costs=(1e-3,))


@pytest.fixture()
def daemon(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'v2.db'}") as log:
        daemon = start_daemon(log)
        yield daemon
        daemon.stop(grace_s=0.5)


def _lease_ids(stream: RawStream, count: int) -> list[str]:
    """Lease ids pushed to the stream until ``count`` arrived (other messages skipped)."""
    ids: list[str] = []
    while len(ids) < count:
        message = stream.receive()
        if message.WhichOneof("kind") == "leases":
            ids += [c.lease_id for c in message.leases.candidates]
    return ids


def test_register_lease_on_credit_and_batched_results(daemon):
    stream = RawStream(daemon.address)
    try:
        welcome = stream.hello(key="k", name="raw-1")
        assert welcome.agent_id and welcome.protocol_version == 2
        assert welcome.heartbeat_interval_s == daemon.scheduler.heartbeat_interval_s
        assert [a.name for a in daemon.scheduler.agents()] == ["raw-1"]
        batch = daemon.scheduler.submit("k", 1, 0, [ITEM] * 3, FAST)
        stream.send(credit=pb2.Credit(candidates=2))  # work queued before the credit
        first = _lease_ids(stream, 2)
        assert len(first) == 2
        stream.send(credit=pb2.Credit(candidates=5))  # credit left over waits for work
        [third] = _lease_ids(stream, 1)
        stream.send(results=pb2.Results(measurements=[result_to_proto(i, OK) for i in first + [third]]))
        wait_for(lambda: batch.remaining == 0, 10, "three results from one message")
        assert [r.measured_by for r in batch.results] == ["raw-1"] * 3
        more = daemon.scheduler.submit("k", 2, 0, [ITEM] * 2, FAST)  # pushed: credit 4 was waiting
        pushed = _lease_ids(stream, 2)
        stream.send(heartbeat=pb2.Heartbeat())
        kinds = []
        while "heartbeat_ack" not in kinds:
            kinds.append(stream.receive().WhichOneof("kind"))
        stream.send(results=pb2.Results(measurements=[result_to_proto(i, OK) for i in pushed]))
        wait_for(lambda: more.remaining == 0, 10, "pushed work reported")
    finally:
        stream.close()


def test_late_result_is_refused_and_lost_stream_requeues_at_once(daemon):
    slow = RawStream(daemon.address)
    fast = RawStream(daemon.address)
    try:
        slow_id = slow.hello(name="slow").agent_id
        batch = daemon.scheduler.submit("k", 1, 0, [ITEM], FAST)
        slow.send(credit=pb2.Credit(candidates=1))
        [lease_id] = _lease_ids(slow, 1)
        slow.close()  # the agent is lost: its lease goes back to the queue without waiting for a timeout
        wait_for(lambda: slow_id not in {a.agent_id for a in daemon.scheduler.agents()}, 10, "slow gone")
        assert daemon.scheduler.expired_leases == 1  # taken back from an agent lost without a word
        fast.hello(name="fast")
        fast.send(credit=pb2.Credit(candidates=1))
        [again] = _lease_ids(fast, 1)
        assert again != lease_id
        fast.send(results=pb2.Results(measurements=[result_to_proto(lease_id, OK)]))  # not its lease
        message = fast.receive()
        assert list(message.results_refused.lease_ids) == [lease_id]
        assert batch.remaining == 1
        fast.send(results=pb2.Results(measurements=[result_to_proto(again, OK)]))
        wait_for(lambda: batch.remaining == 0, 10, "the requeued candidate measured")
        assert batch.results[0].measured_by == "fast"
    finally:
        fast.close()


def test_leaving_requeues_what_the_agent_held(daemon):
    stream = RawStream(daemon.address)
    stream.hello(name="leaver")
    daemon.scheduler.submit("k", 1, 0, [ITEM] * 2, FAST)
    stream.send(credit=pb2.Credit(candidates=2))
    _lease_ids(stream, 2)
    assert daemon.scheduler.job_counts(1) == (0, 2)
    stream.send(leaving=pb2.Leaving())
    wait_for(lambda: daemon.scheduler.job_counts(1) == (2, 0), 10, "leases back in the queue")
    assert daemon.scheduler.agents() == [] and daemon.scheduler.expired_leases == 0  # returned, not lost
    stream.close()


def test_template_and_protocol_versions_are_refused_with_one_line_naming_both(daemon):
    for kwargs, words in [({"template_version": "0" * 16}, ["templates version " + "0" * 16, daemon.catalog.version]),
                          ({"protocol_version": 1}, ["agent speaks protocol 1, daemon 2"])]:
        stream = RawStream(daemon.address)
        with pytest.raises(grpc.RpcError) as refused:
            stream.hello(name="old", **kwargs)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = refused.value.details()
        assert "\n" not in details and all(w in details for w in words), details
        stream.close()
    assert daemon.scheduler.agents() == []
    assert [r.name for r in daemon.scheduler.refused()] == ["old"]


def test_the_first_message_must_be_hello(daemon):
    stream = RawStream(daemon.address)
    stream.send(credit=pb2.Credit(candidates=1))
    with pytest.raises(grpc.RpcError) as refused:
        stream.receive()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stream.close()


def test_a_stream_without_hello_in_time_is_closed_with_one_line(daemon):
    daemon.streams.hello_wait_s = 0.3  # MAX_HELLO_WAIT_S, shortened for the test
    stream = RawStream(daemon.address)
    with pytest.raises(grpc.RpcError) as refused:
        stream.receive()
    assert refused.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert refused.value.details() == "no hello within 0.3 s"
    stream.close()


def test_credit_beyond_the_limit_is_clamped(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'v2.db'}") as log:
        daemon = start_daemon(log, agent_timeout_s=60.0)  # 256 leases take a while on a loaded host
        try:
            _clamped_credit(daemon)
        finally:
            daemon.stop(grace_s=0.5)


def _clamped_credit(daemon) -> None:
    stream = RawStream(daemon.address)
    try:
        stream.hello()
        batch = daemon.scheduler.submit("k", 1, 0, [ITEM] * (MAX_STREAM_CREDIT + 10), FAST)
        stream.send(credit=pb2.Credit(candidates=MAX_STREAM_CREDIT))
        stream.send(credit=pb2.Credit(candidates=10**6))  # asks for more than the limit, in total
        leased = _lease_ids(stream, MAX_STREAM_CREDIT)
        stream.send(heartbeat=pb2.Heartbeat())
        while stream.receive().WhichOneof("kind") != "heartbeat_ack":  # every lease pushed came before it
            pass
        assert len(leased) == MAX_STREAM_CREDIT
        assert daemon.scheduler.has_queued("k")
        assert batch.remaining == MAX_STREAM_CREDIT + 10
        stream.send(results=pb2.Results(measurements=[result_to_proto(i, OK) for i in leased]))
        stream.send(credit=pb2.Credit(candidates=10))  # room again: the rest comes
        rest = _lease_ids(stream, 10)
        stream.send(results=pb2.Results(measurements=[result_to_proto(i, OK) for i in rest]))
        wait_for(lambda: batch.remaining == 0, 20, "every result reported")
    finally:
        stream.close()


def test_an_agent_presumed_dead_is_told_to_join_again(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'v2.db'}") as log:
        daemon = start_daemon(log)
        stream = RawStream(daemon.address)
        try:
            agent_id = stream.hello().agent_id
            with daemon.scheduler._lock:  # as if its heartbeats had stopped reaching the daemon
                daemon.scheduler._agents[agent_id].last_heartbeat -= 60
            daemon.scheduler.expire_dead_agents()
            stream.send(heartbeat=pb2.Heartbeat())
            with pytest.raises(grpc.RpcError) as ended:
                while True:
                    stream.receive()
            assert ended.value.code() == grpc.StatusCode.NOT_FOUND and "join again" in ended.value.details()
        finally:
            stream.close()
            daemon.stop(grace_s=0.5)


def test_an_agent_of_protocol_1_hears_one_line_naming_both_versions(daemon):
    from measure_agent.device import detect_device
    from measure_agent.protocol import V1_PROTOCOL_VERSION
    from measure_agent.protocol.convert import capabilities_to_proto
    from measure_agent.protocol.v1 import fleet_pb2 as pb1
    from measure_agent.protocol.v1 import fleet_pb2_grpc as pb1_grpc
    from measure_agent.templates import testing_catalog

    caps = capabilities_to_proto(detect_device(), "old", testing_catalog().version, [])
    with grpc.insecure_channel(daemon.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb1_grpc.AgentServiceStub(channel).Register(pb1.RegisterRequest(
                key="k", name="old-agent", capabilities=caps, protocol_version=V1_PROTOCOL_VERSION, parallel=1),
                timeout=30)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == ("agent speaks protocol 1, daemon 2: install the same tunefleet version on "
                                       "both")
    [remembered] = daemon.scheduler.refused()  # shown by `tuner agents` until it is upgraded
    assert (remembered.name, remembered.protocol_version, remembered.expected_protocol_version) == ("old-agent", 1, 2)


def test_an_agent_facing_a_daemon_of_protocol_1_exits_with_one_line_naming_both(kernel_cache_dir):
    from concurrent import futures

    from measure_agent.cli import EXIT_REFUSED
    from measure_agent.protocol.v1 import fleet_pb2_grpc as pb1_grpc

    from fleet_helpers import start_agent

    old_daemon = grpc.server(futures.ThreadPoolExecutor(2))  # serves v1's agent service, as before v2
    pb1_grpc.add_AgentServiceServicer_to_server(pb1_grpc.AgentServiceServicer(), old_daemon)
    port = old_daemon.add_insecure_port("127.0.0.1:0")
    old_daemon.start()
    try:
        agent = start_agent(f"127.0.0.1:{port}", "k", "new-agent", kernel_cache_dir)
        _, err = agent.communicate(timeout=120)
        assert agent.returncode == EXIT_REFUSED
        assert "the daemon speaks protocol 1, this agent 2: install the same tunefleet version on both" in err
    finally:
        old_daemon.stop(0)


def test_a_stream_needs_the_agent_token(tmp_path):
    from tuner.daemon.daemon import Security

    token = "agent-token-0123456789"
    with TuningLog(f"sqlite:///{tmp_path / 'v2.db'}") as log:
        daemon = start_daemon(log, security=Security(agent_tokens=(token,), client_tokens=("client-token-0123456789",)))
        try:
            for metadata in [(), (("authorization", "Bearer client-token-0123456789"),)]:
                stream = RawStream(daemon.address, metadata=metadata)
                with pytest.raises(grpc.RpcError) as refused:
                    stream.hello()
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "agent token" in refused.value.details()
                stream.close()
            stream = RawStream(daemon.address, metadata=(("authorization", f"Bearer {token}"),))
            assert stream.hello(name="trusted").agent_id
            assert [a.name for a in daemon.scheduler.agents()] == ["trusted"]
            stream.close()
            assert daemon.auth.refused == 2
        finally:
            daemon.stop(grace_s=0.5)


def test_results_carry_credit_to_a_daemon_that_says_so(daemon):
    stream = RawStream(daemon.address)
    try:
        assert stream.hello(key="k", name="raw-1").results_carry_credit
        batch = daemon.scheduler.submit("k", 1, 0, [ITEM] * 3, FAST)
        stream.send(credit=pb2.Credit(candidates=1))
        [first] = _lease_ids(stream, 1)
        # no Credit message from here on: each result brings the next lease
        stream.send(results=pb2.Results(measurements=[result_to_proto(first, OK)], credit=1))
        [second] = _lease_ids(stream, 1)
        stream.send(results=pb2.Results(measurements=[result_to_proto(second, OK)], credit=1))
        [third] = _lease_ids(stream, 1)
        stream.send(results=pb2.Results(measurements=[result_to_proto(third, OK)]))
        wait_for(lambda: batch.remaining == 0, 10, "three results, one Credit message")
    finally:
        stream.close()


@pytest.mark.parametrize("carry", [True, False], ids=["daemon-reads-credit-on-results", "earlier-daemon"])
def test_an_agent_sends_credit_as_the_daemon_reads_it(tmp_path, kernel_cache_dir, monkeypatch, carry):
    from tuner.daemon.stream_service import StreamAgentService

    from fleet_helpers import start_agent, stop_all

    monkeypatch.setattr(StreamAgentService, "results_carry_credit", carry)
    credit_messages = []
    handle = StreamAgentService._handle

    def counting(self, session, message):
        if message.WhichOneof("kind") == "credit":
            credit_messages.append(message.credit.candidates)
        handle(self, session, message)

    monkeypatch.setattr(StreamAgentService, "_handle", counting)
    with TuningLog(f"sqlite:///{tmp_path / 'credit.db'}") as log:
        daemon = start_daemon(log)
        agent = start_agent(daemon.address, "k", "credit-agent", kernel_cache_dir, parallel=1)
        try:
            wait_for(lambda: daemon.scheduler.agent_count("k") == 1, 60, "the agent joined")
            batch = daemon.scheduler.submit("k", 1, 0, [ITEM] * 8, FAST)  # more than its first credit (2)
            wait_for(lambda: batch.remaining == 0, 90, "eight results")
            assert all(r.status is MeasureStatus.OK for r in batch.results)
        finally:
            stop_all([agent])
            daemon.stop(grace_s=0.5)
    if carry:
        assert credit_messages == [2]  # the first credit; the rest rode on the results
    else:
        assert len(credit_messages) >= 4 and credit_messages[0] == 2


def test_take_when_leased_hands_leases_over_once_at_once_or_from_the_reader(daemon):
    """How an agent's lease-ahead thread gets its next batch: handed over with the leases (by the
    stream's reader when they come, at once when they are queued), withdrawn by cancel_take, and
    handed nothing once the stream ended."""
    import queue

    from measure_agent.device import detect_device
    from measure_agent.protocol import PROTOCOL_VERSION
    from measure_agent.protocol.connection import open_channel
    from measure_agent.protocol.convert import capabilities_to_proto
    from measure_agent.protocol.stream import AgentStream
    from measure_agent.templates import testing_catalog

    caps = capabilities_to_proto(detect_device(), "test", testing_catalog().version, [])
    channel = open_channel(daemon.address)
    stream = AgentStream(channel, ()).open(pb2.Hello(key="k", name="handover", capabilities=caps, parallel=1,
                                                      protocol_version=PROTOCOL_VERSION))
    handed: queue.SimpleQueue = queue.SimpleQueue()
    try:
        stream.take_when_leased(1, handed.put)  # nothing leased yet: the reader hands them over later
        with pytest.raises(queue.Empty):
            handed.get(timeout=0.3)
        daemon.scheduler.submit("k", 1, 0, [ITEM] * 3, FAST)
        stream.send(credit=pb2.Credit(candidates=3))
        assert len(handed.get(timeout=10)) == 1  # at most what was asked for
        wait_for(lambda: stream._inbox.qsize() == 2, 10, "the other two leases queued")
        stream.take_when_leased(2, handed.put)  # queued: handed over at once, in this thread
        assert len(handed.get_nowait()) == 2
        stream.take_when_leased(1, handed.put)
        assert stream.cancel_take() and not stream.cancel_take()  # withdrawn; nothing left to withdraw
        stream.take_when_leased(1, handed.put)
        stream.close()  # the end of the stream hands over what take() would return then: nothing
        assert handed.get(timeout=10) == []
        assert not stream.cancel_take()
        stream.take_when_leased(1, handed.put)  # after the end: at once, nothing
        assert handed.get_nowait() == [] and stream.take(1, 5.0) == []
        assert handed.empty()
    finally:
        stream.close()
        channel.close()
