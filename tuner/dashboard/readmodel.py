"""What the dashboard's pages and JSON API show, read from the tuning log (and the live fleet when
the dashboard runs inside a daemon). Every method returns plain JSON values; pages and the API
render the same dicts, so the API documents exactly what a page shows (docs/dashboard.md).

Contract: a missing job, workload or device raises :class:`NotFound` (HTTP 404); bad parameters
raise :class:`BadRequest` (HTTP 400); both carry one line. No secret is ever part of a result
(the log's URL is shown with its password masked).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from measure_agent.templates import TemplateCatalog, TemplateNotFound
from measure_agent.workload import WorkloadError, parse_workload
from tuner.dashboard.live import LiveFleet
from tuner.log import FINAL_JOB_STATUSES, NotFoundError, TRIAL_STATUSES, TrialRecord, TuningLog
from tuner.log.records import JobRecord, utcnow
from tuner.report.data import collect
from tuner.report.series import convergence_series

if TYPE_CHECKING:
    from tuner.graph.tasks import ModelTasks

RECENT_JOBS = 100
RECENT_ERRORS = 20
TOP_CONFIGS = 10
TRIAL_ROWS = 500  # the trials table shows at most this many rows (the newest)
MESSAGE_CHARS = 400
THROUGHPUT_WINDOW_S = 60.0


class NotFound(LookupError):
    """A job, workload or device the log does not hold."""


class BadRequest(ValueError):
    """A parameter the dashboard cannot use (one line saying which)."""


class DashboardReader:
    """Reads what the pages show. ``live`` is the daemon's state (None for a bare log)."""

    def __init__(self, log: TuningLog, catalog: TemplateCatalog | None = None, live: LiveFleet | None = None,
                 models: Sequence[ModelTasks] = ()) -> None:
        self.log = log
        self._catalog = catalog
        self.live = live
        self.models = {Path(m.source).name: m for m in models}

    @property
    def catalog(self) -> TemplateCatalog:
        if self._catalog is None:
            from measure_agent.templates import default_catalog

            self._catalog = default_catalog()
        return self._catalog

    # -- overview ------------------------------------------------------------------------------
    def overview(self) -> dict[str, Any]:
        jobs = self.jobs()
        by_state = Counter(j["state"] for j in jobs)
        since = utcnow() - timedelta(seconds=THROUGHPUT_WINDOW_S)
        if self.live is not None:
            rate, rate_source = self.live.results_per_second(), "daemon"
        else:
            rate, rate_source = self.log.count_trials_since(since) / THROUGHPUT_WINDOW_S, "log"
        return {
            "log": self.log.url,
            "live": self.live is not None,
            "jobs_by_state": dict(sorted(by_state.items())),
            "jobs": jobs[:RECENT_JOBS],
            "trials_per_second": round(rate, 3),
            "trials_per_second_source": rate_source,
            "keys": self._keys(),
            "recent_errors": [self._trial_json(t, with_config=False) for t in self.log.recent_failures(RECENT_ERRORS)],
        }

    def jobs(self) -> list[dict[str, Any]]:
        """Every job, newest first, with its trial counts and the daemon's state when live."""
        stats = self.log.job_trial_stats()
        live = self._live_statuses()
        out = []
        for record in reversed(self.log.jobs()):
            s = stats.get(record.id)
            out.append(self._job_json(record, s.trials if s else 0, s.failed if s else 0,
                                      s.best_mean_s if s else None, live.get(record.id)))
        return out

    def _keys(self) -> list[dict[str, Any]]:
        """Device keys with their agents' health (live) or when the log last saw them."""
        if self.live is not None:
            view = self.live.fleet_view()
            keys = []
            for key in view.keys:
                agents = view.agents_of(key.key)
                quarantined = sum(1 for a in agents if a.quarantined)
                health = ("no agents" if not agents else "degraded" if quarantined else "ok")
                keys.append({**key.to_json(), "quarantined_agents": quarantined, "health": health})
            return keys
        return [{"key": key, "agents": None, "health": "no daemon"} for key in self.log.device_keys()]

    # -- job -------------------------------------------------------------------------------------
    def job(self, job_id: int) -> dict[str, Any]:
        try:
            data = collect(self.log, job_id, default_config=False)
        except NotFoundError as exc:
            raise NotFound(str(exc)) from None
        default = self._default_config(data.workload, data.job.target, data.device_info)
        ok = data.ok_trials
        best = data.best
        live = self._live_statuses().get(job_id)
        summary = self._job_json(data.job, len(data.trials), data.error_count, best.mean_s if best else None, live)
        default_trial = next((t for t in data.trials if default is not None and t.config == default), None)
        top = []
        for rank, t in enumerate(data.top(TOP_CONFIGS), 1):
            top.append({"rank": rank, "trial": data.trial_number(t), "mean_s": t.mean_s,
                        "gflops": _round(data.gflops(t.mean_s)), "config": t.config, "agent": t.agent,
                        "is_default": default is not None and t.config == default,
                        "diff_from_default": _diff(default, t.config)})
        return {
            **summary,
            "flops": data.workload.flops,
            "spec": _spec_of(data.job),
            "device_info": data.device_info,
            "default_config": default,
            "default_mean_s": default_trial.mean_s if default_trial is not None and default_trial.is_ok else None,
            "ok_trials": len(ok),
            "earlier_trials": data.earlier_trials,
            "earlier_best_gflops": _round(data.gflops(data.earlier_best_s)),
            "status_counts": [{"status": c.status, "count": c.count, "sample_message": _cut(c.sample_message)}
                              for c in data.status_counts],
            "top": top,
            "series": convergence_series(data),
            "can_cancel": self.live is not None and not summary["finished"],
        }

    def job_trials(self, job_id: int, status: str | None = None) -> dict[str, Any]:
        """The job's trials, numbered in order, optionally of one status (``failed``: all but ok)."""
        if status not in (None, "", "failed", *TRIAL_STATUSES):
            raise BadRequest(f"status must be one of failed, {', '.join(TRIAL_STATUSES)}, not {status!r}")
        job = self._job_record(job_id)
        trials = self.log.trials(job_id=job_id)
        gflops = _flops_rate(job.workload_key)
        rows = []
        for number, t in enumerate(trials, 1):
            if status == "failed" and t.is_ok or status not in (None, "", "failed") and t.status != status:
                continue
            rows.append({"trial": number, **self._trial_json(t), "gflops": _round(gflops(t.mean_s))})
        return {"job_id": job_id, "status_filter": status or None, "total": len(rows),
                "trials": rows[-TRIAL_ROWS:], "shown": min(len(rows), TRIAL_ROWS)}

    def cancel(self, job_id: int) -> dict[str, Any]:
        from tuner.dashboard.live import CancelRefused

        if self.live is None:
            raise CancelRefused("this dashboard reads a log without a daemon: cancel with 'tuner cancel' "
                                "or open the daemon's dashboard (tuner daemon --http-listen)")
        status = self.live.cancel(job_id)
        return {"job_id": job_id, "state": status.state, "message": status.message}

    # -- workload --------------------------------------------------------------------------------
    def workloads(self) -> list[dict[str, Any]]:
        """Every workload with trials: its best GFLOPS per device key and target."""
        out: dict[str, dict[str, Any]] = {}
        for t in self.log.best_per_group(1):
            rate = _flops_rate(t.workload_key)
            entry = out.setdefault(t.workload_key, {"workload": t.workload_key, "best": []})
            entry["best"].append({"device_key": t.device_key, "target": t.target, "gflops": _round(rate(t.mean_s))})
        for key in self.log.workload_keys():
            out.setdefault(key, {"workload": key, "best": []})
        return sorted(out.values(), key=lambda w: w["workload"])

    def workload(self, key: str) -> dict[str, Any]:
        workload = _parse(key)
        if workload.key not in self.log.workload_keys():
            raise NotFound(f"no workload {workload.key} in the tuning log")
        trials = self.log.trials(workload_key=workload.key)
        rate = _flops_rate(workload.key)
        groups: dict[tuple[str, str], list[TrialRecord]] = {}
        for t in trials:
            groups.setdefault((t.device_key, t.target), []).append(t)
        devices, history = [], []
        for (device, target), records in sorted(groups.items()):
            ok = [t for t in records if t.is_ok]
            best = min(ok, key=lambda t: t.mean_s, default=None)
            devices.append({"device_key": device, "target": target, "trials": len(records),
                            "failed": len(records) - len(ok), "best_mean_s": best.mean_s if best else None,
                            "gflops": _round(rate(best.mean_s)) if best else None,
                            "best_config": best.config if best else None,
                            "best_at": best.created_at.isoformat() if best else None})
            history.append({"device_key": device, "target": target, **_best_over_time(records, rate)})
        fastest = max((d["gflops"] or 0 for d in devices), default=0) or None
        for d in devices:
            d["vs_fastest"] = round(d["gflops"] / fastest, 4) if d["gflops"] and fastest else None
        return {"workload": workload.key, "op": workload.op, "flops": workload.flops, "devices": devices,
                "history": history, "shapes": self._shapes(workload)}

    def _shapes(self, workload) -> list[dict[str, Any]]:
        """The shape ranges holding this workload: each member shape's best GFLOPS per device key."""
        out = []
        for family, members in self.log.families(workload.op, workload.dtype):
            if workload.key not in members:
                continue
            rows = []
            for member in members:
                rate = _flops_rate(member)
                best = {f"{t.device_key}/{t.target}": _round(rate(t.mean_s))
                        for t in self.log.best_per_group(1, workload_key=member)}
                rows.append({"workload": member, "best_gflops": best})
            out.append({"family": family, "members": rows})
        return out

    def kernel(self, workload_key: str, device_key: str, target: str = "cpu", config: str = "best") -> dict[str, Any]:
        """The kernel source of a config (``show-kernel``): ``best`` (what ``tuner best`` serves),
        ``default``, or a config as JSON."""
        from measure_agent.space import ConfigError
        from tuner.log.best_config import exact_best_config, recorded_device

        workload = _parse(workload_key)
        try:
            template = self.catalog.get(workload.op, target)
        except TemplateNotFound as exc:
            raise NotFound(str(exc)) from None
        if device_key not in self.log.device_keys():
            raise NotFound(f"no device {device_key!r} in the tuning log")
        why = ""
        if config == "best":
            best = exact_best_config(self.log, workload, device_key, target, catalog=self.catalog)
            if not best.found:
                raise NotFound(f"no tuned config for {workload.key} on {device_key}: {best.why}")
            device, config_json, why = best.tuned_on, best.config, best.why
        else:
            device = recorded_device(self.log, device_key)
            config_json = config
        space = self.catalog.space(workload, target, device)
        try:
            parsed = (template.default_config(workload, space) if config_json == "default"
                      else space.from_json(config_json))
        except (ConfigError, ValueError) as exc:
            raise BadRequest(f"invalid config for {workload.op}/{target}: {exc}") from None
        source = template.render(workload, parsed)
        return {"workload": workload.key, "device_key": device_key, "target": target,
                "config": json.loads(json.dumps(parsed.to_json())), "why": why, "entry": source.entry,
                "source": source.text, "runtime_args": list(source.runtime_args)}

    # -- models (tune-model) ---------------------------------------------------------------------
    def model_list(self) -> list[dict[str, Any]]:
        return [{"model": name, "source": m.source, "tasks": len(m.tasks)} for name, m in sorted(self.models.items())]

    def model(self, name: str, device_key: str | None = None, target: str | None = None) -> dict[str, Any]:
        """A model's tasks as ``tune-model`` tunes them, from the log: per task its count, the trials the
        log holds (where the budget went), the default config's and the best mean time; the
        estimated latency (sum of count x time over tasks with both) before and after tuning."""
        found = self.models.get(name)
        if found is None:
            known = ", ".join(sorted(self.models)) or "none (start the dashboard with --model MODEL.onnx)"
            raise NotFound(f"no model {name!r} in this dashboard; models: {known}")
        groups = Counter()
        for task in found.tasks:
            for t in self.log.best_per_group(1, workload_key=task.key):
                groups[(t.device_key, t.target)] += self.log.count_trials(task.key, t.device_key, t.target)
        choices = [{"device_key": d, "target": tg, "trials": n} for (d, tg), n in sorted(groups.items())]
        if device_key is None and groups:
            device_key, target = max(groups, key=lambda g: (groups[g], g))
        target = target or "cpu"
        rows, before, after, covered = [], 0.0, 0.0, 0
        info = (self.log.recorded_device_info(device_key) or {}) if device_key else {}
        for number, task in enumerate(found.tasks, 1):
            trials = self.log.count_trials(task.key, device_key, target) if device_key else 0
            best = self.log.best(task.key, device_key, target) if device_key else []
            default = self._default_config(task.workload, target, info) if device_key else None
            default_s = next((t.mean_s for t in self.log.trials(task.key, device_key, target, "ok")
                              if t.config == default), None) if default is not None else None
            best_s = best[0].mean_s if best else None
            if default_s and best_s:
                before, after, covered = before + task.count * default_s, after + task.count * best_s, covered + 1
            rows.append({"task": number, "workload": task.key, "op_type": task.op_type, "count": task.count,
                         "flops": task.flops, "trials": trials, "default_s": default_s, "best_s": best_s,
                         "speedup": round(default_s / best_s, 4) if default_s and best_s else None,
                         "weighted_best_s": task.count * best_s if best_s else None})
        spent = sum(r["trials"] for r in rows)
        for r in rows:
            r["budget_share"] = round(r["trials"] / spent, 4) if spent else 0.0
        return {"model": name, "source": found.source, "device_key": device_key, "target": target,
                "devices": choices, "tasks": rows, "trials": spent,
                "latency_default_s": before if covered else None, "latency_tuned_s": after if covered else None,
                "latency_tasks": covered}

    # -- agents ----------------------------------------------------------------------------------
    def agents(self) -> dict[str, Any]:
        """Live agents (capabilities, leases, heartbeat, quarantine) with what each measured per the log."""
        stats = self.log.agent_trial_stats()
        since = utcnow() - timedelta(seconds=THROUGHPUT_WINDOW_S)
        recent = Counter(t.agent for t in self.log.trials(limit=2000) if t.created_at >= since and t.agent)
        live = []
        if self.live is not None:
            for a in self.live.fleet_view().agents:
                s = stats.get(a.name)
                live.append({**a.to_json(), "templates": list(a.templates),
                             "seconds_since_registered": round(a.seconds_since_registered, 1),
                             "trials": s.trials if s else 0, "failed": s.failed if s else 0,
                             "trials_per_minute": recent.get(a.name, 0)})
        logged = [{"name": name, "trials": s.trials, "failed": s.failed,
                   "last_trial_at": s.last_at.isoformat() if s.last_at else None,
                   "trials_per_minute": recent.get(name, 0)} for name, s in sorted(stats.items())]
        devices = [{"key": key, "info": self.log.recorded_device_info(key) or {}} for key in self.log.device_keys()]
        return {"live": self.live is not None, "agents": live, "measured_by": logged, "devices": devices}

    # -- internals -------------------------------------------------------------------------------
    def _live_statuses(self) -> dict[int, Any]:
        return {} if self.live is None else {s.job_id: s for s in self.live.job_statuses()}

    def _job_record(self, job_id: int) -> JobRecord:
        try:
            return self.log.get_job(job_id)
        except NotFoundError as exc:
            raise NotFound(str(exc)) from None

    def _job_json(self, record: JobRecord, trials: int, failed: int, best_mean_s: float | None,
                  live) -> dict[str, Any]:
        # The log says running until a job ends; the daemon knows whether it is queued, and why.
        state = live.state if live is not None else record.status
        rate = _flops_rate(record.workload_key)
        return {
            "job_id": record.id, "state": state, "finished": state in FINAL_JOB_STATUSES,
            "workload": record.workload_key, "device_key": record.device_key, "target": record.target,
            "strategy": record.strategy, "budget": record.trials, "trials": trials, "failed": failed,
            "best_mean_s": best_mean_s, "best_gflops": _round(rate(best_mean_s)),
            "created_at": record.created_at.isoformat(),
            "finished_at": record.finished_at.isoformat() if record.finished_at else None,
            "message": live.message if live is not None else "",
            "queued_candidates": live.queued_candidates if live is not None else None,
            "leased_candidates": live.leased_candidates if live is not None else None,
        }

    def _trial_json(self, t: TrialRecord, *, with_config: bool = True) -> dict[str, Any]:
        out = {"status": t.status, "mean_s": t.mean_s, "compile_time_s": round(t.compile_time_s, 4),
               "message": _cut(t.message), "agent": t.agent, "created_at": t.created_at.isoformat(),
               "job_id": t.job_id}
        if with_config:
            out["config"] = t.config
        else:
            out.update(workload=t.workload_key, device_key=t.device_key, target=t.target)
        return out

    def _default_config(self, workload, target: str, device_info: dict) -> dict | None:
        try:
            from measure_agent.device import DeviceInfo

            template = self.catalog.get(workload.op, target)
            space = self.catalog.space(workload, target, DeviceInfo.from_recorded(device_info))
            return json.loads(json.dumps(template.default_config(workload, space).to_json()))
        except Exception:  # noqa: BLE001 - a marker on the page; a page must not fail for it
            return None


