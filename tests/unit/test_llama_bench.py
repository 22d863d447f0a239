"""MTP benchmark logic: metrics parsing, samples, summaries, comparison, table."""

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_bench import (
    SPEC_ACCEPTED,
    SPEC_DRAFT,
    BenchError,
    compare,
    completion_sample,
    metrics_delta,
    summarize,
    table,
)
from ansible_collections.llamafleet.mtp.plugins.module_utils.metrics_text import parse_metrics

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


def test_at_the_declared_load_the_served_figure_is_compared_and_p_min_is_picked():
    """Autotune at the instance's slots: with 2 clients the figure is the served tokens/s of both streams (a draft
    length that is fastest for one stream can lose when two share the server), and the best configuration's
    p-min comes with its draft length; rows at different concurrencies are not compared."""
    one = [completion_sample(_answer(50.0)), completion_sample(_answer(52.0))]
    base = summarize("no-mtp", None, one, concurrency=2, rounds=[(256, 4.0), (256, 4.2)])
    assert base["tok_s"] == base["served_tok_s"] == pytest.approx(62.5, abs=0.1) and base["tok_s_median"] == 51.0
    assert base["spec_draft_p_min"] is None and base["served_tok_s_samples"] == [64.0, 60.95]
    fast_alone = summarize("mtp-n4", 4, [completion_sample(_answer(90.0))] * 2, concurrency=2, rounds=[(256, 3.2)])
    at_load = summarize("mtp-n2-p0.6", 2, [completion_sample(_answer(70.0))] * 2, concurrency=2, rounds=[(256, 2.0)],
                        spec_draft_p_min=0.6)  # fmt: skip
    r = compare([base, fast_alone, at_load])
    assert r["concurrency"] == 2 and r["best_label"] == "mtp-n2-p0.6"
    assert r["best_draft_n_max"] == 2 and r["best_spec_draft_p_min"] == 0.6 and r["best_speedup"] == 2.049
    lines = table(r)
    assert "served" in lines[0] and "best draft-n-max: 2, p-min 0.6" in lines
    single = summarize("mtp-n3", 3, one)  # one client: the figure is the stream's median, as before
    assert single["tok_s"] == 51.0 and single["concurrency"] == 1 and single["served_tok_s"] is None
    with pytest.raises(BenchError, match="different concurrencies"):
        compare([base, single])
    with pytest.raises(BenchError, match="no timed rounds"):
        summarize("mtp-n3", 3, one, concurrency=2)
    with pytest.raises(BenchError, match="concurrency"):
        summarize("mtp-n3", 3, one, concurrency=0)


# ------------------------------------------------------------------------------------------------
# the rolling converge's speed gate


def _row(med, lo=None, hi=None, acceptance=0.9):
    return {"tok_s_median": med, "tok_s_min": lo or med, "tok_s_max": hi or med, "acceptance": acceptance}


def test_speed_gate_catches_a_slowdown_beyond_the_margin_and_names_everything():
    from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_bench import speed_verdict

    before = {"main": _row(100.0, 97.0, 103.0, 0.92), "b": _row(50.0)}
    after = {"main": _row(80.0, 79.0, 81.0, 0.40), "b": _row(47.0), "new": _row(10.0)}
    ctx = {"main": {"build_before": "pr22673-abc", "build_after": "b9180-def", "model_before": "m-agree.gguf",
                    "model_after": "m-partial.gguf"}}  # fmt: skip
    v = speed_verdict(before, after, 0.1, ctx)
    assert v["slower"] == ["main"]  # -20 %; b is -6 % (inside 10 %); new has nothing to compare with
    assert v["instances"]["main"]["change"] == -0.2 and v["instances"]["main"]["noise_before"] == 0.03
    assert v["instances"]["new"]["change"] is None and not v["instances"]["new"]["slower"]
    (msg,) = v["messages"]
    for part in ("instance 'main'", "80.0 tokens/s", "100.0 tokens/s", "MTP acceptance 40%", "MTP acceptance 92%",
                 "build b9180-def", "build pr22673-abc", "model m-partial.gguf", "model m-agree.gguf", "-20.0%",
                 "margin of 10%", "noise +/-3.0%"):  # fmt: skip
        assert part in msg, (part, msg)


def test_speed_gate_passes_what_is_not_slower_and_refuses_a_bad_margin():
    from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_bench import BenchError, speed_verdict

    v = speed_verdict({"main": _row(100.0)}, {"main": _row(91.0)}, 0.1)
    assert v["slower"] == [] and v["messages"] == [] and v["instances"]["main"]["change"] == -0.09
    assert speed_verdict({"main": _row(100.0)}, {"main": _row(130.0)}, 0.1)["slower"] == []
    for bad in (0, 1, -0.1, "10%", True):
        with pytest.raises(BenchError):
            speed_verdict({}, {}, bad)


