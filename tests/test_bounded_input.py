"""Input from users, files and the network is evaluated within bounds (issue 20, point 3).

A constraint cannot pin the CPU or the memory (huge powers, string repetition, % formatting), nor
take longer than its check budget over a space; no expression or JSON text, however deeply nested,
raises RecursionError. Each bad input below ends in one line and exit code 2 on the command line,
or in a clear exception type from the Python API, in well under the test's timeout, and leaves the
tuning log as it was.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest

from measure_agent.bounded_json import MAX_JSON_DEPTH, JSONBoundsError, loads_bounded, nested_deeper_than
from measure_agent.device import detect_device
from measure_agent.space import ChoiceKnob, ConfigError, ConfigSpace, RestrictionError, SplitKnob, parse_restriction
from measure_agent.space.expressions import MAX_RESTRICTION_CHARS, MAX_RESTRICTION_DEPTH
from measure_agent.templates import default_catalog
from measure_agent.workload import parse_workload
from tuner.cli import main
from tuner.log import TrialRecord, TuningLog
from tuner.log.bestfile import BestFileError
from tuner.steering import SteeringError, steer_space

WORKLOAD = "matmul_512x512x512"
DEEP = "[" * 100_000 + "]" * 100_000
COSTLY = [
    "((tile_m ** 256) ** 256) ** 256 > 0",
    '"a" * 10**9 == tile_m',
    '"%0999999999d" % tile_m == "x"',
    "-" * 1500 + "tile_m > 0",
    "1+" * 900 + "1 > tile_m",
    "tile_m ** 99999999 > 1",
    "(tile_m, tile_n) * 10**9 == tile_m",
    "tile_m * 2**63 * 2**63 > 0",
    "tile_m > 0 and \x00",
]


def run(capsys, *argv) -> tuple[int, str]:
    """Exit code and the one line on stderr of a command run in-process."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return code, lines[0]


def heavy_constraint(knob_names) -> str:
    """A legal constraint of almost MAX_RESTRICTION_CHARS over every knob, within the depth limit:
    each evaluation is slow, and it ties all knobs into one group to enumerate."""
    group = "(" + " + ".join(f"({name} == {name})" for name in knob_names) + ")"
    groups = [group]
    while len(" + ".join(groups + [group])) + 4 < MAX_RESTRICTION_CHARS:
        groups.append(group)
    return " + ".join(groups) + " > 0"


def matmul_space():
    workload = parse_workload(WORKLOAD)
    return default_catalog().get(workload.op, "cpu").space(workload, detect_device())


# -- 1. the expression evaluator ----------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", COSTLY)
def test_costly_or_deep_constraints_are_refused_by_tuner_space(capsys, text):
    code, line = run(capsys, "space", "--workload", WORKLOAD, "--constraint", text)
    assert code == 2
    assert line.startswith("tuner: error: ") and "restriction" in line


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", COSTLY)
def test_costly_or_deep_restrictions_raise_restriction_error_from_the_python_api(text):
    from tuner.user_space import tune_function

    params = {"tile_m": [1, 2, 4, 8, 16, 32, 64], "tile_n": [1, 2, 4]}
    with pytest.raises(RestrictionError) as info:
        tune_function(params, lambda p: 1.0, [text], budget=4)
    assert "\n" not in str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", COSTLY)
def test_the_daemon_refuses_such_constraints_when_a_job_is_submitted(text):
    from tuner.fleet import JobSpec
    from tuner.fleet.jobs import JobSpecError

    # JobSpec.validate is what the daemon's SubmitJob runs (JobSpecError -> INVALID_ARGUMENT)
    with pytest.raises(JobSpecError):
        JobSpec(workload=WORKLOAD, device_key="x86_64-test", constraints=(text,)).validate(default_catalog())


