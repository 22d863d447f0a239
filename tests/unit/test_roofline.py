"""Roofline logic (module_utils.roofline), the sweep helpers (module_utils.llama_bench) and the
mem_bandwidth module's CPU measurement run for real on this machine (a few seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_bench as lb
from ansible_collections.llamafleet.mtp.plugins.module_utils import roofline as rl

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "gbs"),
    [
        ("NVIDIA H200", 4800),
        ("NVIDIA H100 80GB HBM3", 3350),
        ("NVIDIA H100 PCIe", 2000),
        ("NVIDIA A100-SXM4-80GB", 2039),
        ("NVIDIA A100 80GB PCIe", 1935),
        ("NVIDIA A100-PCIE-40GB", 1555),
        ("Tesla V100-SXM2-32GB", 900),
        ("NVIDIA GeForce RTX 3090", 936),
        ("NVIDIA GeForce RTX 3090 Ti", 1008),
        ("NVIDIA GeForce RTX 4090", 1008),
        ("NVIDIA L40S", 864),
        ("NVIDIA L4", 300),
        ("NVIDIA RTX 6000 Ada Generation", 960),
        ("Some Future GPU", None),
    ],
)
def test_gpu_spec_lookup_by_nvidia_smi_name(name, gbs):
    assert rl.gpu_bandwidth_spec(name) == (None if gbs is None else gbs * 10**9)


def test_gpus_bandwidth_picks_the_instance_gpus_and_names_unknown_ones():
    gpus = [
        {"index": 0, "name": "NVIDIA H200"},
        {"index": 1, "name": "Tesla V100-SXM2-16GB"},
        {"index": 2, "name": "X"},
    ]
    assert rl.gpus_bandwidth(gpus, [0]) == {"bytes_per_s": 4800 * 10**9, "source": "spec (NVIDIA H200)", "unknown": []}
    assert rl.gpus_bandwidth(gpus, [0, 1])["bytes_per_s"] == 900 * 10**9  # the slowest of a layer split
    assert rl.gpus_bandwidth(gpus, [1, 2]) == {"bytes_per_s": None, "source": None, "unknown": ["X"]}
    with pytest.raises(rl.RooflineError, match="no GPU among"):
        rl.gpus_bandwidth(gpus, [7])


def test_buffer_size():  # (the cpulist syntax: module_utils/cpu_cores.py, tests/unit/test_cpu_cores.py)
    assert rl.buffer_mib(2, 300 * 2**20) == 600  # 4 x LLC over 2 CPUs
    assert rl.buffer_mib(64, 32 * 2**20) == 128  # at least 128 MiB
    assert rl.buffer_mib(1, 1 << 30) == 1024  # at most 1 GiB


def test_node_cpus_and_physical_cores_from_sysfs(tmp_path):
    node = tmp_path / "node" / "node0"
    node.mkdir(parents=True)
    allowed = sorted(os.sched_getaffinity(0))
    (node / "cpulist").write_text(f"{allowed[0]}-{allowed[-1]}\n")
    assert rl.node_cpus(0, str(tmp_path / "node")) == allowed
    with pytest.raises(rl.RooflineError, match="NUMA node 3: cannot read"):
        rl.node_cpus(3, str(tmp_path / "node"))
    cpu = tmp_path / "cpu"
    for c, core in ((0, 0), (1, 0), (2, 1), (3, 1)):  # 2 cores with 2 SMT threads each
        topo = cpu / f"cpu{c}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
    assert rl.physical_cores([0, 1, 2, 3], str(cpu)) == 2
    assert rl.physical_cores([0, 2], str(cpu)) == 2
    assert rl.physical_cores([0, 1], str(cpu)) == 1


def _row(label, tok_s, n=None, tokens=100, drafted=0, accepted=0):
    return {
        "label": label,
        "mtp": n is not None,
        "draft_n_max": n,
        "tok_s_median": tok_s,
        "tokens": tokens,
        "draft_tokens": drafted,
        "draft_accepted": accepted,
    }


def test_roofline_plain_and_mtp_rows():
    db = {"token": 10 * 10**9, "mtp_draft": 1 * 10**9}
    plain = rl.roofline(_row("no-mtp", 30.0), db, 900 * 10**9)
    assert plain["roofline_tok_s"] == 90.0
    assert plain["efficiency_pct"] == pytest.approx(100 * 30 * 10 / 900, abs=0.1)
    assert plain["bytes_per_token"] == 10 * 10**9
    # 100 tokens, 90 drafted, 60 accepted: 40 verify cycles x 10 GB + 90 drafts x 1 GB = 490 GB / 100 tokens
    mtp = rl.roofline(_row("mtp-n3", 47.0, 3, tokens=100, drafted=90, accepted=60), db, 900 * 10**9)
    assert mtp["bytes_per_token"] == int(4.9e9)
    assert mtp["step_bytes"] == 11 * 10**9
    assert mtp["efficiency_pct"] == pytest.approx(100 * 47 * 4.9 / 900, abs=0.1)
    # no bandwidth: columns present, efficiency unknown
    assert rl.roofline(_row("no-mtp", 30.0), db, None)["efficiency_pct"] is None
    with pytest.raises(rl.RooflineError, match="decode_bytes"):
        rl.roofline(_row("no-mtp", 30.0), {}, 1)


def test_add_roofline_and_table_columns():
    rows = [_row("no-mtp", 30.0), _row("mtp-n2", 45.0, 2, drafted=80, accepted=60)]
    for r in rows:
        r.update(tok_s_min=r["tok_s_median"], tok_s_max=r["tok_s_median"], acceptance=None, runs=3)
    res = rl.add_roofline(lb.compare(rows), {"token": 10**10, "mtp_draft": 10**9}, 9 * 10**11, "spec (Tesla V100)")
    assert res["efficiency_pct"] == res["rows"][0]["efficiency_pct"] == pytest.approx(33.3, abs=0.1)
    lines = lb.table(res)
    assert "eff %" in lines[0] and "33.3" in lines[1]
    assert lines[-1].startswith("bandwidth: 900.0 GB/s (spec (Tesla V100)); decode step reads 10000.0 MB")
    assert "MB/token" not in lb.table(lb.compare([dict(r) for r in rows]))[0]  # without the roofline: as before


def test_sweep_configs_per_kind():
    cpu = lb.sweep_configs("cpu", physical_cores=8, logical_cpus=16)
    labels = [c["label"] for c in cpu]
    assert labels[0] == "default" and cpu[0]["settings"] == {}
    assert labels[1:] == ["t8-tb8", "t8-tb16", "t16-tb16", "t7-tb7", "t7-tb16", "t4-tb4", "t4-tb16"]
    assert [c["label"] for c in lb.sweep_configs("cpu", 2, 2)] == ["default", "t2-tb2", "t1-tb1", "t1-tb2"]
    # llama.cpp's own choice without the flags is the default measured again; nothing else is
    assert [c["label"] for c in cpu if c.get("same_as") == "default"] == ["t8-tb8"]
    gpu = [c["label"] for c in lb.sweep_configs("gpu", gpu_count=1)]
    assert gpu == ["default", "fa-on", "fa-off", "ub256", "ub1024"]
    assert "split-row" in [c["label"] for c in lb.sweep_configs("gpu", gpu_count=2)]
    with pytest.raises(lb.BenchError, match="unknown host kind"):
        lb.sweep_configs("tpu")


def test_sweep_gap():
    rows = [_row("default", 10.0), _row("t1-tb1", 6.0), _row("t2-tb2", 10.4), _row("default", 10.2)]
    g = lb.sweep_gap(rows, "default")
    assert g["default"]["tok_s"] == 10.1 and g["best"] == {"label": "t2-tb2", "tok_s": 10.4}
    assert g["gap_pct"] == pytest.approx(2.9, abs=0.05) and g["within_5pct"]
    g = lb.sweep_gap([_row("default", 8.0), _row("fa-on", 10.0)], "default")
    assert g["gap_pct"] == 20.0 and not g["within_5pct"]
    assert lb.sweep_gap([_row("default", 8.0), _row("x", 7.0)], "default")["gap_pct"] == 0.0
    with pytest.raises(lb.BenchError, match="no row 'default'"):
        lb.sweep_gap([_row("x", 1.0)], "default")


def test_sweep_gap_pools_the_default_measured_again():
    """llama.cpp's own thread count measured explicitly is the default: its noise is not a gap (both ways)."""
    configs = lb.sweep_configs("cpu", 2, 2)
    rows = [_row("default", 3.87), _row("t2-tb2", 3.50), _row("t1-tb1", 2.07), _row("t1-tb2", 2.12)]
    g = lb.sweep_gap(rows, "default", configs)
    assert g["best"]["label"] == "default" and g["gap_pct"] == 0.0 and g["default"]["same_as_default"] == ["t2-tb2"]
    assert g["default"]["runs"] == [3.87, 3.50] and g["spread_pct"] == pytest.approx(9.6, abs=0.05)
    assert "t2-tb2" not in g["configs"]
    # without the configs the same rows read as a rival (the old report): 3.87 against 3.50 is no gap...
    rows = [_row("default", 10.83), _row("t2-tb2", 12.5), _row("t1-tb2", 10.59)]
    assert lb.sweep_gap(rows, "default")["gap_pct"] == 13.4
    # ...and with them the default is its median, against the best other configuration
    g = lb.sweep_gap(rows, "default", configs)
    assert g["default"]["tok_s"] == pytest.approx(11.665, abs=0.01)
    assert g["best"]["label"] == "default" and g["gap_pct"] == 0.0
    # a faster rival still shows
    g = lb.sweep_gap(rows + [_row("t1-tb1", 14.0)], "default", configs)
    assert g["best"]["label"] == "t1-tb1" and g["gap_pct"] == pytest.approx(16.7, abs=0.05) and not g["within_5pct"]


