"""The role llama_monitoring: its rules and alerts under promtool (check and unit series for every alert, firing
and quiet), its Prometheus configuration, and the scrape plan (module_utils/monitoring.py).

Real parts: Debian's promtool (scripts/promtool.sh unpacks it from the prometheus package the role installs); the
series are written by hand in tests/prometheus/llamafleet.test.yml, in llama-server's and HAProxy's metric names."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.llamafleet.mtp.plugins.module_utils.metrics_text import parse_metrics
from ansible_collections.llamafleet.mtp.plugins.module_utils.monitoring import (
    MonitoringError,
    host_states,
    key_file_name,
    scrape_plan,
)

from tests.prometheus.render import render, write_rules

HERE = Path(__file__).resolve().parents[1] / "prometheus"
TARGETS = [
    {"host": "h1", "instance": "main", "baseline_tok_s": 100.0, "baseline_acceptance": 0.9, "draft_n_max": 2},
    {"host": "h2", "instance": "main", "baseline_tok_s": None, "baseline_acceptance": None, "draft_n_max": None},
]


@pytest.fixture(scope="module")
def promtool():
    path = os.environ.get("LLAMAFLEET_PROMTOOL") or shutil.which("promtool")
    if not path:
        cached = sorted(
            Path(os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet")).glob("promtool/*/usr/bin/promtool")
        )
        path = str(cached[-1]) if cached else None
    if not path:
        if os.environ.get("LLAMAFLEET_REQUIRE_PROMTOOL"):
            pytest.fail("no promtool (scripts/promtool.sh unpacks it from Debian's prometheus package)")
        pytest.skip("no promtool: run scripts/promtool.sh")
    return path


def test_rules_pass_promtool_check_and_every_alert_has_unit_series_that_fire_and_stay_quiet(promtool, tmp_path):
    write_rules(tmp_path, TARGETS)
    shutil.copy(HERE / "llamafleet.test.yml", tmp_path)
    check = subprocess.run([promtool, "check", "rules", "llamafleet.yml", "baselines.yml", "hosts.yml"], cwd=tmp_path,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run(
        [promtool, "test", "rules", "llamafleet.test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    alerts = {r["alert"] for g in yaml.safe_load((tmp_path / "llamafleet.yml").read_text())["groups"]
              for r in g["rules"] if "alert" in r}  # fmt: skip
    assert len(alerts) == 8
    fires, quiet = set(), set()
    for case in yaml.safe_load((HERE / "llamafleet.test.yml").read_text())["tests"]:
        for t in case.get("alert_rule_test", []):
            (fires if t["exp_alerts"] else quiet).add(t["alertname"])
    assert fires == alerts == quiet, (alerts - fires, alerts - quiet)


def test_a_threshold_override_changes_the_rules_and_the_unit_series_catch_it(promtool, tmp_path):
    """The tests can fail: with the acceptance alert at 50 % of the baseline, h1's 0.5 against 0.9 stays quiet."""
    write_rules(tmp_path, TARGETS, overrides={"acceptance_fraction": 0.5})
    shutil.copy(HERE / "llamafleet.test.yml", tmp_path)
    run = subprocess.run(
        [promtool, "test", "rules", "llamafleet.test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode != 0 and "LlamaMTPAcceptanceLow" in run.stdout + run.stderr


def test_prometheus_config_has_one_job_per_instance_with_its_key_as_a_file_only(promtool, tmp_path):
    plan = scrape_plan(
        ["h1"],
        {"h1": {"instances": [_published("main", key=True), _published("b", port=8081)]}},
        {"h1": [{"name": "main", "api_key": "sk-secret-3b1d"}, {"name": "b"}]},
        keys_dir=str(tmp_path / "keys"),
        gateway_hosts=["g1"],
        gateways={"g1": {"metrics_target": "10.0.0.9:8405"}},
    )
    for f, key in plan["key_files"].items():
        Path(f).parent.mkdir(parents=True, exist_ok=True)
        Path(f).write_text(key + "\n")
    text = _render_config(plan, tmp_path)
    assert "sk-secret-3b1d" not in text
    cfg = yaml.safe_load(text)
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"prometheus", "llama-gateway", "llama/h1/main", "llama/h1/b"}
    assert jobs["llama/h1/main"]["authorization"]["credentials_file"] == str(tmp_path / "keys" / "h1__main")
    assert "authorization" not in jobs["llama/h1/b"]
    assert jobs["llama/h1/b"]["relabel_configs"] == [{"target_label": "job", "replacement": "llama"}]
    assert jobs["llama/h1/main"]["static_configs"][0]["labels"]["llama_mtp"] == "draft-mtp"
    assert jobs["llama-gateway"]["static_configs"] == [{"targets": ["10.0.0.9:8405"], "labels": {"gateway": "g1"}}]
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    check = subprocess.run([promtool, "check", "config", "--syntax-only", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def _render_config(plan, tmp_path, alertmanager=False):
    return render(
        "prometheus.yml.j2", plan["targets"], inventory_hostname="mon", llama_monitoring_scrape_interval="15s",
        llama_monitoring_evaluation_interval="15s", llama_monitoring_config_dir=str(tmp_path),
        __llama_monitoring_port="9090", __llama_monitoring_gateways=plan["gateways"],
        llama_monitoring_alertmanager=alertmanager, llama_monitoring_alertmanager_listen_address="127.0.0.1:9093",
    )  # fmt: skip


def _published(name, port=8080, key=False, metrics=True, host="10.0.0.1"):
    return {
        "name": name, "config_name": name, "url": f"http://{host}:{port}", "model": "m", "mtp": True,
        "spec_type": "draft-mtp", "draft_n_max": 2, "parallel": 2, "api_key": key,
        "args": ["--port", str(port)] + (["--metrics"] if metrics else []),
    }  # fmt: skip


def test_scrape_plan_keeps_a_down_hosts_targets_and_names_what_it_cannot_scrape():
    published = {"h1": {"instances": [_published("main", key=True), _published("quiet", 8081, metrics=False)]}}
    declared = {"h1": [{"name": "main", "api_key": "k1"}, {"name": "quiet"}]}
    speed = {"h1": {"instances": {"main": {"tok_s": 812.4, "acceptance": 0.91}}}}
    previous = {"targets": [{"job": "llama/h2/main", "host": "h2", "instance": "main", "key_file": "/k/h2__main"}],
                "gateways": [{"host": "g1", "target": "10.0.0.9:8405"}, {"host": "gone", "target": "x:1"}]}  # fmt: skip
    plan = scrape_plan(["h1", "h2", "h3"], dict(published, h2=None), declared, speed, previous, keys_dir="/k",
                       gateway_hosts=["g1"], gateways={"g1": None})  # fmt: skip
    assert [t["job"] for t in plan["targets"]] == ["llama/h1/main", "llama/h2/main"]  # metrics off: not scraped
    main = plan["targets"][0]
    assert main["key_file"] == "/k/h1__main" and plan["key_files"] == {"/k/h1__main": "k1"}
    assert main["baseline_tok_s"] == 812.4 and main["baseline_acceptance"] == 0.91 and main["draft_n_max"] == 2
    assert main["labels"] == {"host": "h1", "llama_instance": "main", "llama_model": "m", "llama_mtp": "draft-mtp",
                              "llama_slots": "2"}  # fmt: skip
    assert "k1" not in str(plan["targets"])
    assert plan["kept"] == ["h2"] and plan["missing"] == ["h3"]
    assert plan["gateways"] == [{"host": "g1", "target": "10.0.0.9:8405"}]
    with pytest.raises(MonitoringError, match="host h1, instance 'main', field 'api_key'"):
        scrape_plan(["h1"], published, {"h1": []})
    assert key_file_name("h 1", "a/b") == "h_1__a_b"


def test_host_states_say_what_the_last_run_that_read_a_host_left():
    previous = {"h4": {"as_declared": 0, "reason": "its converge failed (a serving host was rolled back)"}}
    states = host_states(
        ["h1", "h2", "h3", "h4", "h5"],
        read=["h1", "h2", "h3"],
        outcomes={"h1": "converged", "h2": "failed"},
        previous=previous,
    )
    assert states == {
        "h1": {"as_declared": 1, "reason": ""},
        "h2": {"as_declared": 0, "reason": "its converge failed (a serving host was rolled back)"},
        "h3": {"as_declared": 0, "reason": "not converged: the rollout stopped before this host"},
        "h4": previous["h4"],  # not read in this run (unreachable, or outside --limit): last run's word
    }  # h5: never read, nothing known


DASHBOARD = Path(__file__).resolve().parents[2] / "roles" / "llama_monitoring" / "files" / "llamafleet.grafana.json"
CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llama-server" / "mainline-0c1e570.metrics.txt"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def _dashboard_exprs():
    """Every PromQL expression of the dashboard: its panels' targets and its query variables."""
    doc = json.loads(DASHBOARD.read_text())
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []))
            walk(p.get("panels", []))

    walk(doc["panels"])
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["query"]["query"])
            assert m, var
            exprs.append(m.group(1))
    return exprs