@pytest.mark.parametrize("text, values, expected", [
    ("block_size_x*block_size_y<=1024", {"block_size_x": 32, "block_size_y": 32}, True),
    ("block_size_x*block_size_y<=1024", {"block_size_x": 64, "block_size_y": 32}, False),
    ("MWG % (MDIMC * VWM) == 0 and SA <= SB", {"MWG": 64, "MDIMC": 8, "VWM": 4, "SA": 0, "SB": 1}, True),
    ("KWG % ((MDIMC * NDIMC)/MDIMA) == 0", {"KWG": 32, "MDIMC": 8, "NDIMC": 8, "MDIMA": 16}, True),
    ("KWG // 2 ** 3 == 4 - -1", {"KWG": 40}, True),
    ("x in (1, 2, 4) and not y", {"x": 2, "y": False}, True),
    ("x if y else -x", {"x": 3, "y": False}, True),
    ("1 < x <= 8 != 9", {"x": 8}, True),
    ("y + y + x == 5", {"x": 3, "y": True}, True),
    ("name == 'shared' or name in ['global']", {"name": "global"}, True),
    ("x ** 0.5 == 2.0", {"x": 4}, True),
    ("x ** -1 == 0.25", {"x": 4}, True),
    ("2 ** 64 > x * 2 ** 62", {"x": 3}, True),
    ("x / 0 > 1", {"x": 3}, False),  # division by zero: the config is not valid
])
def test_legitimate_restrictions_still_evaluate_like_python(text, values, expected):
    restriction = parse_restriction(text, values)
    assert restriction(values) is expected
    if "/ 0" not in text:  # Python raises ZeroDivisionError
        assert bool(eval(text, {}, dict(values))) is expected  # noqa: S307 - the test's own text


