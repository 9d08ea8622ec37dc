"""One best config: ``tuner best``, ``tuner show-kernel --best`` and ``tuner.best_kernel`` agree.

All three ask :func:`tuner.log.resolve_best_config`; here they are asked the same questions of one
log, holding an exactly tuned workload (whose fastest config the installed template rejects), a
workload whose only config is rejected, and a tuned shape range. Each ``best_kernel`` call compiles
one small serial kernel (into the session's kernel cache).
"""

from __future__ import annotations

import json
import warnings

import pytest

import tuner
from measure_agent.templates import default_catalog
from measure_agent.workload import parse_workload
from measure_agent.workload.family import parse_family
from tuner.apply import NotTunedWarning
from tuner.cli import main
from tuner.log import BestConfigs, TrialRecord, TuningLog, exact_best_config, resolve_best_config

DEVICE = "x86_64-agree-2c"
W = parse_workload("matmul(M=24,N=40,K=16)")  # tuned exactly; its fastest config is rejected
REJECTED = parse_workload("matmul(M=24,N=48,K=16)")  # tuned exactly, its only config rejected; outside the range
UNTUNED = parse_workload("matmul(M=24,N=40,K=32)")  # never tuned, outside the range: nearest is W
RANGE = parse_family("matmul(M=8..32,N=40,K=16)")  # representatives M=8, 16, 32; M=8 never tuned
IN_RANGE = parse_workload("matmul(M=12,N=40,K=16)")  # never tuned: the range's nearest tuned representative, M=16
TEMPLATE = default_catalog().get("matmul", "cpu")


def _default(workload):
    return TEMPLATE.default_config(workload, TEMPLATE.space(workload))


def _faster_variant(workload):
    """A valid config other than the default (what tuning found)."""
    default = _default(workload)
    return next(iter(TEMPLATE.space(workload).neighbours(default)))


def _ok(workload, config_json, mean):
    return TrialRecord(workload.key, DEVICE, "cpu", config_json, "ok", (mean,), mean)


def _alien(workload):
    """A config an older template version could have written: the installed one rejects it."""
    return dict(_default(workload).to_json(), loop_order="no-such-order")


@pytest.fixture
def db(monkeypatch, kernel_cache_dir, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(kernel_cache_dir))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("TUNEFLEET_DB", raising=False)
    url = f"sqlite:///{tmp_path / 'agree.db'}"
    members = RANGE.representatives()
    assert [m["M"] for m in members] == [8, 16, 32]
    with TuningLog(url) as log:
        log.upsert_device(DEVICE, {"arch": "x86_64", "cores": 2})
        log.record_trials([
            _ok(W, _alien(W), 0.5e-5),  # fastest, but not valid for the installed template
            _ok(W, _faster_variant(W).to_json(), 1e-5),
            _ok(W, _default(W).to_json(), 2e-5),
            _ok(REJECTED, _alien(REJECTED), 1e-5),
            *(_ok(m, _default(m).to_json(), 1e-5 * m["M"]) for m in members[1:]),
        ])
        log.record_family(RANGE.key, RANGE.op, RANGE.dtype, [m.key for m in members])
    return url


def _cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _best(capsys, db, workload, *flags):
    return _cli(capsys, "best", "--workload", workload.key, "--device-key", DEVICE, "--db", db, "--json", *flags)


def _shown(capsys, db, workload, *flags):
    return _cli(capsys, "show-kernel", "--workload", workload.key, "--best", "--device-key", DEVICE, "--db", db,
                *flags)


