"""Instances that share a host's CPUs get disjoint whole cores (plugins/module_utils/cpu_cores.py), through
the planner (fleet_instances.plan_host) into the server's arguments and unit drop-in (llama_server_args)."""

from __future__ import annotations

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import cpu_cores as cc
from ansible_collections.llamafleet.mtp.plugins.module_utils import fleet_instances as fi
from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_server_args as la
from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import gguf_info

from tests.harness.gguf import make_models


def topo(nodes=1, cores_per_node=4, smt=1):
    """A host's ``cpus`` fact: logical CPU numbering as Linux does it (siblings numbered after all cores)."""
    out, n_cores = [], nodes * cores_per_node
    for t in range(smt):
        for core in range(n_cores):
            out.append({"cpu": t * n_cores + core, "core": core, "package": core // cores_per_node,
                        "node": core // cores_per_node})  # fmt: skip
    return sorted(out, key=lambda c: c["cpu"])


def test_cpu_list_syntax_both_ways():
    assert cc.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert cc.format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3 8 10-11"
    assert cc.format_cpu_list([5]) == "5" and cc.parse_cpu_list("") == []


def test_read_cpus_from_sysfs(tmp_path):
    """The kernel's files: topology per CPU, NUMA nodes' cpulists; only the allowed CPUs are reported."""
    for c, (core, pkg) in enumerate([(0, 0), (1, 0), (0, 0), (1, 0)]):  # 2 cores with SMT: 0/2 and 1/3
        d = tmp_path / "cpu" / f"cpu{c}" / "topology"
        d.mkdir(parents=True)
        (d / "core_id").write_text(f"{core}\n")
        (d / "physical_package_id").write_text(f"{pkg}\n")
    (tmp_path / "node" / "node0").mkdir(parents=True)
    (tmp_path / "node" / "node0" / "cpulist").write_text("0-3\n")
    cpus = cc.read_cpus(str(tmp_path / "cpu"), str(tmp_path / "node"), allowed=[0, 1, 2])
    assert cpus == [{"cpu": 0, "core": 0, "package": 0, "node": 0}, {"cpu": 1, "core": 1, "package": 0, "node": 0},
                    {"cpu": 2, "core": 0, "package": 0, "node": 0}]  # fmt: skip
    assert [c["cpus"] for c in cc.physical_cores(cpus)] == [[0, 2], [1]]
    assert cc.read_cpus()  # this machine's own


def test_one_instance_alone_keeps_llamacpp_choice():
    assert cc.divide(topo(), [{"name": "a", "cores": None, "node": None}]) == ({}, [])


def test_even_shares_of_whole_cores_with_their_siblings():
    out, problems = cc.divide(topo(cores_per_node=4, smt=2), [{"name": n, "cores": None, "node": None} for n in "ab"])
    assert problems == []
    assert out == {"a": {"cpus": [0, 1, 4, 5], "threads": 2}, "b": {"cpus": [2, 3, 6, 7], "threads": 2}}


def test_pinned_threads_get_that_many_cores_the_rest_share_the_remainder():
    demands = [{"name": "big", "cores": 5, "node": None}, {"name": "s1", "cores": None, "node": None},
               {"name": "s2", "cores": None, "node": None}]  # fmt: skip
    out, problems = cc.divide(topo(cores_per_node=8), demands)
    assert problems == []
    assert {k: v["threads"] for k, v in out.items()} == {"big": 5, "s1": 2, "s2": 1}
    every = [c for v in out.values() for c in v["cpus"]]
    assert len(every) == len(set(every)) == 8  # disjoint, nothing left idle


def test_gpu_instances_run_on_their_gpus_numa_node():
    demands = [{"name": "cpu-a", "cores": None, "node": None}, {"name": "gpu-1", "cores": None, "node": 1},
               {"name": "gpu-0", "cores": None, "node": 0}]  # fmt: skip
    out, _ = cc.divide(topo(nodes=2, cores_per_node=4), demands)
    assert set(out["gpu-1"]["cpus"]) <= {4, 5, 6, 7} and set(out["gpu-0"]["cpus"]) <= {0, 1, 2, 3}
    assert not set(out["cpu-a"]["cpus"]) & (set(out["gpu-0"]["cpus"]) | set(out["gpu-1"]["cpus"]))


def test_oversubscription_is_refused_naming_the_needs():
    demands = [{"name": "a", "cores": 2, "node": None}, {"name": "b", "cores": 1, "node": None}]
    out, problems = cc.divide(topo(cores_per_node=2), demands)
    assert out == {}
    assert "need 3 whole CPU cores (a 2, b 1) and the host has 2" in problems[0]
    assert "allow_oversubscribe: true" in problems[0]


# ------------------------------------------------------------------------------------------------
# through the planner into the server's arguments and drop-in


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return gguf_info(str(make_models.build_model("agree", tmp_path_factory.mktemp("m"), name="t").paths[0]))


CAPS = {"flags": ["--model", "--host", "--port", "--ctx-size", "--parallel", "--cache-type-k", "--cache-type-v",
                  "--spec-type", "--spec-draft-n-max", "--spec-draft-type-k", "--spec-draft-type-v", "--threads",
                  "--threads-batch", "--metrics", "--no-webui"], "mtp_spec_type": "draft-mtp"}  # fmt: skip
SERVED = "/var/lib/llama-models/m/t.gguf"


def plan_and_render(gguf, declared, cpus):
    instances, problems = fi.resolve(declared, host="h1", models=["m"])
    assert problems == []
    out = fi.plan_host(
        host="h1", instances=instances, models={"m": {"gguf": gguf, "path": SERVED}},
        gpu_facts={"count": 0, "gpus": []},
        host_state={"mem_available_bytes": 8 << 30, "instances": {}, "cpus": cpus},
    )  # fmt: skip
    if out["problems"]:
        return out, None
    info = dict(la.model_info_from_gguf(gguf, "id"), paths=[SERVED])
    rendered = la.render(
        out["instances"], capabilities=CAPS, model_info={SERVED: info}, models={"m": {"path": SERVED}},
        plans=out["plan"], binary="/opt/llama.cpp/current/bin/llama-server",
    )  # fmt: skip
    return out, {r["name"]: r for r in rendered}


def flag(args, name):
    return args[args.index(name) + 1] if name in args else None


def test_two_instances_on_one_host_get_disjoint_cores_affinity_and_threads(gguf):
    declared = [{"name": "a", "model": "m", "port": 8080, "context": 1024},
                {"name": "b", "model": "m", "port": 8081, "context": 1024}]  # fmt: skip
    _, r = plan_and_render(gguf, declared, topo(cores_per_node=2))
    assert r["a"]["cpus"] == [0] and r["b"]["cpus"] == [1]
    for name, cpu in (("a", "0"), ("b", "1")):
        assert flag(r[name]["args"], "--threads") == "1" and flag(r[name]["args"], "--threads-batch") == "1"
        assert f"CPUAffinity={cpu}\n" in r[name]["dropin"]


def test_alone_pinned_or_oversubscribing_instances_keep_their_choice(gguf):
    alone = [{"name": "a", "model": "m", "port": 8080, "context": 1024}]
    _, r = plan_and_render(gguf, alone, topo(cores_per_node=2))
    assert r["a"]["cpus"] is None and "--threads" not in r["a"]["args"] and "CPUAffinity" not in r["a"]["dropin"]

    shared = [{"name": "a", "model": "m", "port": 8080, "context": 1024, "threads": 3, "threads_batch": 4},
              {"name": "b", "model": "m", "port": 8081, "context": 1024},
              {"name": "c", "model": "m", "port": 8082, "context": 1024, "allow_oversubscribe": True}]  # fmt: skip
    _, r = plan_and_render(gguf, shared, topo(cores_per_node=4))
    assert r["a"]["cpus"] == [0, 1, 2] and flag(r["a"]["args"], "--threads") == "3"
    assert flag(r["a"]["args"], "--threads-batch") == "4"  # pinned, kept
    assert r["b"]["cpus"] == [3] and flag(r["b"]["args"], "--threads") == "1"
    assert r["c"]["cpus"] is None and "--threads" not in r["c"]["args"]


def test_a_host_without_enough_cores_is_refused_before_any_change(gguf):
    declared = [{"name": n, "model": "m", "port": 8080 + i, "context": 1024} for i, n in enumerate("abc")]
    out, _ = plan_and_render(gguf, declared, topo(cores_per_node=2))
    assert len(out["problems"]) == 1 and out["problems"][0].startswith("host h1: the instances need 3 whole CPU cores")


def test_an_instance_alone_on_a_confined_host_gets_threads_for_the_cores_it_has():
    """A container's cpuset (or a systemd slice): llama.cpp would count the machine's 8 cores for 2 it may use."""
    confined = [c for c in topo(cores_per_node=8) if c["cpu"] in (2, 3)]
    out, problems = cc.divide(confined, [{"name": "a", "cores": None, "node": None}], cores_online=8)
    assert problems == [] and out == {"a": {"cpus": [2, 3], "threads": 2}}
    assert cc.divide(topo(cores_per_node=8), [{"name": "a", "cores": None, "node": None}], cores_online=8) == ({}, [])
    assert cc.cores_online() >= 1  # this machine's