@pytest.mark.parametrize("text, values, fragment", [
    ("x * 2 ** 63 > 0", {"x": 3}, "too large"),
    ("x ** 65 > 0", {"x": 2}, "too large"),
    ("x ** 300 > 0", {"x": 1}, "exponent 300 too large"),
    ("x * 1e300 > 0", {"x": 1}, "too large"),
    ("x + 1 > 0", {"x": 10 ** 4000}, "too large"),
    ("x + 1 > 0", {"x": 10 ** 5000}, "x=<int too large to show>"),  # repr refuses more than 4300 digits
    ("x * 3 == 'aaa'", {"x": "a"}, "* takes numbers, not str"),
    ("x % 2 == 'a'", {"x": "%0999999999d"}, "% takes numbers, not str"),
    ("-x == x", {"x": (1, 2)}, "- takes numbers, not tuple"),
    ("x ** 0.5 > 0", {"x": -4}, "complex"),
])
def test_out_of_bounds_arithmetic_is_refused_naming_the_values(text, values, fragment):
    with pytest.raises(RestrictionError, match=re.escape(fragment)) as info:
        parse_restriction(text, values)(values)
    assert "cannot be evaluated for x=" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("text, fragment", [
    ("-" * 1500 + "x > 0", f"nested deeper than {MAX_RESTRICTION_DEPTH} levels"),
    ("1+" * 900 + "x", f"nested deeper than {MAX_RESTRICTION_DEPTH} levels"),
    ("not " * 480 + "x", f"nested deeper than {MAX_RESTRICTION_DEPTH} levels"),
    ("x ** " * 390 + "x", f"nested deeper than {MAX_RESTRICTION_DEPTH} levels"),
    ("(" * 300 + "x" + ")" * 300, "cannot parse"),
    ("x + " * 600 + "x", f"longer than {MAX_RESTRICTION_CHARS} characters"),
    ('"a" * 10**9 == x', "arithmetic (*) on a str is not allowed"),
    ("[1] * 10**9 == x", "arithmetic (*) on a list is not allowed"),
    ("x == \x00", "cannot parse"),
])
def test_deep_long_or_sequence_expressions_are_refused_when_parsed(text, fragment):
    with pytest.raises(RestrictionError) as info:
        parse_restriction(text, ["x"])
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_deep_but_allowed_expression_evaluates_within_the_recursion_limit():
    import sys

    minus_signs = MAX_RESTRICTION_DEPTH - 4  # Compare, the signs, Name and its context: just within the limit
    restriction = parse_restriction("-" * minus_signs + "x < 0", ["x"])

    def nested(depth):  # evaluate from a deep caller, as a strategy deep in a search might
        return nested(depth - 1) if depth else restriction({"x": 1})

    assert nested(sys.getrecursionlimit() // 2) is (minus_signs % 2 == 1)


# -- 2. checking constraints over a space is bounded in time ----------------------------------------------
def test_a_constraint_too_costly_to_check_is_refused_within_its_budget():
    space = ConfigSpace([ChoiceKnob(name, tuple(range(20))) for name in ("a", "b", "c")])  # 8000 combinations
    text = heavy_constraint(space.knob_names)
    with pytest.raises(SteeringError) as info:
        steer_space(space, [], [text], budget_s=0.0)
    message = str(info.value)
    assert "is too costly to check" in message and "took over 0 s" in message and "\n" not in message
    assert message.startswith("constraint '((a == a) + (b == b)")
    # checked within the budget (fewer evaluations than between two looks at the clock), the space
    # is then used without a clock: evaluating its constraint many times more is no longer refused
    small = ConfigSpace([ChoiceKnob(name, tuple(range(5))) for name in ("a", "b", "c")])
    steered = steer_space(small, [], [heavy_constraint(small.knob_names)], budget_s=0.0)
    assert steered.size == 125
    config = next(steered.iter_valid())
    assert all(steered.is_valid(config) for _ in range(1000))


@pytest.mark.timeout(60)
def test_tuner_space_stops_checking_a_costly_constraint_at_its_budget(capsys, monkeypatch):
    import tuner.steering

    monkeypatch.setattr(tuner.steering, "CONSTRAINT_CHECK_BUDGET_S", 0.5)
    text = heavy_constraint(matmul_space().knob_names)
    code, line = run(capsys, "space", "--workload", WORKLOAD, "--constraint", text)
    assert code == 2 and "is too costly to check" in line and "took over 0.5 s" in line


# -- 3. JSON from files, the command line and the network ---------------------------------------------
def test_the_bounded_loader():
    assert loads_bounded('{"a": [1, {"b": "[[[[[[[["}]}') == {"a": [1, {"b": "[[[[[[[["}]}
    assert loads_bounded("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    assert not nested_deeper_than('["\\"[[[[[[[[[[[[[[[[[[[["]', 2)  # brackets inside strings do not count
    assert nested_deeper_than("[[[]]]", 2) and not nested_deeper_than("[[]][[]][[]]", 2)
    for text, fragment in [(DEEP, f"nested deeper than {MAX_JSON_DEPTH} levels"),
                           ('{"a":' * 70 + "1" + "}" * 70, "nested deeper"),
                           ("1" * 5000, "cannot be decoded"),
                           ("[1]" * 10, "longer than 20 characters")]:
        with pytest.raises(JSONBoundsError, match=fragment):
            loads_bounded(text, max_chars=20 if "longer" in fragment else 2**20)
    with pytest.raises(json.JSONDecodeError):  # syntax errors keep their line and column
        loads_bounded("[1,")


@pytest.fixture
def log_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'log.db'}"
    workload = parse_workload("matmul(M=16,N=16,K=16)")
    template = default_catalog().get("matmul", "cpu")
    config = template.default_config(workload, template.space(workload))
    with TuningLog(url) as log:
        log.record_trial(TrialRecord(workload.key, "x86_64-test", "cpu", config.to_json(), "ok", (0.5,), 0.5))
    return url


def trial_digests(url):
    with TuningLog(url) as log:
        return sorted((t.workload_key, t.device_key, t.config_digest, t.mean_s) for t in log.trials())


