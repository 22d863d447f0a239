"""The fleet playbooks on the sandbox fleet (real podman systemd hosts, real llama.cpp builds
from the local mirror, real generated GGUF models, real llama-server units).

Stand-in: the mirror's refs/pull/22673/head stands in for the pre-merge PR #22673 branch.
Runs in the full lane after scripts/run-sandbox.sh brought the fleet up (FLEET_SANDBOX=1), in
this order: site.yml is idempotent; "the PR merged" upgrade (ref only) moves every host to
mainline and the spelling follows the binary; a failing upgrade rolls the canary back and
stops; the benchmark with --tags autotune keeps the best draft length in the host's vars.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("FLEET_SANDBOX") != "1", reason="needs the sandbox fleet (FLEET_SANDBOX=1)"),
]
HOSTS = ("llama-sandbox-1", "llama-sandbox-2")


def play(*args, inventory="inventories/sandbox", check=True):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    return proc


def recap(out):
    return {
        m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
        for m in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", out, re.MULTILINE)
    }


def on_host(host, *cmd):
    return subprocess.run(["podman", "exec", host, *cmd], capture_output=True, text=True, check=True).stdout


def current_build(host):
    return json.loads(on_host(host, "cat", "/opt/llama.cpp/current/build-info.json"))


def env_args(host):
    return on_host(host, "cat", "/etc/llama-server/main.env")


def test_1_site_is_idempotent():
    out = play("site.yml").stdout
    for host in HOSTS:
        assert recap(out)[host]["changed"] == 0, out[-4000:]
        assert "--spec-type mtp" in env_args(host)  # day one: the PR branch's spelling


def test_2_upgrade_when_the_pr_merged():
    out = play("playbooks/upgrade.yml", "-e", "llamafleet_upgrade_ref=mainline-0c1e570").stdout
    counts = [int(n) for n in re.findall(r"llama.cpp builds: (\d+) compile\(s\) this run", out)]
    # two batches (canary, rest); at most one compile for the fleet (none when the controller
    # cache already holds this build key's artifact), never one in the second batch
    assert len(counts) == 2 and sum(counts) <= 1 and counts[1] == 0, counts
    for host in HOSTS:
        assert current_build(host)["capabilities"]["mtp_spec_type"] == "draft-mtp"
        args = env_args(host)
        assert "--spec-type draft-mtp" in args and "--spec-type mtp " not in args
        health = on_host(
            host,
            "python3",
            "-c",
            "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8080/health').status)",
        )
        assert health.strip() == "200"


def test_3_failed_upgrade_rolls_back_and_stops():
    before = {h: current_build(h)["name"] for h in HOSTS}
    proc = play(
        "playbooks/upgrade.yml",
        "-e",
        "llamafleet_upgrade_ref=pull/22673",
        "-e",
        '{"llamafleet_upgrade_models": {"main": "no-such-model"}}',
        check=False,
    )
    assert proc.returncode != 0
    assert "was rolled back to the previous build and models and serves again" in proc.stdout
    assert "llama-sandbox-2" not in recap(proc.stdout)  # the rollout stopped after the canary
    for host in HOSTS:
        assert current_build(host)["name"] == before[host]
        assert "--spec-type draft-mtp" in env_args(host)


def test_4_bench_autotune_writes_the_best_draft_length(tmp_path):
    inv = tmp_path / "inventory"
    shutil.copytree(REPO / "inventories" / "sandbox", inv)
    # A model large enough that CPU decode is weight-bound, so MTP pays (agree head: acceptance 1.0).
    models = Path(os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet")) / "models" / "bench"
    if not (models / "bench-agree.gguf").exists():
        subprocess.run(
            [
                sys.executable,
                str(REPO / "tests/harness/gguf/make_models.py"),
                "--kind",
                "agree",
                "--name",
                "bench-agree",
                "--n-embd",
                "1024",
                "--n-layer",
                "6",
                "--out",
                str(models),
            ],
            check=True,
            capture_output=True,
        )
    (inv / "host_vars" / "llama-sandbox-1").mkdir(parents=True)
    (inv / "host_vars" / "llama-sandbox-1" / "bench.yml").write_text(
        "---\nllamafleet_models:\n  - name: bench-agree\n    source: controller\n"
        f"    controller_path: {models}/bench-agree.gguf\n"
        "llamafleet_instances:\n  - name: main\n    model: bench-agree\n    port: 8080\n    context: 2048\n"
    )
    out = play(
        "playbooks/bench.yml",
        "--tags",
        "autotune",
        "--limit",
        "llama-sandbox-1",
        "-e",
        '{"llamafleet_bench_draft_n_max": [1, 3]}',
        "-e",
        f"llamafleet_bench_dir={tmp_path}/results",
        inventory=inv,
    ).stdout
    result = json.loads((tmp_path / "results" / "llama-sandbox-1.json").read_text())["result"]
    labels = [r["label"] for r in result["rows"]]
    assert labels == ["no-mtp", "mtp-n1", "mtp-n3"]
    assert all(r["acceptance"] == 1.0 for r in result["rows"][1:])
    tuned = inv / "host_vars" / "llama-sandbox-1" / "llamafleet_autotune.yml"
    if result["best_draft_n_max"] is not None:
        assert f"main: {result['best_draft_n_max']}" in tuned.read_text(), out[-3000:]
    else:  # a noisy 2-core machine can make MTP lose; then nothing is written
        assert not tuned.exists()
