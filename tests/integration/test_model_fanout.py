"""Fan-out delivery of models (model_fetch_delivery: fanout) on real systemd hosts (podman containers from the
sandbox image), through ansible-runner: the controller sends one copy, the hosts that hold a verified copy serve
the others through the distribution's rsync daemon (a transient systemd unit), check mode predicts the rounds,
a peer whose copy is corrupt is refused and the controller delivers instead, and a host that joins with --limit
fetches from a peer found by the probe; and in pieces (model_fetch_fanout_pieces_min): the controller sends each
host one piece, the hosts gather the others from each other, a corrupt piece is refused. Real parts only: hosts,
systemd, rsync, a generated GGUF (the sandbox model); the controller source stands in for the controller's cache
of a Hugging Face download.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PREFIX = "llama-fanout"
HOSTS = [f"{PREFIX}-{i}" for i in (1, 2, 3, 4)]
MODEL_DIR = "/var/lib/llama-models/fan"
pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or subprocess.run(
        ["podman", "image", "exists", "localhost/debian-systemd:12"], check=False).returncode != 0,
    reason="needs podman and the sandbox image (scripts/sandbox.sh images)",
)  # fmt: skip


def on_host(host, *cmd, check=True):
    return subprocess.run(["podman", "exec", host, *cmd], capture_output=True, text=True, check=check).stdout


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A GGUF with MTP layers (tests/harness/gguf/make_models.py), padded to 24 MiB so a transfer takes a moment."""
    out = tmp_path_factory.mktemp("model")
    subprocess.run([sys.executable, str(REPO / "tests/harness/gguf/make_models.py"), "--kind", "agree",
                    "--out", str(out), "--name", "fan"], check=True, capture_output=True)  # fmt: skip
    path = out / "fan.gguf"
    with path.open("ab") as f:
        f.write(os.urandom(24 * 1024 * 1024))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def hosts():
    env = dict(os.environ, SANDBOX_PREFIX=PREFIX, SANDBOX_GATEWAY="0")
    subprocess.run(["bash", str(REPO / "scripts/sandbox.sh"), "up", "4", "12"], check=True, env=env,
                   capture_output=True)  # fmt: skip
    yield HOSTS
    subprocess.run(["podman", "rm", "-f", *HOSTS], check=False, capture_output=True)


WHOLE = {"model_fetch_fanout_pieces_min": 0}  # whole files in doubling rounds