def a_good_line(url) -> str:
    import io

    from tuner.log import export_trials

    out = io.StringIO()
    with TuningLog(url) as log:
        export_trials(log, out)
    return out.getvalue().splitlines()[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("content, fragment", [
    (DEEP, "line 1: JSON text is nested deeper than 64 levels"),
    ("{\n" + DEEP + "\n}\n", "best-configs file: JSON text is nested deeper than 64 levels"),
    ("GOOD\n" + DEEP + "\n", "line 2: JSON text is nested deeper than 64 levels"),
    ("GOOD\n" + '{"x": ' + "7" * 5000 + "}\n", "line 2: JSON text cannot be decoded"),
    ("GOOD\n" + '{"x": "' + "y" * (2**20 + 10) + '"}\n', "line 2: JSON text is longer than 1048576 characters"),
])
def test_log_import_of_deep_or_huge_json_fails_with_one_line_and_changes_nothing(capsys, tmp_path, log_url,
                                                                                 content, fragment):
    before = trial_digests(log_url)
    good = a_good_line(log_url).replace('"device_key":"x86_64-test"', '"device_key":"x86_64-other"')
    path = tmp_path / "bad.jsonl"
    path.write_text(content.replace("GOOD", good), encoding="utf-8")
    code, line = run(capsys, "log", "import", str(path), "--db", log_url)
    assert code == 2
    assert line.startswith(f"tuner: error: {path}: {fragment}") and line.endswith("; nothing imported")
    assert trial_digests(log_url) == before


@pytest.mark.timeout(60)
def test_log_import_never_reads_an_endless_line_whole(capsys, tmp_path, log_url, monkeypatch):
    import tuner.log.jsonl

    monkeypatch.setattr(tuner.log.jsonl, "MAX_BEST_FILE_CHARS", 1000)
    before = trial_digests(log_url)
    path = tmp_path / "endless.jsonl"
    path.write_text("[" + "1," * 5000 + "1]", encoding="utf-8")
    code, line = run(capsys, "log", "import", str(path), "--db", log_url)
    assert code == 2 and line == f"tuner: error: {path}: line 1: longer than 1000 characters; nothing imported"
    assert trial_digests(log_url) == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("content", [DEEP, "{\n" + DEEP + "\n}\n"])
def test_best_kernel_of_a_deep_best_configs_file_raises_best_file_error(tmp_path, content):
    import tuner

    path = tmp_path / "best.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BestFileError, match=r"best.json: the file is nested deeper than 64 levels$"):
        tuner.best_kernel(WORKLOAD, db=path)


def test_a_best_configs_file_longer_than_the_limit_is_refused_unread(tmp_path, monkeypatch):
    import tuner.log.bestfile
    from tuner.log.bestfile import load_best_file

    monkeypatch.setattr(tuner.log.bestfile, "MAX_BEST_FILE_CHARS", 100)
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"format": "tunefleet-best", "entries": [], "pad": "x" * 200}), encoding="utf-8")
    with pytest.raises(BestFileError, match="the file is longer than 100 characters"):
        load_best_file(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("config", [
    '{"tile_m": ' + DEEP + "}",
    DEEP,
    '{"tile_m": ' + "1" * 5000 + "}",
    '{"tile_m": "' + "x" * (2**20) + '"}',
])
def test_show_kernel_refuses_a_deep_or_huge_config(capsys, config):
    code, line = run(capsys, "show-kernel", "--workload", WORKLOAD, "--config", config)
    assert code == 2 and line.startswith("tuner: error: invalid config for matmul/cpu: config ")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value, fragment", [
    (DEEP, "the value is nested deeper than 64 levels"),
    ("[[[[" * 20 + "]]]]" * 20, "the value is nested deeper than 64 levels"),
    ("9" * 5000, "the value cannot be decoded"),
])
def test_deep_pin_values_are_refused(capsys, value, fragment):
    code, line = run(capsys, "space", "--workload", WORKLOAD, "--pin", f"tile_n={value}")
    assert code == 2 and line.startswith("tuner: error: cannot pin tile_n=") and fragment in line
    assert len(line) < 400  # the value is shortened in the message


