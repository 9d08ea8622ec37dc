"""Agents, their leases and the queues of candidates waiting for them, per device key.

Jobs put batches of candidates in the queue of their device key and wait for the results. Agents
of that key lease candidates (the highest job priority first; jobs of equal priority take turns,
candidate by candidate) and report results. An agent silent for ``agent_timeout_s`` is presumed
dead: its leases go back to the front of the queue for other agents, and a result it sends later
is rejected, so nothing is recorded twice and nothing is lost.

Every lease also has a deadline that follows from its timing config (what building, loading and
running all the candidates the agent holds may take at most, plus a grace): an agent that keeps
heartbeating but does not report in time loses the lease the same way, and one that does so
:data:`~tuner.daemon.limits.OVERDUE_LEASES_TO_QUARANTINE` times is quarantined: it stays
registered (and shown) but gets no more candidates.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from measure_agent.engine import MeasureInput, MeasureResult, TimingConfig
from tuner.daemon.limits import (
    LEASE_GRACE_S,
    MAX_DEVICE_KINDS_PER_KEY,
    MAX_REFUSED_AGENTS_KEPT,
    OVERDUE_LEASES_TO_QUARANTINE,
)
from tuner.fleet.agents import RefusedAgent

logger = logging.getLogger("tunefleet.daemon")

# Entries of ended leases the deadline heap may hold beyond twice the live leases before it is
# rebuilt: the floor keeps a small fleet from rebuilding it every few leases.
DEADLINE_HEAP_SLACK = 4096


@dataclass
class AgentState:
    agent_id: str
    key: str
    name: str
    device_info: dict  # what the agent said it is (the log's device-info form)
    templates: tuple[str, ...]  # the templates it has installed
    parallel: int
    peer: str
    registered_at: float
    last_heartbeat: float
    leases: set[str] = field(default_factory=set)
    overdue_leases: int = 0  # leases it held past their deadline
    quarantined: bool = False  # gets no more candidates


@dataclass
class Batch:
    """Candidates of one job waiting for results; ``results[i]`` belongs to ``items[i]``."""

    job_id: int
    key: str
    items: tuple[MeasureInput, ...]
    timing: TimingConfig
    results: list[MeasureResult | None]
    remaining: int
    # indices whose result arrived, in arrival order (appended after ``results[i]`` is set): a
    # job collects the new ones from where it left off instead of scanning every result
    finished: list[int] = field(default_factory=list)
    cancelled: bool = False
    requirement: Callable[[dict], bool] | None = None  # which agents may measure it (target options)


@dataclass
class Candidate:
    batch: Batch
    index: int
    priority: int
    lease_id: str | None = None
    agent_id: str | None = None
    deadline: float | None = None  # when the lease is taken back
    leased_at: float | None = None  # when the agent took it (lease-to-result latency)

    @property
    def worst_case_s(self) -> float:
        """The longest measuring it may take: build, load (each within the build timeout), run."""
        timing = self.batch.timing
        return 2 * timing.build_timeout_s + timing.run_timeout_s

    @property
    def item(self) -> MeasureInput:
        return self.batch.items[self.index]


# Told of every accepted result: (device key, result, seconds from its lease to its arrival).
ResultObserver = Callable[[str, MeasureResult, float], None]


class Scheduler:
    """Thread-safe; every public method takes the one lock. ``clock`` is injectable for tests.
    ``on_result`` (the daemon's metrics) is called for each accepted result, outside the lock."""

    def __init__(self, heartbeat_interval_s: float = 2.0, agent_timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, on_result: ResultObserver | None = None) -> None:
        if agent_timeout_s <= heartbeat_interval_s:
            raise ValueError("agent timeout must exceed the heartbeat interval")
        self.heartbeat_interval_s = heartbeat_interval_s
        self.agent_timeout_s = agent_timeout_s
        self._clock = clock
        self._result_observers: list[ResultObserver] = [on_result] if on_result is not None else []
        # One mutex, two kinds of waiters: job threads and watchers wait on ``_lock`` for any
        # change; agents' lease calls wait on their key's ``_work`` condition, woken only when
        # candidates of that key are queued (not by each of hundreds of results a second).
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        self._work: dict[str, threading.Condition] = {}
        self._agents: dict[str, AgentState] = {}
        self._queues: dict[str, dict[int, deque[Candidate]]] = {}
        self._leases: dict[str, Candidate] = {}
        self._served = itertools.count()
        self._lease_prefix = uuid.uuid4().hex[:16]
        self._lease_numbers = itertools.count(1)
        self._last_served: dict[int, int] = {}
        self._key_last_seen: dict[str, float] = {}
        # Per key, every kind of device registered under it since the daemon started (live or
        # gone), the most recent MAX_DEVICE_KINDS_PER_KEY: what the key can ever serve.
        self._key_devices: dict[str, dict[str, dict]] = {}
        self._started_jobs: set[int] = set()
        self._generation = 0
        # results accepted so far, and the count a driver gathering results waits for (the
        # lowest such target; inf: none): see wait_for_results
        self._accepted = 0
        self._accepted_wanted = math.inf
        self._enough_results = threading.Condition(self._mutex)
        self._nudges = 0
        self._agents_version = 0  # counts joins, departures and quarantines (see agents_version)
        self.expired_leases = 0
        self.results_by_status: Counter[str] = Counter()  # accepted results, for metrics
        self._recent_results: deque[float] = deque(maxlen=100_000)
        # heap of (deadline, lease id); an entry stays after its lease ends (reported, requeued,
        # cancelled) until its deadline passes or the heap is compacted (see _take)
        self._deadlines: list[tuple[float, str]] = []
        self._next_dead_scan = 0.0
        # (name, key, host) -> (the refusal, when last refused); oldest first, bounded
        self._refused: OrderedDict[tuple[str, str, str], tuple[RefusedAgent, float]] = OrderedDict()
        # Told (under the lock: must not block) the device key whenever candidates are queued for it:
        # the stream service pushes them to agents that gave credit, without a waiting thread each.
        self._work_listeners: list[Callable[[str], None]] = []

    # -- agents -----------------------------------------------------------------------------
    def register(self, key: str, name: str, device_info: dict, parallel: int = 1, peer: str = "",
                 templates: tuple[str, ...] = ()) -> AgentState:
        with self._lock:
            now = self._clock()
            agent = AgentState(
                agent_id=uuid.uuid4().hex, key=key, name=name, device_info=device_info, templates=tuple(templates),
                parallel=max(1, parallel), peer=peer, registered_at=now, last_heartbeat=now,
            )
            self._agents[agent.agent_id] = agent
            self._agents_version += 1
            self._key_last_seen[key] = now
            self._remember_device(key, device_info)
            for refused in [k for k in self._refused if k[:2] == (name, key)]:
                del self._refused[refused]  # it came back on the daemon's version
            self._notify()
            return agent

    def refuse(self, refusal: RefusedAgent) -> None:
        """Remember a refused registration (the latest per name, key and host, the most recent
        :data:`~tuner.daemon.limits.MAX_REFUSED_AGENTS_KEPT`), until that name and key register."""
        with self._lock:
            slot = (refusal.name, refusal.key, refusal.peer)
            earlier = self._refused.pop(slot, None)
            attempts = earlier[0].attempts + 1 if earlier else 1
            self._refused[slot] = (replace(refusal, attempts=attempts), self._clock())
            while len(self._refused) > MAX_REFUSED_AGENTS_KEPT:
                self._refused.popitem(last=False)

    def refused(self) -> list[RefusedAgent]:
        """The remembered refused registrations, most recent first, ``seconds_ago`` as of now."""
        with self._lock:
            now = self._clock()
            return [replace(refusal, seconds_ago=now - at) for refusal, at in reversed(self._refused.values())]

    def heartbeat(self, agent_id: str) -> bool:
        with self._lock:
            self._expire(scan_every=True)
            agent = self._agents.get(agent_id)
            if agent is None:
                return False
            agent.last_heartbeat = self._clock()
            self._key_last_seen[agent.key] = agent.last_heartbeat
            return True

    def leave(self, agent_id: str, lost: bool = False) -> None:
        """The agent is gone: its leases go back to the queue. ``lost``: it did not say goodbye (its
        stream broke), so they count as expired, as when an agent falls silent."""
        with self._lock:
            agent = self._agents.pop(agent_id, None)
            if agent is not None:
                self._agents_version += 1
                if lost:
                    self.expired_leases += len(agent.leases)
                self._requeue(agent)
                self._work_queued(agent.key)  # its own waiting lease answers "unknown" now

    def expire_dead_agents(self) -> int:
        with self._lock:
            self._expire_overdue_leases()
            return self._expire_dead_agents()

    def agents(self) -> list[AgentState]:
        with self._lock:
            self._expire(scan_every=True)
            return sorted(self._agents.values(), key=lambda a: (a.key, a.name, a.agent_id))

    def agent_name(self, agent_id: str) -> str:
        """The name a live agent registered with ("" when unknown)."""
        with self._lock:
            agent = self._agents.get(agent_id)
            return agent.name if agent is not None else ""

    @property
    def agents_version(self) -> int:
        """Moves whenever an agent joins, leaves, is presumed dead or is quarantined: what
        :meth:`parallelism` and :meth:`device_info` answer can change only when it moves."""
        return self._agents_version

    @property
    def deadline_entries(self) -> int:
        """Entries in the heap of lease deadlines, ended leases' included: bounded by about twice
        the live leases plus ``DEADLINE_HEAP_SLACK`` (see :meth:`_take`), whatever the fleet's rate."""
        with self._lock:
            return len(self._deadlines)

    def parallelism(self, key: str, requirement: Callable[[dict], bool] | None = None) -> int:
        """Candidates the key's live agents (that meet ``requirement``) measure at once. O(agents):
        a caller asking at every step keeps the answer until :attr:`agents_version` moves."""
        with self._lock:
            return sum(a.parallel for a in self._agents.values() if a.key == key and not a.quarantined
                       and (requirement is None or requirement(a.device_info)))

    def device_info(self, key: str, requirement: Callable[[dict], bool] | None = None) -> dict:
        """Device info of the most recently registered agent of ``key`` that meets ``requirement``."""
        with self._lock:
            agents = [a for a in self._agents.values()
                      if a.key == key and (requirement is None or requirement(a.device_info))]
            return max(agents, key=lambda a: a.registered_at).device_info if agents else {}

    def agent_count(self, key: str, requirement: Callable[[dict], bool] | None = None) -> int:
        with self._lock:
            return sum(1 for a in self._agents.values()
                       if a.key == key and (requirement is None or requirement(a.device_info)))

    def devices_seen(self, key: str) -> list[dict]:
        """The device info of each kind of agent that has registered under ``key`` since the daemon
        started, live or gone (agents of one kind differ only in facts no target names: cores,
        versions); empty when none has."""
        with self._lock:
            kinds = dict(self._key_devices.get(key, {}))
            for agent in self._agents.values():  # also any kind pushed out of the bounded memory
                if agent.key == key:
                    kinds.setdefault(_device_kind(agent.device_info), agent.device_info)
            return list(kinds.values())

    def seconds_without_agents(self, key: str, since: float,
                               requirement: Callable[[dict], bool] | None = None) -> float:
        """How long ``key`` has had no live agent that meets ``requirement`` (0 while it has one),
        counting from ``since``. Without a requirement, an agent of the key seen after ``since``
        restarts the count; with one, the count runs from ``since``, the start of the wait."""
        with self._lock:
            self._expire()  # job threads call this regularly: overdue leases are noticed without agents
            if any(a.key == key and not a.quarantined and (requirement is None or requirement(a.device_info))
                   for a in self._agents.values()):
                return 0.0
            if requirement is not None:
                return self._clock() - since
            return self._clock() - max(since, self._key_last_seen.get(key, since))

    def now(self) -> float:
        return self._clock()

    def results_per_second(self, window_s: float = 60.0) -> float:
        """Accepted results per second over the last ``window_s`` seconds."""
        with self._lock:
            since = self._clock() - window_s
            return sum(1 for t in self._recent_results if t >= since) / window_s

    # -- jobs' side -------------------------------------------------------------------------
    def submit(self, key: str, job_id: int, priority: int, items: Sequence[MeasureInput],
               timing: TimingConfig, requirement: Callable[[dict], bool] | None = None) -> Batch:
        batch = Batch(job_id, key, tuple(items), timing, [None] * len(items), len(items), requirement=requirement)
        with self._lock:
            queue = self._queues.setdefault(key, {}).setdefault(job_id, deque())
            queue.extend(Candidate(batch, i, priority) for i in range(len(items)))
            # no _notify: a submission is no news to those waiting for results, agents or cancellations
            self._work_queued(key, len(items) if requirement is None else None)
        return batch

    @property
    def generation(self) -> int:
        """Counts changes (results, agents, cancellations); see :meth:`wait_for_change`."""
        return self._generation

    def nudge(self) -> None:
        """Count a change nothing else announced (a job started), waking whoever waits for one
        (also in :meth:`wait_for_results`)."""
        with self._lock:
            self._notify()
            self._nudges += 1
            self._enough_results.notify_all()

    def wait_for_change(self, since_generation: int, timeout_s: float) -> bool:
        """Block until :attr:`generation` moves past ``since_generation`` or ``timeout_s`` passes;
        whether it moved."""
        with self._lock:
            if self._generation == since_generation:
                self._lock.wait(timeout_s)
            return self._generation != since_generation

    @property
    def results_accepted(self) -> int:
        """Counts accepted results; see :meth:`wait_for_results`."""
        return self._accepted

    def wait_for_results(self, count: int, timeout_s: float) -> bool:
        """Block until :attr:`results_accepted` reaches ``count``, ``timeout_s`` passes or a
        :meth:`nudge` comes; whether the count was reached. The waiter wakes when the count is
        reached, not at each result before it: hundreds of results a second cost it one wake-up."""
        deadline = time.monotonic() + timeout_s  # a real wait, whatever clock the scheduler keeps
        with self._lock:
            nudges = self._nudges
            while self._accepted < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._nudges != nudges:
                    return False
                self._accepted_wanted = min(self._accepted_wanted, count)
                self._enough_results.wait(remaining)
            return True

    def cancel_job(self, job_id: int) -> None:
        """Drop the job's queued and leased candidates; results for them are rejected."""
        with self._lock:
            for queues in self._queues.values():
                for candidate in queues.pop(job_id, ()):
                    candidate.batch.cancelled = True
            for lease_id, candidate in list(self._leases.items()):
                if candidate.batch.job_id == job_id:
                    candidate.batch.cancelled = True
                    del self._leases[lease_id]
                    agent = self._agents.get(candidate.agent_id or "")
                    if agent:
                        agent.leases.discard(lease_id)
            self._last_served.pop(job_id, None)
            self._notify()

    def job_counts(self, job_id: int) -> tuple[int, int]:
        """(queued, leased) candidates of a job."""
        with self._lock:
            queued = sum(len(q.get(job_id, ())) for q in self._queues.values())
            leased = sum(1 for c in self._leases.values() if c.batch.job_id == job_id)
            return queued, leased

    def job_started(self, job_id: int) -> bool:
        """Whether any candidate of the job has reached an agent."""
        with self._lock:
            return job_id in self._started_jobs

    def device_keys(self) -> list[str]:
        """Keys with a live agent or with candidates queued or leased."""
        with self._lock:
            keys = {a.key for a in self._agents.values()}
            keys |= {k for k, queues in self._queues.items() if any(queues.values())}
            keys |= {c.batch.key for c in self._leases.values()}
            return sorted(keys)

    def key_counts(self, key: str) -> tuple[int, int]:
        """(queued, leased) candidates of a device key."""
        with self._lock:
            queued = sum(len(q) for q in self._queues.get(key, {}).values())
            leased = sum(1 for c in self._leases.values() if c.batch.key == key)
            return queued, leased

    # -- agents' side -----------------------------------------------------------------------
    def add_result_observer(self, observer: ResultObserver) -> None:
        """Tell ``observer`` of every accepted result too (as ``on_result``), outside the lock."""
        with self._lock:
            self._result_observers.append(observer)

    def add_work_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(key)`` whenever candidates of ``key`` are queued or requeued. It runs
        under the scheduler's lock, so it must only hand the news on (to an event loop)."""
        with self._lock:
            self._work_listeners.append(listener)

    def has_queued(self, key: str) -> bool:
        """Whether any candidate of ``key`` waits for an agent (cost: the key's jobs, not its agents)."""
        with self._lock:
            return any(self._queues.get(key, {}).values())

    def lease(self, agent_id: str, max_candidates: int, wait_s: float,
              max_held: int | None = None) -> list[Candidate] | None:
        """Up to ``max_candidates`` for the agent, waiting up to ``wait_s`` for the first; None if unknown.
        ``max_held``: the agent never holds more leases than this at once (none when it already does)."""
        deadline = self._clock() + max(0.0, wait_s)
        with self._lock:
            while True:
                self._expire(scan_every=True)
                agent = self._agents.get(agent_id)
                if agent is None:
                    return None
                agent.last_heartbeat = self._clock()  # a lease call shows the agent is alive
                room = max(1, max_candidates)
                if max_held is not None:
                    room = min(room, max_held - len(agent.leases))
                    if room <= 0:
                        return []
                taken = self._take(agent, room)
                if taken:
                    return taken
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return []
                self._work_condition(agent.key).wait(min(remaining, self.heartbeat_interval_s))

    def report(self, agent_id: str, lease_id: str, result: MeasureResult) -> bool:
        """Record a result; False when the lease is not (or no longer) this agent's."""
        return not self.report_many(agent_id, [(lease_id, result)])

    def report_many(self, agent_id: str, reports: Iterable[tuple[str, MeasureResult]]) -> list[str]:
        """Record an agent's batch of results under one lock; returns the lease ids refused (not, or
        no longer, this agent's)."""
        refused: list[str] = []
        observed: list[tuple[str, MeasureResult, float]] = []
        released = False
        with self._lock:
            agent = self._agents.get(agent_id)
            now = self._clock()
            for lease_id, result in reports:
                candidate = self._leases.get(lease_id)
                if candidate is None or agent is None or candidate.agent_id != agent_id:
                    refused.append(lease_id)
                    continue
                del self._leases[lease_id]
                agent.leases.discard(lease_id)
                agent.last_heartbeat = now
                released = True
                batch = candidate.batch
                if batch.results[candidate.index] is None:
                    batch.results[candidate.index] = result
                    batch.finished.append(candidate.index)
                    batch.remaining -= 1
                    self._accepted += 1
                    self.results_by_status[result.status.value] += 1
                    self._recent_results.append(now)
                    observed.append((batch.key, result, now - (candidate.leased_at or now)))
            if released:
                self._notify()
                if self._accepted >= self._accepted_wanted:
                    self._accepted_wanted = math.inf
                    self._enough_results.notify_all()
        for key, result, lease_to_result_s in observed:
            for observer in self._result_observers:
                observer(key, result, lease_to_result_s)
        return refused

    # -- internals (lock held) --------------------------------------------------------------
    def _remember_device(self, key: str, device_info: dict) -> None:
        kinds = self._key_devices.setdefault(key, {})
        kind = _device_kind(device_info)
        kinds.pop(kind, None)  # the most recent last
        kinds[kind] = device_info
        while len(kinds) > MAX_DEVICE_KINDS_PER_KEY:
            del kinds[next(iter(kinds))]

    def _notify(self) -> None:
        self._generation += 1
        self._lock.notify_all()

    def _work_condition(self, key: str) -> threading.Condition:
        condition = self._work.get(key)
        if condition is None:
            condition = self._work[key] = threading.Condition(self._mutex)
        return condition

    def _work_queued(self, key: str, count: int | None = None) -> None:
        """Wake the key's waiting leases: ``count`` of them for ``count`` candidates any agent may
        take (each takes at least one), all of them when some agents may not (a requirement)."""
        condition = self._work.get(key)
        if condition is not None:
            if count is None:
                condition.notify_all()
            else:
                condition.notify(count)
        for listener in self._work_listeners:
            listener(key)

    def _take(self, agent: AgentState, n: int) -> list[Candidate]:
        if agent.quarantined:
            return []
        queues = self._queues.get(agent.key, {})
        taken: list[Candidate] = []
        now = self._clock()
        while len(taken) < n:
            # Highest priority first; among equals, the job served longest ago (the first of them).
            queue, job_id, rank = None, 0, None
            for j, q in queues.items():
                if q and (q[0].batch.requirement is None or q[0].batch.requirement(agent.device_info)):
                    r = (q[0].priority, -self._last_served.get(j, -1))
                    if rank is None or r > rank:
                        queue, job_id, rank = q, j, r
            if queue is None:
                break
            candidate = queue.popleft()
            self._last_served[job_id] = next(self._served)
            self._started_jobs.add(job_id)
            # Unique within this daemon's life and unguessable across daemons: a random prefix
            # per scheduler and a count (uuid4 per lease cost a system call each).
            candidate.lease_id = f"{self._lease_prefix}{next(self._lease_numbers):x}"
            candidate.agent_id = agent.agent_id
            candidate.leased_at = now
            self._leases[candidate.lease_id] = candidate
            agent.leases.add(candidate.lease_id)
            taken.append(candidate)
        for job_id in [j for j, q in queues.items() if not q]:
            del queues[job_id]
        if taken:
            # Deadlines are minutes away (build and run timeouts) while results come back in
            # milliseconds: at a thousand results a second the heap would hold hundreds of
            # thousands of ended leases. Rebuilt from the live leases once the ended ones
            # outnumber them (beyond a floor), so its cost per lease stays O(1).
            if len(self._deadlines) > 2 * len(self._leases) + DEADLINE_HEAP_SLACK:
                self._deadlines = [(c.deadline, lease_id) for lease_id, c in self._leases.items()
                                   if c.deadline is not None]
                heapq.heapify(self._deadlines)
            # The agent measures what it holds one after another: the last of these may wait for
            # all the others (an agent leases its next batch while one runs).
            ahead = sum(self._leases[lease_id].worst_case_s for lease_id in agent.leases)
            deadline = now + LEASE_GRACE_S + ahead
            for candidate in taken:
                candidate.deadline = deadline
                heapq.heappush(self._deadlines, (deadline, candidate.lease_id))
        return taken

    def _expire_dead_agents(self) -> int:
        now = self._clock()
        dead = [a for a in self._agents.values() if now - a.last_heartbeat > self.agent_timeout_s]
        for agent in dead:
            del self._agents[agent.agent_id]
            self._agents_version += 1
            self.expired_leases += len(agent.leases)
            self._requeue(agent)
        return len(dead)

    def _requeue(self, agent: AgentState) -> None:
        for lease_id in agent.leases:
            self._requeue_lease(lease_id)
        agent.leases.clear()
        self._notify()

    def _requeue_lease(self, lease_id: str) -> None:
        """The lease's candidate back to the front of its job's queue (the lease is gone)."""
        candidate = self._leases.pop(lease_id, None)
        if candidate is None or candidate.batch.cancelled:
            return
        candidate.lease_id = candidate.agent_id = candidate.deadline = candidate.leased_at = None
        queue = self._queues.setdefault(candidate.batch.key, {}).setdefault(candidate.batch.job_id, deque())
        queue.appendleft(candidate)
        self._work_queued(candidate.batch.key)

    def _expire(self, scan_every: bool = False) -> None:
        """Take back overdue leases (a heap: cheap), and leases of dead agents. The scan for dead
        agents runs at most twice per heartbeat interval, so a heartbeat costs O(1) however large
        the fleet."""
        self._expire_overdue_leases()
        now = self._clock()
        if now >= self._next_dead_scan:
            self._next_dead_scan = now + self.heartbeat_interval_s / 2
            self._expire_dead_agents()

    def _expire_overdue_leases(self) -> None:
        now = self._clock()
        changed = False
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, lease_id = heapq.heappop(self._deadlines)
            candidate = self._leases.get(lease_id)
            if candidate is None or candidate.deadline != deadline:
                continue  # reported, requeued or cancelled since
            agent = self._agents.get(candidate.agent_id or "")
            self._requeue_lease(lease_id)
            self.expired_leases += 1
            changed = True
            if agent is None:
                continue
            agent.leases.discard(lease_id)
            agent.overdue_leases += 1
            if agent.overdue_leases >= OVERDUE_LEASES_TO_QUARANTINE and not agent.quarantined:
                agent.quarantined = True
                self._agents_version += 1
                logger.warning("agent %s (%s, key %s) quarantined: %d leases not reported in time",
                               agent.name, agent.agent_id[:8], agent.key, agent.overdue_leases)
                self._requeue(agent)
        if changed:
            self._notify()


# What a target can ask of a device (tuner/steering.py): agents that agree on these are one kind.
_KIND_FIELDS = ("arch", "cpu_model", "isa_features", "board", "compute_capability", "gpu_name", "extra")


def _device_kind(device_info: dict) -> str:
    return json.dumps([device_info.get(name) for name in _KIND_FIELDS], sort_keys=True, default=str)