def _kernel(db, workload, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = tuner.best_kernel(workload, DEVICE, db=db, **options)
    return kernel, [str(w.message) for w in caught if issubclass(w.category, NotTunedWarning)]


def _assert_agree(capsys, db, workload, *flags, nearest):
    """All three give one config; returns ``tuner best``'s JSON row, the kernel and its warnings."""
    code, out, err = _best(capsys, db, workload, *flags)
    assert code == 0, err
    row = json.loads(out)
    code, shown, note = _shown(capsys, db, workload, *flags)
    assert code == 0, note
    kernel, notes = _kernel(db, workload, nearest=nearest)
    assert kernel.config == row["config"]
    assert (kernel.tuned_workload, kernel.device_key, kernel.mean_s) == (row["tuned_workload"], DEVICE,
                                                                         row["mean_s"])
    assert shown.startswith(kernel.kernel_source.text.rstrip("\n") + "\n")  # the same kernel source
    return row, kernel, notes, note


def test_an_exact_answer_skips_the_config_the_template_rejects_everywhere(db, capsys):
    row, kernel, notes, note = _assert_agree(capsys, db, W, nearest=True)
    assert kernel.kind == "tuned" and row["approximate"] is False and not notes and note == ""
    assert row["config"] == _faster_variant(W).to_json() and row["mean_s"] == 1e-5  # not the faster alien


def test_a_rejected_config_is_reported_alike(db, capsys):
    code, _, best_err = _cli(capsys, "best", "--workload", REJECTED.key, "--device-key", DEVICE, "--db", db)
    code_shown, shown, shown_err = _shown(capsys, db, REJECTED)
    assert code == code_shown == 1 and shown == ""
    assert "not valid for the installed matmul template" in best_err
    assert shown_err == best_err  # one message, word for word
    kernel, notes = _kernel(db, REJECTED, nearest=False)
    assert kernel.is_default
    [note] = notes
    assert "has one, rejected: its config {" in note and f"for {DEVICE} is not valid" in note
    assert "'no-such-order' of knob loop_order" in note

    # Asked for the nearest shape, all three take W's config instead, transferred to N=48.
    row, kernel, notes, note = _assert_agree(capsys, db, REJECTED, "--nearest", nearest=True)
    assert row["approximate"] is True and row["tuned_workload"] == W.key and kernel.kind == "approximate"
    assert TEMPLATE.space(REJECTED).from_json(row["config"])
    [warned] = notes
    assert "nearest tuned shape" in warned and warned.endswith(note.removeprefix("tuner: note: ").strip())


def test_a_shape_in_a_tuned_range_is_served_alike_without_asking(db, capsys):
    row, kernel, notes, note = _assert_agree(capsys, db, IN_RANGE, nearest=False)
    member = RANGE.representatives()[1]
    assert row["family"] == RANGE.key and row["approximate"] is True and row["tuned_workload"] == member.key
    assert kernel.kind == "approximate"
    [warned] = notes
    assert f"is in the tuned range {RANGE.key}" in warned and f"is in the tuned range {RANGE.key}" in note


def test_the_nearest_shape_only_when_asked_alike(db, capsys):
    code, _, best_err = _cli(capsys, "best", "--workload", UNTUNED.key, "--device-key", DEVICE, "--db", db)
    code_shown, _, shown_err = _shown(capsys, db, UNTUNED)
    assert code == code_shown == 1 and shown_err == best_err and "no successful trial of" in best_err
    assert _kernel(db, UNTUNED, nearest=False)[0].is_default

    row, kernel, _, _ = _assert_agree(capsys, db, UNTUNED, "--nearest", nearest=True)
    assert row["tuned_workload"] == W.key and row["distance"] == pytest.approx(1.0) and kernel.approximate


def test_the_resolver_kinds_and_reasons(db):
    with TuningLog(db, create=False) as log:
        tuned = resolve_best_config(log, W, DEVICE)
        assert (tuned.kind, tuned.found, tuned.approximate, tuned.rejected) == ("tuned", True, False, None)
        assert tuned.record.mean_s == 1e-5 and tuned.device_keys == (DEVICE,)
        assert tuned.tuned_on is not None and tuned.tuned_on.cores == 2  # checked in the recorded device's space
        assert len(resolve_best_config(log, W, DEVICE, top=3).matches) == 2  # the alien is no alternative

        family = resolve_best_config(log, IN_RANGE, DEVICE)
        assert family.kind == "family" and family.approximate and family.match.family == RANGE.key

        rejected = resolve_best_config(log, REJECTED, DEVICE)
        assert (rejected.kind, rejected.found, rejected.config) == ("default", False, None)
        assert rejected.rejected.record.config == _alien(REJECTED) and "loop_order" in rejected.rejected.reason
        assert rejected.why.startswith(f"{log.name} has one, rejected: its config")
        near = resolve_best_config(log, REJECTED, DEVICE, nearest=True)
        assert near.kind == "approximate" and near.rejected == rejected.rejected  # found, and says what it skipped

        nothing = resolve_best_config(log, UNTUNED, "riscv-*")
        assert nothing.kind == "default" and nothing.device_keys == () and nothing.why == f"nothing tuned in {log.name}"

        # The exact-only lookup (the daemon's): no family, no nearest, the same exact answer.
        assert exact_best_config(log, W, DEVICE) == tuned
        assert exact_best_config(log, IN_RANGE, DEVICE).kind == "default"
        assert exact_best_config(log, REJECTED, DEVICE).rejected == rejected.rejected

        # A best-configs file is a source too: no families, devices it does not know are None.
        shipped = BestConfigs(log.best(W.key, DEVICE, top=None), {DEVICE: log.device_info(DEVICE)}, name="shipped")
        assert shipped.families("matmul", "float32") == [] and shipped.recorded_device_info("elsewhere") is None
        assert log.recorded_device_info("elsewhere") is None
        assert resolve_best_config(shipped, W, DEVICE).matches == tuned.matches
        assert resolve_best_config(shipped, IN_RANGE, DEVICE).why == "nothing tuned in shipped"
