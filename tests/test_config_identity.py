"""A config's identity (canonical text and digest) is computed once, and stays what logs hold."""

from measure_agent.space import Config, canonical_config_text, config_digest
from tuner.log.records import TrialRecord

CONFIG = Config((("tile_m", 32), ("tile_n", (1, 4, 8)), ("parallel", True), ("order", "nm"), ("ratio", 0.5),
                 ("name", "é")))
# What tunefleet has always stored for CONFIG: existing logs' unique constraint per (workload, device,
# target, config_digest) depends on these exact strings.
TEXT = '{"name":"\\u00e9","order":"nm","parallel":true,"ratio":0.5,"tile_m":32,"tile_n":[1,4,8]}'
DIGEST = "35659746ca338f7f"


def test_the_canonical_text_and_digest_are_pinned():
    assert canonical_config_text(CONFIG.to_json()) == TEXT
    assert config_digest(TEXT) == DIGEST
    assert CONFIG.json_text() == TEXT and CONFIG.digest == DIGEST


def test_a_log_record_has_the_identity_of_its_config():
    for config in (CONFIG, CONFIG.to_json(), dict(reversed(list(CONFIG.to_json().items())))):
        record = TrialRecord("matmul(M=8,N=8,K=8)", "dev", "cpu", config, "compile_error")
        assert (record.config_text, record.config_digest) == (TEXT, DIGEST)