def test_cpu_measurement_is_real_and_in_a_memory_range():
    """The measurement on this machine: positive, below 1 TB/s (not a cache or zero-page artefact)."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    m = rl.measure_cpu_bandwidth(cpus, size_mib=128, iters=1, rounds=1)
    for k in ("copy_bytes_per_s", "read_bytes_per_s"):
        assert 10**8 < m[k] < 10**12
    assert m["cpus"] == cpus


def test_mem_bandwidth_module_gpu_and_cpu(tmp_path):
    """ansible localhost -m llamafleet.mtp.mem_bandwidth: a GPU instance gets the spec figure, a CPU one is measured."""
    ansible = str(Path(sys.executable).parent / "ansible")
    gpus = json.dumps({"gpus": [{"index": 0, "name": "NVIDIA H200"}], "devices": [0]})
    out = subprocess.run(
        [ansible, "localhost", "-m", "llamafleet.mtp.mem_bandwidth", "-a", gpus, "-o"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert '"bytes_per_s": 4800000000000' in out.stdout and '"source": "spec (NVIDIA H200)"' in out.stdout, out.stdout
    out = subprocess.run(
        [
            ansible,
            "localhost",
            "-m",
            "llamafleet.mtp.mem_bandwidth",
            "-a",
            json.dumps({"buffer_mib": 128, "rounds": 1}),
            "-o",
            "--check",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert "SUCCESS" in out.stdout and '"kind": "cpu"' in out.stdout and '"physical_cores"' in out.stdout, out.stdout
    bw = json.loads(out.stdout.split("=>", 1)[1])["bandwidth"]
    assert bw["bytes_per_s"] == max(bw["cpu"]["read_bytes_per_s"], bw["cpu"]["single_cpu_read_bytes_per_s"]) > 10**8


def test_sweep_filter_takes_the_configs():
    """bench.yml's call: rows | llama_bench_sweep('default', bench_sweep_configs), as the filter plugin gets it."""
    from ansible_collections.llamafleet.mtp.plugins.filter.llama_bench import FilterModule

    f = FilterModule().filters()
    configs = f["llama_bench_sweep_configs"]("cpu", 2, 2, 0)
    rows = [_row("default", 3.87), _row("t2-tb2", 4.1), _row("t1-tb1", 2.07)]
    g = f["llama_bench_sweep"](rows, "default", configs)
    assert g["best"]["label"] == "default" and g["gap_pct"] == 0.0 and g["default"]["runs"] == [3.87, 4.1]
    assert f["llama_bench_sweep"](rows, "default")["best"]["label"] == "t2-tb2"  # without configs: as before
