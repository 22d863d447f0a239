"""Final state after converge, idempotence and the side effects: three llama-server instances of
the PR 22673 stand-in build (MTP spelled `mtp`) under the hardened template unit.

Real parts: a systemd host in podman, the real CPU llama-server builds, tiny GGUF models written by
tests/harness/gguf/make_models.py (the agree model's MTP head reproduces the model, so drafts are
accepted), HTTP requests to the real servers and, from the controller, the real openai client.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

INSTANCES = {"mtp-a": 8081, "plain-b": 8082, "keyed-c": 8083}
KEY_FILE = "/etc/llama-server/keyed-c.key"
PR_BIN = "/opt/llama.cpp/pr22673/bin/llama-server"

# Runs inside the container: one HTTP request, prints {"status", "body"} as JSON.
_HTTP = r"""
import json, sys, urllib.request, urllib.error
a = json.loads(sys.argv[1])
h = dict(a.get("headers") or {})
data = None
if a.get("body") is not None:
    data = json.dumps(a["body"]).encode()
    h["Content-Type"] = "application/json"
req = urllib.request.Request(a["url"], data=data, headers=h, method=a.get("method", "GET"))
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(req, timeout=60) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
"""


def http(host, path, port, body=None, headers=None):
    arg = {"url": f"http://127.0.0.1:{port}{path}", "headers": headers, "body": body}
    if body is not None:
        arg["method"] = "POST"
    out = host.check_output(f"python3 -c {shlex.quote(_HTTP)} {shlex.quote(json.dumps(arg))}")
    return json.loads(out)


def key(host):
    return host.file(KEY_FILE).content_string.strip()


def main_pid(host, name):
    return int(host.check_output(f"systemctl show -p MainPID --value llama-server@{name}.service"))


@pytest.mark.parametrize("name", INSTANCES)
def test_unit_active_and_enabled(host, name):
    svc = host.service(f"llama-server@{name}.service")
    assert svc.is_running
    assert svc.is_enabled


def test_instance_no_longer_listed_was_pruned(host):
    svc = host.service("llama-server@old-z.service")
    assert not svc.is_running and not svc.is_enabled
    for path in (
        "/etc/llama-server/old-z.env",
        "/etc/llama-server/old-z.key",
        "/etc/systemd/system/llama-server@old-z.service.d",
    ):
        assert not host.file(path).exists, path
    names = sorted(host.check_output("ls /etc/llama-server").split())
    assert names == ["keyed-c.env", "keyed-c.key", "mtp-a.env", "plain-b.env"]
    dropins = host.check_output("ls -d /etc/systemd/system/llama-server@*.service.d").split()
    assert sorted(dropins) == sorted(f"/etc/systemd/system/llama-server@{n}.service.d" for n in INSTANCES)


@pytest.mark.parametrize("name, port", INSTANCES.items())
def test_health_200(host, name, port):
    r = http(host, "/health", port)
    assert r["status"] == 200 and json.loads(r["body"])["status"] == "ok"


def test_runs_the_pr_build_with_its_mtp_spelling(host):
    for name in ("mtp-a", "keyed-c"):
        args = host.file(f"/proc/{main_pid(host, name)}/cmdline").content_string.split("\0")
        assert args[0] == PR_BIN
        assert args[args.index("--spec-type") + 1] == "mtp"
    args = host.file(f"/proc/{main_pid(host, 'plain-b')}/cmdline").content_string.split("\0")
    assert "--spec-type" not in args
    assert args[args.index("--ctx-size") + 1] == "1024"


def test_plan_settings_reach_the_command_line(host):
    args = host.file(f"/proc/{main_pid(host, 'mtp-a')}/cmdline").content_string.split("\0")
    assert args[args.index("--ctx-size") + 1] == "2048"  # from the tensor_split plan
    assert args[args.index("--parallel") + 1] == "1"
    assert args[args.index("--spec-draft-n-max") + 1] == "2"
    assert {"--metrics", "--no-webui"} <= set(args)


def test_mtp_completion_drafts_and_accepts(host):
    r = http(host, "/completion", 8081, body={"prompt": "Hello", "n_predict": 32, "temperature": 0})
    assert r["status"] == 200
    timings = json.loads(r["body"])["timings"]
    assert timings["draft_n"] > 0
    assert timings["draft_n_accepted"] > 0


def test_plain_completion_has_no_drafts(host):
    r = http(host, "/completion", 8082, body={"prompt": "Hello", "n_predict": 16, "temperature": 0})
    assert r["status"] == 200
    body = json.loads(r["body"])
    assert body["timings"]["predicted_n"] == 16
    assert "draft_n" not in body["timings"]


def test_metrics_count_drafted_and_accepted_tokens(host):
    http(host, "/completion", 8081, body={"prompt": "abc", "n_predict": 16, "temperature": 0})
    text = http(host, "/metrics", 8081)["body"]
    values = dict(re.findall(r"^(llamacpp:spec_decode_num_\w+_total) (\S+)$", text, re.M))
    assert float(values["llamacpp:spec_decode_num_draft_tokens_total"]) > 0
    assert float(values["llamacpp:spec_decode_num_accepted_tokens_total"]) > 0


def test_api_key_401_without_200_with(host):
    assert http(host, "/v1/models", 8083)["status"] == 401
    assert http(host, "/v1/models", 8083, headers={"Authorization": "Bearer wrong"})["status"] == 401
    ok = http(host, "/v1/models", 8083, headers={"Authorization": f"Bearer {key(host)}"})
    assert ok["status"] == 200
    assert "tiny-agree" in ok["body"]


def test_key_file_is_root_only(host):
    f = host.file(KEY_FILE)
    assert (f.user, f.group, f.mode) == ("root", "root", 0o600)


def test_key_not_in_any_command_line_or_environment(host):
    # The key is read from the root-only file inside the script, so it is not in this script's argv.
    script = (
        "import os\n"
        f"k = open({KEY_FILE!r}).read().strip()\n"
        "hits = []\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    for what in ('cmdline', 'environ'):\n"
        "        try:\n"
        "            if k.encode() in open(f'/proc/{pid}/{what}', 'rb').read(): hits.append((pid, what))\n"
        "        except OSError: pass\n"
        "print(hits)\n"
    )
    assert host.check_output(f"python3 -c {shlex.quote(script)}") == "[]"


def test_key_only_in_files_no_one_else_can_read(host):
    k = key(host)
    found = host.run(
        f"grep -rlsF -- {shlex.quote(k)} /etc /opt /var /run /usr /srv /root /home /tmp --exclude-dir=journal"
    ).stdout.split()
    assert KEY_FILE in found
    for path in found:
        assert host.file(path).mode & 0o004 == 0, f"{path} is world-readable and holds the API key"
    unit = host.check_output("systemctl cat llama-server@keyed-c.service")
    assert k not in unit


def test_ports_bound_as_configured(host):
    listen = host.check_output("ss -ltnH").split("\n")
    local = {line.split()[3] for line in listen if line.strip()}
    assert "127.0.0.1:8081" in local
    assert "127.0.0.1:8082" in local
    assert "0.0.0.0:8083" in local
    assert not any(a.endswith((":8089", ":8090")) for a in local)  # pruned old-z, removed squat-d


def test_runs_as_the_service_user(host):
    for name in INSTANCES:
        owner = host.check_output(f"ps -o user= -p {main_pid(host, name)}")
        assert owner == "llama-server"
    user = host.user("llama-server")
    assert user.shell == "/usr/sbin/nologin"


HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "PrivateUsers": "yes",
    "DevicePolicy": "closed",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "MemoryDenyWriteExecute": "yes",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "User": "llama-server",
}


@pytest.mark.parametrize("name", INSTANCES)
def test_hardening_properties(host, name):
    out = host.check_output(
        f"systemctl show llama-server@{name}.service " + " ".join(f"-p {p}" for p in (*HARDENING, "SystemCallFilter"))
    )
    props = dict(line.split("=", 1) for line in out.splitlines())
    for prop, want in HARDENING.items():
        assert props[prop] == want, prop
    assert props["SystemCallFilter"]  # an allow-list is in force
    assert "ReadOnlyPaths=-/var/lib/llama-models" in host.check_output(f"systemctl cat llama-server@{name}.service")


def test_exposure_score_at_most_2(host):
    out = host.check_output("systemd-analyze security --no-pager llama-server@mtp-a.service")
    score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out).group(1))
    print(f"systemd-analyze security exposure: {score}")
    assert score <= 2.0


def test_prometheus_file_sd(host):
    targets = json.loads(host.file("/etc/llama-server-targets.json").content_string)
    assert sorted(t["labels"]["llama_instance"] for t in targets) == sorted(INSTANCES)
    by_name = {t["labels"]["llama_instance"]: t for t in targets}
    assert by_name["mtp-a"]["targets"] == ["127.0.0.1:8081"]
    assert by_name["mtp-a"]["labels"]["llama_mtp"] == "mtp"


def _container_ip(host):
    name = host.backend.name
    out = subprocess.run(
        ["podman", "inspect", name, "--format", "{{.NetworkSettings.IPAddress}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_openai_client_chat_completion_from_the_controller(host):
    openai = pytest.importorskip("openai")
    base = f"http://{_container_ip(host)}:8083/v1"
    client = openai.OpenAI(base_url=base, api_key=key(host), timeout=60, max_retries=0)
    resp = client.chat.completions.create(
        model="tiny-agree", messages=[{"role": "user", "content": "Hi"}], max_tokens=16, temperature=0
    )
    assert resp.choices[0].message.content
    assert resp.usage.completion_tokens == 16
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()


def test_no_api_key_in_the_journal(host):
    """AnsibleModule logs every module call to the journal ("Invoked with ..."):
    the instance's API key (its file ends in a newline) must never be there."""
    # every field of every entry (export format: the module's options are fields too), searched on the host
    invoked = host.run("journalctl --no-pager -o export | grep -ac 'Invoked with'")
    assert int(invoked.stdout.strip() or 0) > 0  # the modules' calls are there to search
    for secret in (key(host),):
        found = host.run(f"journalctl --no-pager -o export | grep -acF -- {shlex.quote(secret)}")
        assert found.stdout.strip() == "0", f"{secret[:6]}... is in the journal {found.stdout.strip()} times"
