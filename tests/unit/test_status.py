"""The fleet's status table (module_utils/status.py and the llama_fleet_status filter).

Inputs are shaped as llama_host_state (live) and fleet_declared return them; the /metrics text is a real
capture of llama-server (tests/fixtures/llama-server/mainline-0c1e570.metrics.txt), the Prometheus answer the
shape of /api/v1/query's data.result for the role's recording rules.
"""

import json

import pytest
from ansible_collections.llamafleet.mtp.plugins.filter.llama_status import llama_fleet_status
from ansible_collections.llamafleet.mtp.plugins.module_utils.metrics_text import parse_metrics
from ansible_collections.llamafleet.mtp.plugins.module_utils.status import (
    COLUMNS,
    direct_figures,
    fleet_status,
    prometheus_figures,
    render,
)

SHA = "ab" * 32
COMMIT = "0d91d73bb06540eb9b765a132bd7037e29683040"


@pytest.fixture
def metrics(fixtures_dir):
    return parse_metrics((fixtures_dir / "llama-server" / "mainline-0c1e570.metrics.txt").read_text())


def host_state(metrics, active="active", health=200, names=("main",)):
    instances = {
        n: {
            "active_state": active,
            "sub_state": "running" if active == "active" else "dead",
            "main_pid": 42,
            "live": {"url": f"http://h1:{8080 + i}", "health": health, "metrics": metrics, "error": None},
        }
        for i, n in enumerate(names)
    }
    recorded = [
        {
            "name": n,
            "url": f"http://h1:{8080 + i}",
            "model": "qwen-mtp",
            "mtp": True,
            "spec_type": "draft-mtp",
            "draft_n_max": 3,
            "parallel": 2,
        }
        for i, n in enumerate(names)
    ]
    return {
        "build": {"name": "master-0d91d73bb065", "commit": COMMIT, "mtp_spec_type": "draft-mtp"},
        "instances": instances,
        "applied": {
            "instances": [{"name": n} for n in names],
            "facts": {
                "llama_server_systemd_facts": {"instances": recorded},
                "model_fetch_facts": {"qwen-mtp": {"sha256": SHA}},
                "llamafleet_speed": {"instances": {"main": {"tok_s": 40.0, "acceptance": 0.9}}},
            },
            "drift": [],
        },
    }


def read(state):
    return {"unreachable": False, "failed": False, "msg": None, "state": state}


CONVERGED = {"converged": True, "drift": []}


def test_direct_figures_from_a_real_capture(metrics):
    fig = direct_figures(metrics)
    assert fig["decode_tok_s"] == pytest.approx(144 / 0.027922)
    assert fig["acceptance"] == pytest.approx(93 / 93)
    assert fig["slots_busy"] == 0
    assert fig["deferred"] == 0


def test_direct_figures_without_mtp_or_traffic():
    fig = direct_figures({"llamacpp:tokens_predicted_total": 0.0, "llamacpp:requests_processing": 1.0})
    assert fig["decode_tok_s"] is None and fig["acceptance"] is None and fig["slots_busy"] == 1
    assert direct_figures(None)["decode_tok_s"] is None


def test_one_row_per_instance_with_every_column(metrics):
    rows = fleet_status(["h1"], {"h1": read(host_state(metrics, names=("main", "side")))}, {"h1": CONVERGED}, COMMIT)
    assert [r["instance"] for r in rows] == ["main", "side"]
    r = rows[0]
    assert r["url"] == "http://h1:8080" and r["build"] == "master-0d91d73bb065" and r["mtp"] == "draft-mtp"
    assert r["model"] == "qwen-mtp" and r["sha256"] == SHA and r["sha256_short"] == SHA[:12]
    assert r["health"] == "healthy" and r["slots"] == "0/2" and r["source"] == "instance"
    assert r["draft_n_max"] == 3 and r["baseline_tok_s"] == 40.0
    assert r["matches_declared"] is True and r["declared"] == "yes" and r["reachable"] is True
    assert rows[1]["baseline_tok_s"] is None  # no speed-gate figure recorded for it
    lines = render(rows)
    assert lines[0].split() == [h for _, h in COLUMNS]
    assert lines[1].split()[:2] == ["h1", "main"] and len(lines) == 3


