"""Smoke test of the harness: a real systemd host in a podman container (no mocks)."""


def test_systemd_is_pid1(host):
    assert host.process.get(pid=1).comm == "systemd"


def test_unit_running_and_enabled(host):
    svc = host.service("llamafleet-smoke.service")
    assert svc.is_running
    assert svc.is_enabled


def test_unit_listens_on_loopback(host):
    assert host.socket("tcp://127.0.0.1:8099").is_listening
    out = host.check_output(
        "python3 -c \"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8099/').status)\""
    )
    assert out.strip() == "200"
