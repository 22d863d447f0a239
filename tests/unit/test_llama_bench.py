"""MTP benchmark logic: metrics parsing, samples, summaries, comparison, table."""

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_bench import (
    SPEC_ACCEPTED,
    SPEC_DRAFT,
    BenchError,
    compare,
    completion_sample,
    metrics_delta,
    parse_metrics,
    summarize,
    table,
)

# Shape of llama-server's /metrics (server-task.cpp): HELP/TYPE lines, labelled per-position counters.
METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 12
llamacpp:tokens_predicted_total 256
llamacpp:spec_decode_num_draft_tokens_total 120
llamacpp:spec_decode_num_accepted_tokens_total 90
llamacpp:spec_decode_num_drafts_total 40
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 38
llamacpp:predicted_tokens_seconds 61.5
"""


def test_parse_metrics():
    m = parse_metrics(METRICS)
    assert m[SPEC_DRAFT] == 120 and m[SPEC_ACCEPTED] == 90
    assert m['llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] == 38
    assert "llamacpp:prompt_tokens_total" in m and len(m) == 7


def test_metrics_delta():
    before = parse_metrics(METRICS)
    after = dict(before, **{SPEC_DRAFT: 220.0, SPEC_ACCEPTED: 150.0})
    d = metrics_delta(before, after)
    assert d[SPEC_DRAFT] == 100 and d[SPEC_ACCEPTED] == 60


def _answer(tok_s, n=128, draft=None, acc=None):
    t = {"predicted_n": n, "predicted_ms": n / tok_s * 1000, "predicted_per_second": tok_s}
    if draft:
        t.update(draft_n=draft, draft_n_accepted=acc)
    return {"content": "x", "timings": t}


def test_completion_sample_and_errors():
    s = completion_sample(_answer(50.0, draft=40, acc=30))
    assert s == {"tokens": 128, "seconds": pytest.approx(2.56), "tok_s": 50.0, "draft_n": 40, "draft_accepted": 30}
    assert completion_sample(_answer(50.0))["draft_n"] == 0  # no draft keys without drafts
    with pytest.raises(BenchError, match="timings"):
        completion_sample({"content": "x"})
    with pytest.raises(BenchError, match="no tokens"):
        completion_sample(_answer(50.0, n=0))


def test_summarize_prefers_metrics_then_timings():
    samples = [completion_sample(_answer(v, draft=10, acc=5)) for v in (40.0, 60.0, 50.0)]
    row = summarize("mtp-n2", 2, samples, {SPEC_DRAFT: 100.0, SPEC_ACCEPTED: 80.0})
    assert row["tok_s_median"] == 50.0 and row["acceptance"] == 0.8 and row["acceptance_source"] == "metrics"
    row = summarize("mtp-n2", 2, samples, {SPEC_DRAFT: 0.0, SPEC_ACCEPTED: 0.0})
    assert row["acceptance"] == 0.5 and row["acceptance_source"] == "timings"
    base = summarize("no-mtp", None, [completion_sample(_answer(30.0))])
    assert base["mtp"] is False and base["acceptance"] is None


def test_compare_picks_best_and_ratio():
    rows = [
        summarize("no-mtp", None, [completion_sample(_answer(40.0))]),
        summarize("mtp-n1", 1, [completion_sample(_answer(60.0, draft=5, acc=4))]),
        summarize("mtp-n3", 3, [completion_sample(_answer(70.0, draft=5, acc=4))]),
        summarize("mtp-n4", 4, [completion_sample(_answer(65.0, draft=5, acc=3))]),
    ]
    res = compare(rows)
    assert res["best_draft_n_max"] == 3 and res["best_speedup"] == 1.75
    assert [r["speedup"] for r in res["rows"]] == [1.0, 1.5, 1.75, 1.625]
    lines = table(res)
    assert lines[0].split()[:2] == ["config", "tok/s"] and "best draft-n-max: 3" in lines[-1]


def test_compare_without_gain_or_baseline():
    rows = [
        summarize("no-mtp", None, [completion_sample(_answer(40.0))]),
        summarize("mtp-n2", 2, [completion_sample(_answer(30.0, draft=5, acc=1))]),
    ]
    assert compare(rows)["best_draft_n_max"] is None
    with pytest.raises(BenchError, match="baseline"):
        compare(rows[1:])