def _metric_names(expr):
    """The metric names a PromQL expression reads (not its functions, keywords, labels, strings or durations)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare):
        if bare[m.end() :].lstrip().startswith("(") or m.group(0) in PROMQL_WORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]|e\d+|Inf|NaN", m.group(0)):
            continue
        names.add(m.group(0))
    return names


def test_every_dashboard_expression_reads_a_recording_rule_or_a_metric_the_fleet_exports(promtool, tmp_path):
    write_rules(tmp_path, TARGETS)
    files = ("llamafleet.yml", "baselines.yml", "hosts.yml")
    groups = [g for f in files for g in yaml.safe_load((tmp_path / f).read_text())["groups"]]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    exported = {name.split("{")[0] for name in parse_metrics(CAPTURE.read_text())}  # a real llama-server's /metrics
    known = recorded | exported | {"up", "ALERTS"}  # Prometheus's own series
    exprs = _dashboard_exprs()
    assert len(exprs) >= 15
    read = set()
    for expr in exprs:
        names = _metric_names(expr)
        assert names, expr
        assert names <= known, (expr, names - known)
        read |= names
    # the per-instance speed, acceptance, slots and queue, and the fleet totals, are all on it
    for wanted in ("instance_decode_tokens_per_second:rate1m", "instance_mtp_acceptance:ratio_rate5m",
                   "instance_busy_slots", "gateway_queued_requests",
                   "fleet_decode_tokens_per_second:rate1m", "fleet_mtp_acceptance:ratio_rate5m"):  # fmt: skip
        assert "llamafleet:" + wanted in read, wanted
    # and each expression is valid PromQL (promtool parses it as a rule; Grafana's $host becomes a regex)
    as_rules = [{"record": f"dashboard:expr_{i}", "expr": e.replace("$host", ".*")} for i, e in enumerate(exprs)]
    rules = {"groups": [{"name": "dashboard", "rules": as_rules}]}
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(rules))
    check = subprocess.run([promtool, "check", "rules", "dashboard.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_metric_name_reader_can_fail():
    assert _metric_names('sum by (host) (rate(llamacpp:tokens_predicted_total{job="llama"}[1m]))') == {
        "llamacpp:tokens_predicted_total"}  # fmt: skip
    assert _metric_names('count(ALERTS{alertname=~"Llama.*"}) or vector(0)') == {"ALERTS"}
    assert _metric_names("llamafleet:no_such_rule > 0.5") == {"llamafleet:no_such_rule"}


def test_prometheus_sends_alerts_to_the_alertmanager_only_when_asked(promtool, tmp_path):
    plan = scrape_plan(["h1"], {"h1": {"instances": [_published("main")]}}, {"h1": [{"name": "main"}]})
    assert "alerting" not in yaml.safe_load(_render_config(plan, tmp_path))
    conf = yaml.safe_load(_render_config(plan, tmp_path, alertmanager=True))
    assert conf["alerting"]["alertmanagers"] == [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]
    (tmp_path / "p.yml").write_text(_render_config(plan, tmp_path, alertmanager=True))
    check = subprocess.run([promtool, "check", "config", "--syntax-only", "p.yml"], cwd=tmp_path, capture_output=True,
                           text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_speed_alert_needs_traffic_to_speak_and_the_unit_series_catch_it(promtool, tmp_path):
    """Without the minimum of generating seconds, h3's light traffic (2.5 s in 5 minutes at 50 against its recorded
    100 tokens/s) would fire LlamaDecodeSlowerThanBaseline: the series' expectation of quiet then fails."""
    write_rules(tmp_path, TARGETS, overrides={"speed_min_decode_seconds": 0})
    shutil.copy(HERE / "llamafleet.test.yml", tmp_path)
    run = subprocess.run(
        [promtool, "test", "rules", "llamafleet.test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode != 0 and "LlamaDecodeSlowerThanBaseline" in run.stdout + run.stderr
    assert "h3" in run.stdout + run.stderr
