"""The gateway's servers come from the instances the server role published (module_utils/gateway.py)."""

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.gateway import GatewayError, server_name, servers


def inst(name, port, host="0.0.0.0", url_host="h1", config_name=None, key=True):
    local = "127.0.0.1" if host == "0.0.0.0" else host
    if ":" in host:
        local = host = f"[{host}]"
    return {
        "name": name,
        "config_name": config_name or name,
        "host": host,
        "port": port,
        "url": f"http://{url_host if host == '0.0.0.0' else host}:{port}",
        "health_url": f"http://{local}:{port}/health",
        "api_key": key,
    }


def facts(*instances):
    return {"instances": list(instances)}


def test_every_instance_and_replica_of_every_host_in_order():
    published = {
        "h1": facts(inst("big-0", 8080, config_name="big"), inst("big-1", 8081, config_name="big")),
        "h2": facts(inst("main", 8080, url_host="h2")),
    }
    out = servers(published, ["h1", "h2"], "gw")
    assert [(s["name"], s["address"], s["port"], s["target"]) for s in out["servers"]] == [
        ("h1_big-0", "h1", 8080, "h1:8080"),
        ("h1_big-1", "h1", 8081, "h1:8081"),
        ("h2_main", "h2", 8080, "h2:8080"),
    ]
    assert out["skipped"] == []


def test_a_gateway_on_the_instance_host_uses_the_local_address():
    out = servers({"h1": facts(inst("main", 8080))}, ["h1"], "h1")
    assert out["servers"][0]["address"] == "127.0.0.1"
    assert out["servers"][0]["target"] == "h1:8080"  # Prometheus still gets the advertised address


def test_loopback_instance_on_another_host_is_refused_naming_host_instance_field():
    with pytest.raises(GatewayError) as e:
        servers({"h1": facts(inst("main", 8080, host="127.0.0.1", key=False))}, ["h1"], "gw")
    assert "host h1, instance 'main', field 'host'" in str(e.value)
    assert "cannot reach" in str(e.value)


def test_loopback_instance_on_the_gateway_host_is_fine():
    out = servers({"gw": facts(inst("main", 8080, host="127.0.0.1", key=False))}, ["gw"], "gw")
    assert out["servers"][0]["address"] == "127.0.0.1"


def test_only_the_named_instances():
    published = {"h1": facts(inst("a", 8080), inst("b-0", 8081, config_name="b"), inst("b-1", 8082, config_name="b"))}
    out = servers(published, ["h1"], "gw", instance_names=["b"])
    assert [s["instance"] for s in out["servers"]] == ["b-0", "b-1"]
    with pytest.raises(GatewayError, match="no instance 'c'"):
        servers(published, ["h1"], "gw", instance_names=["c"])


def test_a_fresh_host_without_facts_is_left_out_a_serving_or_unread_one_is_an_error():
    published = {"h1": facts(inst("main", 8080)), "h2": {}}
    states = {"h1": {"serving": True}, "h2": {"serving": False}}
    out = servers(published, ["h1", "h2"], "gw", host_states=states)
    assert [s["host"] for s in out["servers"]] == ["h1"] and out["skipped"] == ["h2"]
    for states in ({"h2": {"serving": True}}, {"h2": {}}, {}):
        with pytest.raises(GatewayError, match="backend host h2 has no llama_server_systemd_facts"):
            servers(published, ["h1", "h2"], "gw", host_states=states)


def test_nothing_to_route_to():
    with pytest.raises(GatewayError, match="llama_gateway_backend_hosts is empty"):
        servers({}, [], "gw")
    with pytest.raises(GatewayError, match="publish no instances"):
        servers({"h1": facts()}, ["h1"], "gw")


def test_ipv6_address_is_bracketed():
    out = servers({"h1": facts(inst("main", 8080, host="fd00::1"))}, ["h1"], "gw")
    assert out["servers"][0]["address"] == "[fd00::1]"


def test_server_name_is_one_spelling():
    assert server_name("llama-1", "main-0") == "llama-1_main-0"


def test_slots_are_the_instances_parallel_unknown_in_older_facts():
    """The gateway's maxconn per server is the instance's slots; facts published before slots existed say None."""
    a, b = inst("main", 8080), inst("big", 8081)
    a["parallel"] = 4
    out = servers({"h1": facts(a, b)}, ["h1"], "gw")
    assert [(s["name"], s["slots"]) for s in out["servers"]] == [("h1_main", 4), ("h1_big", None)]


def test_an_unreachable_host_is_left_out_not_an_error():
    """A host the facts stage could not reach has no facts in this run; the gateway leaves it out (skipped)."""
    published = {"h1": facts(inst("main", 8080)), "h2": None}
    out = servers(published, ["h1", "h2"], "gw", host_states={"h1": {"serving": True}}, unreachable=["h2"])
    assert [s["name"] for s in out["servers"]] == ["h1_main"] and out["skipped"] == ["h2"]
    with pytest.raises(GatewayError):
        servers(published, ["h1", "h2"], "gw", host_states={"h1": {"serving": True}})  # not known: an error