def play(tmp_path_factory, hosts, model, *, check=False, limit=None, extravars=None):
    import ansible_runner

    data = tmp_path_factory.mktemp("runner")
    inv = data / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"fanout_hosts": {"hosts": {h: None for h in hosts}}},
                                           "vars": {"ansible_connection": "podman",
                                                    "ansible_python_interpreter": "/usr/bin/python3"}}}))  # fmt: skip
    path, sha = model
    ev = {"fanout_models": [{"name": "fan", "source": "controller", "controller_path": str(path), "sha256": sha}],
          "model_fetch_controller_cache": str(path.parent / "cache")}  # fmt: skip
    ev.update(extravars or {})
    t0 = time.monotonic()
    r = ansible_runner.run(
        private_data_dir=str(data), playbook=str(REPO / "tests/integration/model_fanout.yml"), inventory=str(inv),
        extravars=ev, cmdline="--check" if check else None, limit=limit, quiet=True,
        envvars={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                 "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip
    events = list(r.events)
    r.seconds = time.monotonic() - t0
    r.plan = next((e["event_data"]["res"]["msg"] for e in events if e.get("event") == "runner_on_ok"
                   and e["event_data"].get("task") == "Show the fan-out plan"), None)  # fmt: skip
    said = "Say where each host's files came from"
    r.report = {e["event_data"]["host"]: e["event_data"]["res"]["msg"] for e in events
                if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == said}  # fmt: skip
    r.changed = sorted(
        {
            (e["event_data"]["host"], e["event_data"].get("task"))
            for e in events
            if e.get("event") == "runner_on_ok" and (e["event_data"].get("res") or {}).get("changed")
        }
    )
    r.failures = [(e["event_data"].get("host"), e["event_data"].get("task"), e["event_data"]["res"].get("msg"))
                  for e in events
                  if e.get("event") == "runner_on_failed" and not e["event_data"].get("ignore_errors")]  # fmt: skip
    return r


def sha_on(host):
    out = on_host(host, "sha256sum", f"{MODEL_DIR}/fan.gguf", check=False)
    return out.split()[0] if out else None


def no_share_left(host):
    assert on_host(host, "systemctl", "is-active", "llamafleet-model-share", check=False).strip() != "active"
    assert on_host(host, "test", "-e", "/run/llamafleet-model-share", check=False) == ""
    assert subprocess.run(["podman", "exec", host, "test", "-e", "/run/llamafleet-model-share"]).returncode != 0
    assert on_host(host, "sh", "-c", f"ls -A {MODEL_DIR} | grep -c 'incoming\\|piece' || true").strip() == "0"


def test_fanout_delivery(tmp_path_factory, hosts, model):
    """Check mode predicts the rounds; the real run follows them with one copy from the controller; a rerun
    changes nothing; a peer's corrupt copy is refused (one retry, then the controller), never adopted; a host
    that joins with --limit fetches from a peer the probe finds."""
    first3 = hosts[:3]
    predicted = play(tmp_path_factory, first3, model, check=True, extravars=WHOLE)
    assert predicted.status == "successful", predicted.failures
    assert predicted.plan == [
        f"round 0: {first3[0]} <- controller (fan/fan.gguf)",
        f"round 1: {first3[1]} <- {first3[0]} (fan/fan.gguf)",
        f"round 2: {first3[2]} <- {first3[0]} (fan/fan.gguf)",
    ], predicted.plan
    assert all(sha_on(h) is None for h in first3)

    run = play(tmp_path_factory, first3, model, extravars=WHOLE)
    assert run.status == "successful", run.failures
    assert run.plan == predicted.plan
    _, sha = model
    assert [sha_on(h) for h in first3] == [sha] * 3
    origins = {h: [o["from"] for o in run.report[h]["origins"]] for h in first3}
    assert origins == {first3[0]: ["controller"], first3[1]: [f"peer {first3[0]}"], first3[2]: [f"peer {first3[0]}"]}
    size = model[0].stat().st_size
    assert sum(int(run.report[h]["controller_sent"]) for h in first3) == size  # one copy, whatever the fleet size
    for h in first3:
        no_share_left(h)
    # The shares' one-time token: masked in the modules' invocation lines in the journal (AnsibleModule logs
    # every option that is not no_log), and never written where the journal or argv could show it.
    for h, option in ((first3[0], "max_connections="), (first3[1], "bwlimit_kib=")):  # model_share, model_peer_fetch
        logged = [line for line in on_host(h, "journalctl", "--no-pager", "-o", "cat").splitlines()
                  if "Invoked with" in line and option in line]  # fmt: skip
        assert logged and all("secret=NOT_LOGGING_PARAMETER" in line for line in logged), logged
    print(f"\nfan-out to 3 hosts: {run.seconds:.1f} s (check mode {predicted.seconds:.1f} s)")

    again = play(tmp_path_factory, first3, model, extravars=WHOLE)
    assert again.status == "successful" and again.plan is None
    assert again.changed == [], again.changed

    # A corrupt peer: the first host's copy changes, its size and mtime kept, so its own sidecar still vouches
    # for it (a disk error, a tampered file); the others lose theirs and are planned to fetch from it.
    on_host(first3[0], "python3", "-c", (
        "import os; p='" + MODEL_DIR + "/fan.gguf'; st=os.stat(p); f=open(p,'r+b'); f.seek(st.st_size//2); "
        "f.write(b'\\xff'*4096); f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))"))  # fmt: skip
    for h in first3[1:]:
        on_host(h, "rm", "-f", f"{MODEL_DIR}/fan.gguf", f"{MODEL_DIR}/fan.gguf.verified.json")
    bad = play(tmp_path_factory, first3, model, extravars=WHOLE)
    assert bad.status == "successful", bad.failures
    for h in first3[1:]:
        assert sha_on(h) == sha  # never the bad file
        fetched = bad.report[h]["peer_files"]
        assert [f["status"] for f in fetched] == ["failed"]
        assert "refused its copy" in fetched[0]["attempts"][0]["error"], fetched
        assert [o["from"] for o in bad.report[h]["origins"]] == ["controller"]
    print(f"corrupt peer: {json.dumps(bad.report[first3[2]]['peer_files'][0]['attempts'])}")

    # Repair the first host from its peers (a full check finds the corruption; the next run replaces the file),
    # resuming what an interrupted transfer left: the first half of the file under its temp name.
    on_host(first3[0], "rm", "-f", f"{MODEL_DIR}/fan.gguf", f"{MODEL_DIR}/fan.gguf.verified.json")
    half = Path(model[0].parent / "half")
    half.write_bytes(model[0].read_bytes()[: size // 2])
    subprocess.run(["podman", "cp", str(half), f"{first3[0]}:{MODEL_DIR}/.fan.gguf.incoming"], check=True)
    fixed = play(tmp_path_factory, first3, model, extravars=WHOLE)
    assert fixed.status == "successful", fixed.failures
    assert sha_on(first3[0]) == sha
    assert [o["from"] for o in fixed.report[first3[0]]["origins"]] == [f"peer {first3[1]}"]
    assert fixed.report[first3[0]]["peer_files"][0]["bytes"] == size - size // 2  # resumed, not sent again

    # A host joins with --limit: the others are outside the run; the probe finds a holder.
    # Its transfer capped at 8 MiB/s (model_fetch_peer_bwlimit_kib): it cannot take less than the size at the cap.
    capped_ev = {**WHOLE, "model_fetch_peer_bwlimit_kib": 8192}
    joined = play(tmp_path_factory, hosts, model, limit=hosts[3], extravars=capped_ev)
    assert joined.status == "successful", joined.failures
    assert sha_on(hosts[3]) == sha
    assert [o["from"] for o in joined.report[hosts[3]]["origins"]] == [f"peer {first3[0]}"]
    assert int(joined.report[hosts[3]]["controller_sent"]) == 0
    capped = joined.report[hosts[3]]["peer_files"][0]
    assert capped["seconds"] >= 0.9 * size / (8192 * 1024), capped
    print(f"joined with --limit, capped at 8 MiB/s: {capped['bytes']} bytes in {capped['seconds']} s")
    for h in hosts:
        no_share_left(h)


def corrupt_when_it_lands(host, path):
    """Flip a block in the middle of ``path`` on ``host`` as soon as it appears (the controller's copy lands under
    its final name at once), before the peers gather it: a disk error, a tampered piece. A process in the host
    (no thread beside ansible-runner's pty); it prints "hit" when it did."""
    script = ("import os; p='" + path + "'; n=os.path.getsize(p); f=open(p,'r+b'); f.seek(n//2); "
              "f.write(b'\\xff'*4096); f.close(); print('hit')")  # fmt: skip
    loop = f'for i in $(seq 1200); do [ -s {path} ] && exec python3 -c "{script}"; sleep 0.1; done'
    return subprocess.Popen(["podman", "exec", host, "sh", "-c", loop], stdout=subprocess.PIPE, text=True)


def test_fanout_in_pieces(tmp_path_factory, hosts, model):
    """Three hosts that miss a file nobody holds: check mode predicts the pieces, the controller sends each host
    one piece (one copy in all), the hosts gather the others' pieces from each other and adopt the verified
    file; a rerun changes nothing; a piece corrupted on its holder after the controller's copy is refused by every
    receiver (piece sha256), never adopted, and the controller delivers the file whole instead."""
    first3 = hosts[:3]
    for h in first3:
        on_host(h, "rm", "-rf", MODEL_DIR)
    _, sha = model
    size = model[0].stat().st_size
    predicted = play(tmp_path_factory, first3, model, check=True)
    assert predicted.status == "successful", predicted.failures
    assert predicted.plan == [
        f"round 0: controller -> pieces of fan/fan.gguf: {first3[0]} (1/3), {first3[1]} (2/3), {first3[2]} (3/3)",
        f"round 1: {', '.join(first3)} <- each other's pieces (fan/fan.gguf)",
    ], predicted.plan
    assert all(sha_on(h) is None for h in first3)

    run = play(tmp_path_factory, first3, model)
    assert run.status == "successful", run.failures
    assert run.plan == predicted.plan
    assert [sha_on(h) for h in first3] == [sha] * 3
    for h in first3:
        others = ", ".join(x for x in first3 if x != h)
        assert [o["from"] for o in run.report[h]["origins"]] == [f"peers {others} (pieces)"], run.report[h]
        got = run.report[h]["peer_files"][0]
        assert got["status"] == "adopted" and got["pieces"] == 3 and got["attempts"] == []
        assert 0 < got["bytes"] < size  # all but its own piece
        no_share_left(h)
        # the share's stop removed the piece the controller sent it (and the gather every piece it fetched)
        assert on_host(h, "find", MODEL_DIR, "-name", ".fan.gguf.piece-*").strip() == ""
    assert sum(int(run.report[h]["controller_sent"]) for h in first3) == size  # one copy, in pieces
    assert not (model[0].parent / "cache" / ".pieces" / "fan").exists()
    print(f"\nfan-out in pieces to 3 hosts: {run.seconds:.1f} s (check mode {predicted.seconds:.1f} s)")

    again = play(tmp_path_factory, first3, model)
    assert again.status == "successful" and again.plan is None
    assert again.changed == [], again.changed

    for h in first3:
        on_host(h, "rm", "-rf", MODEL_DIR)
    watcher = corrupt_when_it_lands(first3[1], f"{MODEL_DIR}/.fan.gguf.piece-1")
    try:
        bad = play(tmp_path_factory, first3, model)
    finally:
        watcher.kill()
    assert watcher.communicate()[0].strip() == "hit", "the piece never landed"
    assert bad.status == "successful", bad.failures
    for h in first3:
        assert sha_on(h) == sha  # never the bad file
        fetched = bad.report[h]["peer_files"]
        assert [f["status"] for f in fetched] == ["failed"], fetched
        errors = [a["error"] for a in fetched[0]["attempts"]]
        if h == first3[1]:  # its own piece no longer matches, and nobody else holds it
            assert errors == ["piece 2: this host's copy does not match its sha256 and no other host holds it"], errors
        else:
            assert errors == ["refused its copy: piece 2 does not match its sha256"], errors
        assert [o["from"] for o in bad.report[h]["origins"]] == ["controller"]
        no_share_left(h)
    print(f"corrupt piece: {json.dumps(bad.report[first3[0]]['peer_files'][0]['attempts'])}")