def test_prometheus_figures_win_over_the_instance_counters(metrics):
    prom = [
        {
            "metric": {
                "__name__": "llamafleet:instance_request_tokens_per_second:ratio_rate5m",
                "host": "h1",
                "llama_instance": "main",
            },
            "value": [1700000000.0, "31.5"],
        },
        {
            "metric": {
                "__name__": "llamafleet:instance_mtp_acceptance:ratio_rate5m",
                "host": "h1",
                "llama_instance": "main",
            },
            "value": [1700000000.0, "0.62"],
        },
        {
            "metric": {
                "__name__": "llamafleet:instance_decode_tokens_per_second:rate1m",
                "host": "h1",
                "llama_instance": "main",
            },
            "value": [1700000000.0, "55"],
        },
        {
            "metric": {"__name__": "llamafleet:instance_busy_slots", "host": "h1", "llama_instance": "main"},
            "value": [1700000000.0, "2"],
        },
        # another rule of the role, and a NaN: not shown
        {
            "metric": {"__name__": "llamafleet:instance_deferred_requests", "host": "h1", "llama_instance": "main"},
            "value": [1700000000.0, "3"],
        },
        {
            "metric": {
                "__name__": "llamafleet:instance_mtp_acceptance:ratio_rate5m",
                "host": "h1",
                "llama_instance": "side",
            },
            "value": [1700000000.0, "NaN"],
        },
    ]
    assert prometheus_figures(prom)[("h1", "main")] == {
        "decode_tok_s": 31.5,
        "acceptance": 0.62,
        "served_tok_s": 55.0,
        "slots_busy": 2.0,
    }
    rows = fleet_status(["h1"], {"h1": read(host_state(metrics))}, {"h1": CONVERGED}, COMMIT, prom)
    r = rows[0]
    assert (r["decode_tok_s"], r["acceptance"], r["served_tok_s"], r["slots"]) == (31.5, 0.62, 55.0, "2/2")
    assert r["source"] == "prometheus" and r["acceptance_text"] == "62%" and r["decode"] == "31.5"
    assert r["deferred"] == 0  # the instance's own gauge


def test_an_unreachable_host_is_a_row_that_says_so(metrics):
    reads = {
        "h1": read(host_state(metrics)),
        "h2": {"unreachable": True, "failed": False, "msg": "Failed to connect to the host via ssh: timeout\nmore"},
    }
    rows = fleet_status(["h1", "h2"], reads, {"h1": CONVERGED, "h2": None}, COMMIT)
    down = rows[-1]
    assert (down["host"], down["instance"], down["reachable"], down["health"]) == ("h2", None, False, "unreachable")
    assert down["declared"] == "unknown" and down["message"] == "Failed to connect to the host via ssh: timeout"
    assert any(line.startswith("h2: Failed to connect") for line in render(rows))


def test_not_as_declared_says_why(metrics):
    state = host_state(metrics, active="failed", health=None)
    drifted = {"converged": False, "drift": ["instance main is failed"]}
    r = fleet_status(["h1"], {"h1": read(state)}, {"h1": drifted}, COMMIT)[0]
    assert r["health"] == "failed (dead)" and r["declared"] == "no" and r["matches_declared"] is False
    assert "h1: not as declared - instance main is failed" in render([r])
    # the digest matches, but the declared branch moved on
    r = fleet_status(["h1"], {"h1": read(host_state(metrics))}, {"h1": CONVERGED}, "f" * 40)[0]
    assert r["declared"] == "no" and r["declared_reasons"] == ["runs 0d91d73bb065, the declared ref names ffffffffffff"]
    # a refused declared state
    refused = {"failed": True, "msg": "host h1, instance main, field 'ctx_size': must be at least 256"}
    r = fleet_status(["h1"], {"h1": read(host_state(metrics))}, {"h1": refused}, COMMIT)[0]
    assert r["declared"] == "invalid" and "ctx_size" in r["declared_reasons"][0]


def test_health_words(metrics):
    for code, word in (
        (200, "healthy"),
        (503, "loading"),
        (401, "unhealthy (401)"),
        ("timed out", "unhealthy (timed out)"),
    ):
        assert fleet_status(["h1"], {"h1": read(host_state(metrics, health=code))}, {})[0]["health"] == word


def test_a_host_without_instances_and_a_failed_read(metrics):
    empty = host_state(metrics, names=())
    empty["applied"] = None
    rows = fleet_status(["h1", "h2"], {"h1": read(empty), "h2": {"failed": True, "msg": "nvidia-smi failed"}}, {})
    assert [(r["host"], r["instance"], r["health"]) for r in rows] == [
        ("h1", None, "no instance"),
        ("h2", None, "read failed"),
    ]


def test_the_filter_takes_registered_results_and_the_rows_are_json(metrics):
    registered = {
        "h1": {"changed": False, "ansible_facts": {"llama_host_state": host_state(metrics)}},
        "h2": {"unreachable": True, "msg": "Failed to create temporary directory", "changed": False},
    }
    out = llama_fleet_status(
        registered,
        ["h1", "h2"],
        declared={"h1": CONVERGED, "h2": {"skipped": True}},
        ref_commit=COMMIT,
        notes=["figures from each instance since it started"],
    )
    assert [r["reachable"] for r in out["rows"]] == [True, False]
    assert out["rows"][1]["declared"] == "unknown"
    assert out["lines"][-1] == "figures from each instance since it started"
    assert json.loads(json.dumps(out["rows"]))[0]["sha256"] == SHA