def test_config_text_from_the_network_is_bounded():
    space = ConfigSpace([SplitKnob("tile", 64, ((1, 2, 4),)), ChoiceKnob("order", ("mn", "nm"))])
    assert space.from_json('{"tile": [16, 4], "order": "nm"}')["tile"] == (16, 4)
    for text, fragment in [(DEEP, "config is nested deeper than 64 levels"),
                           ('{"tile": ' + DEEP + ', "order": "nm"}', "nested deeper"),
                           ("[" * 30 + "]" * 30 + " " * (2**20), "config is longer than 1048576 characters")]:
        with pytest.raises(ConfigError, match=fragment):
            space.from_json(text)


def test_measurement_details_from_an_agent_are_bounded():
    from measure_agent.engine import MeasureStatus
    from measure_agent.protocol.convert import result_from_proto
    from measure_agent.protocol.v1 import fleet_pb2 as pb
    from tuner.daemon.service import arriving_result

    deep = pb.Measurement(lease_id="l", status="ok", costs=[0.5], details_json=DEEP)
    with pytest.raises(ValueError, match="details is nested deeper than 64 levels"):
        result_from_proto(deep)
    result = arriving_result(deep)  # what the daemon records: a failed result saying why
    assert result.status is MeasureStatus.RUNTIME_ERROR and "nested deeper" in result.message
    fine = pb.Measurement(lease_id="l", status="ok", costs=[0.5], details_json='{"number": 3}')
    assert result_from_proto(fine).details == {"number": 3}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("compress", [False, True])
def test_deep_kernel_tuner_cache_files_are_refused(tmp_path, compress):
    from tuner.replay import ReplayError, load_cache
    from tuner.user_space import CacheFile, CacheFileError, prior_from_cache, tune_function

    content = '{"tune_params": {"a": [1, 2]}, "cache": {"1": ' + DEEP + "}}"
    path = tmp_path / ("deep.json.gz" if compress else "deep.json")
    path.write_bytes(gzip.compress(content.encode()) if compress else content.encode())
    with pytest.raises(ReplayError, match="the cache file is nested deeper than 64 levels"):
        load_cache(path)
    with pytest.raises(CacheFileError, match="nested deeper"):
        CacheFile.open(path, {"a": [1, 2]})
    with pytest.raises(CacheFileError, match="nested deeper"):
        prior_from_cache(path)
    with pytest.raises(CacheFileError, match="nested deeper"):
        tune_function({"a": [1, 2]}, lambda p: 1.0, budget=2, cache=path)
    # a cache its writer never closed, cut in the middle of a deep entry
    open_cache = tmp_path / "open.json"
    open_cache.write_text('{"tune_params": {"a": [1, 2]},\n"cache": {\n"1": ' + DEEP[:150_000] + ",\n")
    with pytest.raises(CacheFileError, match="nested deeper|not a JSON cache file"):
        CacheFile.open(open_cache, {"a": [1, 2]})


def test_a_cache_file_longer_than_the_limit_is_refused_unread(tmp_path, monkeypatch):
    import tuner.user_space.cache_file
    from tuner.user_space import CacheFileError, read_cache_json

    monkeypatch.setattr(tuner.user_space.cache_file, "MAX_CACHE_FILE_CHARS", 1000)
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"tune_params": {"a": [1]}, "cache": {}, "pad": "x" * 10**6}).encode()))
    with pytest.raises(CacheFileError, match="the cache file is longer than 1000 characters"):
        read_cache_json(path)
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(path.read_bytes()[:20] + b"\x00" * 50)
    with pytest.raises(CacheFileError, match="is not a JSON cache file|cannot read"):
        read_cache_json(corrupt)