def _spec_of(job: JobRecord) -> dict[str, Any]:
    """What the job was asked to do: its stored spec (pins, constraints, target, timing ...)."""
    spec = {key: value for key, value in job.options.items() if value not in (None, "", [], {})}
    spec.update(workload=job.workload_key, device_key=job.device_key, strategy=job.strategy, trials=job.trials)
    return dict(sorted(spec.items()))


def _diff(default: dict | None, config: dict) -> dict[str, list] | None:
    """Knobs whose value differs from the default config: ``{knob: [default, this]}``."""
    if default is None:
        return None
    return {k: [default.get(k), v] for k, v in sorted(config.items()) if default.get(k) != v}


def _best_over_time(records: list[TrialRecord], rate) -> dict[str, list]:
    """Best GFLOPS so far at each trial's time (seconds since the epoch), for the history chart."""
    times, best_so_far = [], []
    best = None
    for t in records:
        value = rate(t.mean_s) if t.is_ok else None
        if value is not None and (best is None or value > best):
            best = value
        times.append(round(t.created_at.timestamp(), 3))
        best_so_far.append(_round(best))
    return {"time": times, "best": best_so_far}


def _flops_rate(workload_key: str):
    flops = parse_workload(workload_key).flops
    return lambda seconds: flops / seconds / 1e9 if seconds else None


def _parse(key: str):
    try:
        return parse_workload(key)
    except WorkloadError as exc:
        raise BadRequest(str(exc)) from None


def _cut(message: str) -> str:
    message = message.strip()
    return message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS] + "..."


def _round(value: float | None) -> float | None:
    """Six significant digits: enough for any chart or table, at any scale of GFLOPS."""
    return None if value is None else float(f"{value:.6g}")
