"""Final state of the llama_monitoring scenario: Debian's Prometheus, hardened, scraping two real llama-server
instances (one with an API key) and itself; the rules loaded; after side_effect, instance a's MTP acceptance is a
series and instance b (stopped) is down with its alert firing. The key never in the config, the command line or the
journal.

Real parts: a systemd host in podman, Prometheus from the Debian mirror, the real CPU llama-server build and a tiny
generated GGUF model (tests/harness/gguf/make_models.py).
"""

from __future__ import annotations

import json
import shlex

KEY = "molecule-monitoring-key-5c2e90d1"
CONF = "/etc/prometheus/llamafleet"


def query(host, path):
    code = ("import json, sys, urllib.request; o = urllib.request.build_opener(urllib.request.ProxyHandler({})); "
            "print(o.open('http://127.0.0.1:9090' + sys.argv[1], timeout=10).read().decode())")  # fmt: skip
    return json.loads(host.check_output(f"python3 -c {shlex.quote(code)} {shlex.quote(path)}"))


def test_prometheus_runs_hardened_with_the_collections_arguments(host):
    assert host.service("prometheus").is_running and host.service("prometheus").is_enabled
    dropin = host.file("/etc/systemd/system/prometheus.service.d/10-llamafleet.conf")
    assert dropin.contains("ProtectSystem=strict") and dropin.contains("SystemCallFilter=@system-service")
    assert host.file("/etc/default/prometheus").contains(f"--config.file={CONF}/prometheus.yml")
    assert host.run("systemctl show -p ProtectSystem prometheus").stdout.strip() == "ProtectSystem=strict"


def test_every_instance_and_itself_are_targets_with_their_labels(host):
    targets = query(host, "/api/v1/targets")["data"]["activeTargets"]
    by_job = {}
    for t in targets:
        by_job.setdefault(t["labels"]["job"], []).append(t)
    assert len(by_job["prometheus"]) == 1 and by_job["prometheus"][0]["health"] == "up"
    llama = {t["labels"]["llama_instance"]: t for t in by_job["llama"]}
    assert set(llama) == {"a", "b"}
    assert llama["a"]["health"] == "up", llama["a"]  # scraped with its key: /metrics needs it
    assert llama["a"]["labels"]["llama_mtp"] == "draft-mtp" and llama["a"]["labels"]["host"] == "llama-monitoring-deb12"
    assert llama["b"]["health"] == "down"  # stopped by side_effect


def test_rules_are_loaded_and_the_acceptance_series_and_down_alert_are_there(host):
    groups = {g["name"] for g in query(host, "/api/v1/rules")["data"]["groups"]}
    assert {"llamafleet-instances", "llamafleet-fleet", "llamafleet-alerts", "llamafleet-baselines"} <= groups
    res = query(host, "/api/v1/query?query=llamafleet:instance_mtp_acceptance:ratio_rate5m")["data"]["result"]
    assert [r["metric"]["llama_instance"] for r in res] == ["a"] and 0 < float(res[0]["value"][1]) <= 1
    alerts = query(host, "/api/v1/alerts")["data"]["alerts"]
    down = [a for a in alerts if a["labels"]["alertname"] == "LlamaInstanceDown" and a["state"] == "firing"]
    assert [a["labels"]["llama_instance"] for a in down] == ["b"]


def test_alerts_reach_the_alertmanager_beside_prometheus(host):
    assert host.service("prometheus-alertmanager").is_running and host.service("prometheus-alertmanager").is_enabled
    ams = query(host, "/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
    assert [a["url"] for a in ams] == ["http://127.0.0.1:9093/api/v2/alerts"]
    conf = host.file("/etc/prometheus/alertmanager.yml")
    assert conf.user == "root" and conf.group == "prometheus" and conf.mode == 0o640
    code = ("import json, urllib.request; o = urllib.request.build_opener(urllib.request.ProxyHandler({})); "
            "print(o.open('http://127.0.0.1:9093/api/v2/alerts', timeout=10).read().decode())")  # fmt: skip
    alerts = json.loads(host.check_output(f"python3 -c {shlex.quote(code)}"))
    down = [a["labels"]["llama_instance"] for a in alerts if a["labels"]["alertname"] == "LlamaInstanceDown"]
    assert down == ["b"]


def test_the_api_key_is_a_credentials_file_only(host):
    key = host.file(f"{CONF}/keys/llama-monitoring-deb12__a")
    assert key.exists and key.user == "root" and key.group == "prometheus" and key.mode == 0o640
    assert key.content_string.strip() == KEY
    assert host.file(f"{CONF}/keys").mode == 0o750
    assert not host.file(f"{CONF}/keys/llama-monitoring-deb12__b").exists  # b has no key
    for path in (f"{CONF}/prometheus.yml", f"{CONF}/targets.json", "/etc/default/prometheus"):
        assert KEY not in host.file(path).content_string, path
    assert KEY not in host.check_output("ps -eo args")
    assert KEY not in host.check_output("journalctl --no-pager -o cat")