def test_speed_gate_needs_the_requests_to_rank_lower_not_only_the_median():
    """A noisy baseline is not a slowdown: the sandbox's false alarm (alias changed, speed the same) had a
    median -17.8 % against a baseline spread of +/-27 %; a real slowdown moves every request."""
    from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_bench import slower_p_value, speed_verdict

    def row(samples):
        s = sorted(samples)
        return {"tok_s_median": s[len(s) // 2], "tok_s_min": s[0], "tok_s_max": s[-1], "tok_s_samples": samples,
                "acceptance": 1.0}  # fmt: skip

    noisy_before = row([3371.0, 2450.0, 4290.0, 3300.0, 2600.0, 3900.0])
    same_after = row([2772.0, 2700.0, 2900.0, 3500.0, 2650.0, 3300.0])
    v = speed_verdict({"main": noisy_before}, {"main": same_after}, 0.1)
    assert v["instances"]["main"]["change"] < -0.1 and v["instances"]["main"]["p_value"] > 0.05
    assert v["slower"] == []
    really = row([x * 0.8 for x in [3371.0, 3300.0, 3350.0, 3400.0, 3320.0, 3390.0]])
    v = speed_verdict({"main": row([3371.0, 3300.0, 3350.0, 3400.0, 3320.0, 3390.0])}, {"main": really}, 0.1)
    assert v["slower"] == ["main"] and v["instances"]["main"]["p_value"] < 0.01
    assert "(p=0.001)" in v["messages"][0] or "(p=0.002)" in v["messages"][0]
    # exact for small sets, the normal approximation for large ones agrees in direction
    assert slower_p_value([1, 2, 3], [4, 5, 6]) == 0.05  # 1 arrangement in 20
    assert slower_p_value([4, 5, 6], [1, 2, 3]) == 1.0
    big_a, big_b = list(range(100, 130)), list(range(115, 145))
    assert slower_p_value(big_a, big_b) < 0.05 < slower_p_value(big_b, big_a)
    assert slower_p_value([], [1.0]) is None


def test_speed_gate_says_when_the_figure_is_the_faster_of_two_measurements():
    """The role measures a figure beyond the margin once more and keeps the faster (``measurements: 2``): the
    verdict carries the count, and a slowdown that stands is named as measured twice."""
    from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_bench import speed_verdict

    def row(samples, **kw):
        s = sorted(samples)
        return dict({"tok_s_median": s[len(s) // 2], "tok_s_min": s[0], "tok_s_max": s[-1], "tok_s_samples": samples,
                     "acceptance": 1.0}, **kw)  # fmt: skip

    before = row([100.0, 101.0, 99.0, 100.5])
    v = speed_verdict({"main": before}, {"main": row([60.0, 61.0, 59.0, 60.5], measurements=2)}, 0.1)
    assert v["slower"] == ["main"] and v["instances"]["main"]["measurements"] == 2
    assert "the faster of 2 measurements" in v["messages"][0]
    v = speed_verdict({"main": before}, {"main": row([60.0, 61.0, 59.0, 60.5])}, 0.1)
    assert v["instances"]["main"]["measurements"] == 1 and "2 measurements" not in v["messages"][0]
    assert speed_verdict({}, {"main": before}, 0.1)["instances"]["main"]["measurements"] == 1
    assert speed_verdict({"main": before}, {}, 0.1)["instances"]["main"]["measurements"] is None


def test_speed_gate_filter_keeps_the_last_figure_of_an_instance_that_did_not_restart():
    """The filter the converge uses: instances measured neither before nor after (not restarted) keep the entry the
    last converge recorded, marked carried and never judged; a measured one is judged, whatever was recorded."""
    from ansible_collections.llamafleet.mtp.plugins.filter.llama_bench import FilterModule

    gate = FilterModule().filters()["llama_speed_gate"]
    recorded = {"other": {"tok_s": 812.4, "acceptance": 0.91, "change": -0.03, "tok_s_before": 838.6, "slower": False},
                "main": {"tok_s": 100.0, "change": 0.0}, "gone": "not a dict"}  # fmt: skip
    v = gate({"main": _row(100.0)}, {"main": _row(70.0)}, 0.1, build_before="b1", build_after="b2",
             models_before={"main": "/m/a.gguf"}, models_after={"main": "/m/b.gguf"}, carried=recorded)  # fmt: skip
    assert v["slower"] == ["main"] and "model b.gguf" in v["messages"][0] and "build b1" in v["messages"][0]
    assert v["instances"]["main"]["change"] == -0.3 and "carried" not in v["instances"]["main"]
    other = v["instances"]["other"]
    assert other["carried"] and other["tok_s"] == 812.4 and other["change"] is None and other["tok_s_before"] is None
    assert "gone" not in v["instances"]
    assert gate({}, {}, 0.1)["instances"] == {}
