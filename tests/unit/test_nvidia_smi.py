"""nvidia-smi parsing: every real capture, synthetic edge cases, and the stand-in's profiles."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import nvidia_smi as ns
from ansible_collections.llamafleet.mtp.plugins.module_utils.nvidia_smi import (
    GpuError,
    NoDevicesError,
    NvmlError,
    ParseError,
    UnsupportedFieldError,
    parse_list,
    parse_query,
    parse_table,
    parse_topology,
)
from nvsmi_profiles import PROFILES_DIR, REPO, STANDIN, facts_from_profile, profile_names, standin_runner

CAPTURE_DIR = REPO / "tests" / "fixtures" / "nvidia-smi"
CAPTURES = sorted(p.name for p in CAPTURE_DIR.glob("*.txt"))


def read(name: str) -> str:
    return (CAPTURE_DIR / name).read_text()


def kind_of(name: str) -> str:
    m = re.search(r"\.(topo|query|table|mig|list)\.txt$", name)
    assert m, f"{name}: capture names end in .topo/.query/.table/.mig/.list.txt (see SOURCES.md)"
    return m.group(1)


# ---------------------------------------------------------------- every capture


def test_captures_are_there():
    assert len(CAPTURES) >= 14
    assert {kind_of(n) for n in CAPTURES} == {"topo", "query", "table", "mig", "list"}


@pytest.mark.parametrize("name", CAPTURES)
def test_every_capture_parses(name):
    text = read(name)
    kind = kind_of(name)
    if kind == "topo":
        topo = parse_topology(text)
        n = len(topo["matrix"])
        assert n >= 1
        for i in range(n):
            assert topo["matrix"][i][i] == "X"
            for j in range(n):
                assert topo["matrix"][i][j] == topo["matrix"][j][i], (i, j)
        for group in topo["nvlink_groups"]:
            assert all(topo["matrix"][a][b].startswith("NV") for a in group for b in group if a != b)
        assert len(topo["affinity"]) == n
    elif kind == "query":
        query = parse_query(text)
        assert [g["index"] for g in query["gpus"]] == list(range(len(query["gpus"])))
        assert all(g["healthy"] and g["name"] and g["memory_total_mib"] > 0 for g in query["gpus"])
        assert query["driver_version"]
    elif kind == "list":
        gpus = parse_list(text)
        assert gpus and all(g["healthy"] and g["uuid"].startswith("GPU-") for g in gpus)
    else:
        table = parse_table(text)
        assert table["gpus"] and table["driver_version"] and table["cuda_version"]
        assert [g["index"] for g in table["gpus"]] == list(range(len(table["gpus"])))
        for g in table["gpus"]:
            assert 0 <= g["memory_used_mib"] <= g["memory_total_mib"]
            assert g["healthy"]


def test_uts_v100_topology_two_sockets():
    topo = parse_topology(read("uts-2x-v100-pcie32.topo.txt"))
    assert topo["matrix"] == [["X", "SYS"], ["SYS", "X"]]
    assert topo["nvlink_groups"] == []
    assert topo["affinity"] == [
        {"cpu_affinity": "0,2,4,6,8,10", "numa_node": 0},
        {"cpu_affinity": "1,3,5,7,9,11", "numa_node": 1},
    ]


def test_uts_v100_query_with_header_and_units():
    query = parse_query(read("uts-2x-v100-pcie32.query.txt"))
    assert query["driver_version"] == "570.144"
    assert len(query["gpus"]) == 2
    for g in query["gpus"]:
        assert g["name"] == "Tesla V100-PCIE-32GB"
        assert g["memory_total_mib"] == 32768
        assert g["compute_capability"] == "7.0"
        assert g["mig_mode"] is None  # [N/A]
        assert g["memory_free_mib"] is None  # not in this capture's columns


def test_cn5900x_rtx3090_nvlink_bridge():
    topo = parse_topology(read("cn5900x-2x-rtx3090-nvlink.topo.txt"))
    assert topo["matrix"] == [["X", "NV4"], ["NV4", "X"]]
    assert topo["nvlink_groups"] == [[0, 1]]
    assert [a["cpu_affinity"] for a in topo["affinity"]] == ["0-23", "0-23"]
    assert [a["numa_node"] for a in topo["affinity"]] == [0, 0]


def test_jtkj003_a100_nvswitch_with_nics():
    topo = parse_topology(read("jtkj003-8x-a100-nvswitch-nv12.topo.txt"))
    assert len(topo["matrix"]) == 8
    assert topo["columns"][8:] == ["NIC0", "NIC1", "NIC2", "NIC3"]
    assert all(topo["matrix"][i][j] == "NV12" for i in range(8) for j in range(8) if i != j)
    assert topo["nvlink_groups"] == [list(range(8))]
    assert [a["numa_node"] for a in topo["affinity"]] == [0] * 4 + [1] * 4
    assert topo["affinity"][4]["cpu_affinity"] == "32-63,96-127"


def test_noderecord_h200_nvswitch_and_query():
    topo = parse_topology(read("noderecord-8x-h200-nvswitch.topo.txt"))
    assert len(topo["columns"]) == 16
    assert topo["matrix"][3][5] == "NV18"
    assert topo["nvlink_groups"] == [list(range(8))]
    assert topo["affinity"][7] == {"cpu_affinity": "64-127,192-255", "numa_node": 1}
    query = parse_query(read("noderecord-8x-h200.query.txt"))
    assert query["driver_version"] == "570.211.01"
    assert [g["memory_total_mib"] for g in query["gpus"]] == [143771] * 8
    assert {g["name"] for g in query["gpus"]} == {"NVIDIA H200"}


def test_busy_table_memory():
    table = parse_table(read("cn5900x-2x-rtx3090-nvlink-busy.table.txt"))
    assert (table["driver_version"], table["cuda_version"]) == ("560.35.05", "12.6")
    assert [g["pci_bus_id"] for g in table["gpus"]] == ["00000000:09:00.0", "00000000:0A:00.0"]
    assert [(g["memory_used_mib"], g["memory_total_mib"]) for g in table["gpus"]] == [(22943, 24576)] * 2
    assert table["mig_devices"] == []


def test_idle_table():
    table = parse_table(read("thamada-2x-rtx3090-idle.table.txt"))
    assert (table["nvidia_smi_version"], table["cuda_version"]) == ("560.35.03", "12.6")
    assert [g["memory_used_mib"] for g in table["gpus"]] == [2, 2]
    assert table["gpus"][1]["name"] == "NVIDIA GeForce RTX 3090"
    assert table["gpus"][1]["persistence_mode"] == "On"


def test_mig_table():
    table = parse_table(read("ceems-2x-a100-pcie40-mig-gpu0only.mig.txt"))
    assert table["cuda_version"] == "12.2"
    assert [g["mig_mode"] for g in table["gpus"]] == ["Enabled", "Disabled"]
    assert [g["memory_used_mib"] for g in table["gpus"]] == [50, 4]
    assert [(m["gpu"], m["gi"], m["mig_dev"]) for m in table["mig_devices"]] == [
        (0, 3, 0),
        (0, 4, 1),
        (0, 5, 2),
        (0, 6, 3),
    ]
    assert {m["memory_total_mib"] for m in table["mig_devices"]} == {9856}


def test_lentvm_h200_driver_580_captures():
    topo = parse_topology(read("lentvm-1x-h200.topo.txt"))  # header wrapped in ESC[4m ... ESC[0m
    assert "\x1b[4m" in read("lentvm-1x-h200.topo.txt")
    assert topo["matrix"] == [["X"]] and topo["affinity"] == [{"cpu_affinity": "0-15", "numa_node": 0}]
    query = parse_query(read("lentvm-1x-h200.query.txt"))  # header, units, trailing memory.reserved
    g = query["gpus"][0]
    assert (g["memory_total_mib"], g["memory_used_mib"], g["memory_free_mib"]) == (143771, 0, 143156)
    assert (g["compute_capability"], g["mig_mode"], g["pci_bus_id"]) == ("9.0", "Disabled", "00000000:00:06.0")
    assert query["driver_version"] == "580.159.04"
    table = parse_table(read("lentvm-1x-h200.table.txt"))
    assert (table["driver_version"], table["cuda_version"]) == ("580.159.04", "13.0")
    assert table["gpus"][0]["mig_mode"] == "Disabled" and table["gpus"][0]["memory_total_mib"] == 143771
    assert parse_list(read("lentvm-1x-h200.list.txt"))[0]["uuid"] == g["uuid"]
    module_line = parse_query(read("lentvm-b-1x-h200-module-nounits.query.txt"))  # the module's exact query
    other = module_line["gpus"][0]
    assert other["uuid"] != g["uuid"]
    assert (other["name"], other["memory_free_mib"], other["compute_capability"]) == ("NVIDIA H200", 143156, "9.0")


# ---------------------------------------------------------------- topo -m edge cases


def test_topo_ansi_colour_codes():
    plain = read("cn5900x-2x-rtx3090-nvlink.topo.txt")
    coloured = plain.replace("NV4", "\x1b[32mNV4\x1b[0m").replace("GPU0\t", "\x1b[1mGPU0\x1b[0m\t")
    assert coloured != plain
    assert parse_topology(coloured) == parse_topology(plain)


@pytest.mark.parametrize(
    "name",
    ["jtkj003-8x-a100-nvswitch-nv12.topo.txt", "noderecord-8x-h200-nvswitch.topo.txt", "uts-2x-v100-pcie32.topo.txt"],
)
def test_topo_spaces_instead_of_tabs(name):
    tabs = read(name)
    spaces = tabs.expandtabs(8)
    assert "\t" not in spaces
    a, b = parse_topology(tabs), parse_topology(spaces)
    assert (a["matrix"], a["affinity"], a["nvlink_groups"]) == (b["matrix"], b["affinity"], b["nvlink_groups"])


def test_topo_empty_affinity_columns_and_na_numa():
    text = (
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tPHB\tPIX\t\t\t\tN/A\n"
        "GPU1\tPHB\t X \tPXB\t0-7\tN/A\t\tN/A\n"
        "GPU2\tPIX\tPXB\t X \t0-7\t0\t\t3\n"
        "\nLegend:\n\n  X    = Self\n"
    )
    topo = parse_topology(text)
    assert topo["matrix"][0] == ["X", "PHB", "PIX"]
    assert topo["affinity"] == [
        {"cpu_affinity": None, "numa_node": None},
        {"cpu_affinity": "0-7", "numa_node": None},
        {"cpu_affinity": "0-7", "numa_node": 0},  # GPU NUMA ID (3) is a later column, not NUMA affinity
    ]
    assert topo["nvlink_groups"] == []


def test_topo_older_driver_nic_named_by_device_no_numa_column():
    text = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\n"
        "GPU0\t X \tNV2\tPHB\t0-11\n"
        "GPU1\tNV2\t X \tPHB\t0-11\n"
        "mlx5_0\tPHB\tPHB\t X \t\n"
        "\nLegend:\n"
    )
    topo = parse_topology(text)
    assert topo["matrix"] == [["X", "NV2"], ["NV2", "X"]]
    assert topo["affinity"][1] == {"cpu_affinity": "0-11", "numa_node": None}


def test_nvlink_groups_are_components_not_cliques():
    matrix = [
        ["X", "NV2", "SYS", "SYS", "SYS"],
        ["NV2", "X", "NV1", "SYS", "SYS"],
        ["SYS", "NV1", "X", "SYS", "SYS"],
        ["SYS", "SYS", "SYS", "X", "NV4"],
        ["SYS", "SYS", "SYS", "NV4", "X"],
    ]
    assert ns.nvlink_groups(matrix) == [[0, 1, 2], [3, 4]]
    assert ns.nvlink_groups([["X"]]) == []


def test_topo_garbage_and_misaligned_rows():
    with pytest.raises(ParseError) as e:
        parse_topology("hello\nworld\n")
    assert e.value.text == "hello\nworld\n"
    head = "\tGPU0\tGPU1\tCPU Affinity\n"
    with pytest.raises(ParseError, match="row GPU1") as e:
        parse_topology(head + "GPU0\t X \tNV4\t0-23\nGPU1\t0-23\n")
    assert e.value.text == "GPU1\t0-23"
    with pytest.raises(ParseError, match="row GPU1"):
        parse_topology(head + "GPU0\t X \tNV4\t0-23\nGPU1\tNV4\t0-23\t0\n")
    with pytest.raises(ParseError, match="not 'X'"):
        parse_topology(head + "GPU0\tSYS\tNV4\t0-23\nGPU1\tNV4\t X \t0-23\n")
    with pytest.raises(ParseError, match="GPU rows"):
        parse_topology(head + "GPU0\t X \tNV4\t0-23\n")


# ---------------------------------------------------------------- --query-gpu edge cases

ROW0 = "0, GPU-aaaa, Tesla V100-PCIE-32GB, 00000000:3B:00.0, 32768, 4, 32764, 7.0, [N/A], 535.104.05"
ROW1 = "1, GPU-bbbb, Tesla V100-PCIE-32GB, 00000000:D8:00.0, 32768, 0, 32768, 7.0, [N/A], 535.104.05"


def test_query_nounits_noheader():
    q = parse_query(ROW0 + "\n" + ROW1 + "\n")
    g = q["gpus"][0]
    assert q["driver_version"] == "535.104.05"
    assert (g["uuid"], g["pci_bus_id"], g["memory_used_mib"], g["memory_free_mib"]) == (
        "GPU-aaaa",
        "00000000:3B:00.0",
        4,
        32764,
    )
    assert g["healthy"] and g["error"] is None and g["mig_mode"] is None


def test_query_units_and_header_equal_nounits():
    header = (
        "index, uuid, name, pci.bus_id, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
        "compute_cap, mig.mode.current, driver_version"
    )
    with_units = "\n".join([header, ROW0.replace("32768,", "32768 MiB,").replace(", 4,", ", 4 MiB,"), ROW1])
    assert parse_query(with_units) == parse_query(ROW0 + "\n" + ROW1)


def test_query_whitespace_crlf_trailing_columns_not_supported():
    text = "  " + ROW0.replace("[N/A]", "[Not Supported]") + " , P0, 250.00 W\r\n\r\n" + ROW1 + ",extra\r\n"
    q = parse_query(text)
    assert [g["index"] for g in q["gpus"]] == [0, 1]
    assert q["gpus"][0]["mig_mode"] is None
    assert q["gpus"][1]["memory_free_mib"] == 32768


def test_query_skips_warning_lines():
    q = parse_query("WARNING: infoROM is corrupted at gpu 0000:3B:00.0\n" + ROW0 + "\n" + ROW1 + "\n")
    assert [g["index"] for g in q["gpus"]] == [0, 1] and q["gpus"][0]["healthy"]


def test_query_mig_enabled_and_legacy_fields():
    row = "0, GPU-x, NVIDIA A100-PCIE-40GB, 00000000:21:00.0, 40960, 50, 40910, Enabled, 470.82.01"
    g = parse_query(row, ns.LEGACY_QUERY_FIELDS)["gpus"][0]
    assert g["mig_mode"] == "Enabled" and g["compute_capability"] is None


@pytest.mark.parametrize("words", ["[Unknown Error]", "[GPU requires reset]", "[GPU is lost]"])
def test_query_gpu_error_in_a_field(words):
    q = parse_query(ROW0 + "\n" + ROW1.replace(", 0, 32768,", f", {words}, {words},"))
    assert q["gpus"][0]["healthy"]
    bad = q["gpus"][1]
    assert bad["healthy"] is False
    assert bad["error"] == f"memory.used: {words}; memory.free: {words}"
    assert bad["memory_used_mib"] is None and bad["memory_total_mib"] == 32768


def test_query_unbracketed_error_words():
    q = parse_query(ROW0.replace("7.0", "Unknown Error"))
    assert q["gpus"][0]["healthy"] is False and q["gpus"][0]["error"] == "compute_cap: Unknown Error"
    assert q["gpus"][0]["compute_capability"] is None


def test_query_device_handle_error_line_takes_its_place():
    lost = "Unable to determine the device handle for GPU0000:5E:00.0: Unknown Error"
    row2 = ROW1.replace("1, GPU-bbbb", "2, GPU-cccc")
    q = parse_query("\n".join([ROW0, lost, row2]))
    assert [g["index"] for g in q["gpus"]] == [0, 1, 2]
    assert q["gpus"][1]["pci_bus_id"] == "00000000:5E:00.0"
    assert q["gpus"][1]["healthy"] is False and q["gpus"][1]["error"] == lost


@pytest.mark.parametrize(
    "text, words",
    [
        ("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.154\n", "mismatch"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
            "latest NVIDIA driver is installed and running.\n",
            "couldn't communicate",
        ),
        ("Failed to initialize NVML: Unknown Error\n", "Failed to initialize NVML: Unknown Error"),
    ],
)
def test_nvml_failures(text, words):
    for parse in (parse_query, parse_topology, parse_table, parse_list):
        with pytest.raises(NvmlError) as e:
            parse(text)
        assert words in str(e.value)


def test_no_devices_and_unsupported_field():
    with pytest.raises(NoDevicesError, match="No devices were found"):
        parse_query("No devices were found\n")
    with pytest.raises(UnsupportedFieldError) as e:
        parse_query('Field "compute_cap" is not a valid field to query.\n\n')
    assert e.value.field == "compute_cap"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("garbage\n", "found 1"),
        (ROW0.replace("32768, 4", "32768, lots"), "memory.used"),
        (ROW0.replace("7.0", "seven"), "compute_cap"),
        (ROW0.replace("0, GPU-aaaa", "zero, GPU-aaaa"), "index"),
        (ROW0.replace("[N/A]", "Maybe"), "mig.mode"),
    ],
)
def test_query_garbage_is_a_parse_error_with_the_text(text, fragment):
    with pytest.raises(ParseError, match=fragment) as e:
        parse_query(text)
    assert e.value.text.strip() == text.strip()


# ---------------------------------------------------------------- table and -L edge cases

OLD_TABLE = """\
+------------------------------------------------------+
| NVIDIA-SMI 331.62     Driver Version: 331.62         |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|===============================+======================+======================|
|   0  GeForce GTX 680     Off  | 0000:03:00.0     N/A |                  N/A |
| 30%   35C  N/A     N/A /  N/A |      9MiB /  4095MiB |     N/A      Default |
+-------------------------------+----------------------+----------------------+
"""


def test_old_two_line_table_without_cuda_version():
    table = parse_table(OLD_TABLE)
    assert table["cuda_version"] is None and table["driver_version"] == "331.62"
    g = table["gpus"][0]
    assert (g["name"], g["pci_bus_id"], g["memory_used_mib"], g["memory_total_mib"], g["mig_mode"]) == (
        "GeForce GTX 680",
        "00000000:03:00.0",
        9,
        4095,
        None,
    )


def test_table_err_marks_gpu_unhealthy():
    text = read("thamada-2x-rtx3090-idle.table.txt").replace("| 30%   29C", "|ERR!   29C")
    table = parse_table(text)
    assert [g["healthy"] for g in table["gpus"]] == [True, False]
    assert table["gpus"][1]["error"] == "ERR!"


def test_table_garbage():
    with pytest.raises(ParseError, match="NVIDIA-SMI"):
        parse_table("+----+\n| hello |\n")


def test_list_gpus_and_mig_devices():
    text = (
        "GPU 0: NVIDIA A100-PCIE-40GB (UUID: GPU-5a3c8ac6-1f3c-4f2b-9a7e-0c1d2e3f4a5b)\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-9d1b2c3e-aaaa-5bbb-8ccc-0123456789ab)\n"
        "  MIG 1g.5gb Device 1: (UUID: MIG-GPU-5a3c8ac6-1f3c-4f2b-9a7e-0c1d2e3f4a5b/7/0)\n"
        "GPU 1: NVIDIA A100-PCIE-40GB (UUID: GPU-0f9e8d7c-6b5a-4f3e-8d2c-1b0a9f8e7d6c)\n"
        "Unable to determine the device handle for GPU 0000:C1:00.0: GPU is lost.  Reboot the system to recover\n"
    )
    gpus = parse_list(text)
    assert [g["index"] for g in gpus] == [0, 1, 2]
    assert [m["profile"] for m in gpus[0]["mig_devices"]] == ["3g.20gb", "1g.5gb"]
    assert gpus[0]["mig_devices"][1]["uuid"].endswith("/7/0")
    assert gpus[1]["mig_devices"] == [] and gpus[1]["uuid"].startswith("GPU-0f9e")
    assert gpus[2]["healthy"] is False and "GPU is lost" in gpus[2]["error"]
    with pytest.raises(ParseError):
        parse_list("GPU zero: ???\n")


# ---------------------------------------------------------------- stand-in and profiles

PROFILES = profile_names()


def load(name: str) -> dict:
    return json.loads((PROFILES_DIR / f"{name}.json").read_text())


def test_required_profiles_exist():
    needed = {
        "uts-2x-v100-pcie32",
        "cn5900x-2x-rtx3090-nvlink-busy",
        "cn5900x-2x-rtx3090-nvlink-idle",
        "noderecord-8x-h200-nvswitch",
        "jtkj003-8x-a100-sxm4-nvswitch",
        "ceems-2x-a100-pcie40-mig",
        "seed-2x-v100-pcie16",
        "seed-1x-v100-pcie16",
        "seed-1x-rtx3090",
        "seed-1x-rtx4090",
        "lentvm-1x-h200",
    }
    assert needed <= set(PROFILES)


@pytest.mark.parametrize("name", PROFILES)
def test_profile_matches_its_captures(name):
    profile = load(name)
    assert profile["_notes"], "say what was filled"
    for key in ("topo", "table"):
        source = profile["_sources"].get(key)
        if source and source != "synthesized":
            assert profile[key] == read(source), f"{key} must be the capture verbatim"
    if "query" in profile["_sources"]:
        captured = parse_query(read(profile["_sources"]["query"]))
        assert profile["driver_version"] == captured["driver_version"]
        pairs = (
            ("name", "name"),
            ("uuid", "uuid"),
            ("pci.bus_id", "pci_bus_id"),
            ("memory.total", "memory_total_mib"),
            ("memory.used", "memory_used_mib"),
            ("memory.free", "memory_free_mib"),
            ("compute_cap", "compute_capability"),
        )
        assert len(profile["gpus"]) == len(captured["gpus"])
        for got, cap in zip(profile["gpus"], captured["gpus"]):
            for raw_key, fact_key in pairs:
                if cap[fact_key] is not None:
                    assert got[raw_key] == cap[fact_key], raw_key


@pytest.mark.parametrize("name", PROFILES)
def test_profile_through_standin_and_parser(name):
    profile = load(name)
    facts = facts_from_profile(PROFILES_DIR / f"{name}.json")
    assert facts["source"] == "nvidia-smi"
    assert facts["count"] == len(profile["gpus"])
    assert facts["driver_version"] == profile["driver_version"]
    assert facts["cuda_driver_version"] == profile["cuda_version"]
    assert len(facts["gpus"]) == len(profile["gpus"])
    for fact, raw in zip(facts["gpus"], profile["gpus"]):
        assert fact["index"] == raw["index"] and fact["uuid"] == raw["uuid"] and fact["healthy"]
        assert (fact["memory_total_mib"], fact["memory_used_mib"], fact["memory_free_mib"]) == (
            raw["memory.total"],
            raw["memory.used"],
            raw["memory.free"],
        )
        assert fact["compute_capability"] == raw["compute_cap"]
    topo = parse_topology(profile["topo"])
    assert facts["topology"]["matrix"] == topo["matrix"]
    assert [(g["cpu_affinity"], g["numa_node"]) for g in facts["gpus"]] == [
        (a["cpu_affinity"], a["numa_node"]) for a in topo["affinity"]
    ]
    # The table the stand-in prints (verbatim capture or rendered) agrees with the query.
    rc, out, _ = standin_runner(PROFILES_DIR / f"{name}.json")([str(STANDIN)])
    assert rc == 0
    table = parse_table(out)
    assert [(g["pci_bus_id"], g["memory_used_mib"], g["memory_total_mib"]) for g in table["gpus"]] == [
        (g["pci_bus_id"], g["memory_used_mib"], g["memory_total_mib"]) for g in facts["gpus"]
    ]


def test_profile_facts_read_from_captures():
    busy = facts_from_profile(PROFILES_DIR / "cn5900x-2x-rtx3090-nvlink-busy.json")
    assert [g["memory_free_mib"] for g in busy["gpus"]] == [24576 - 22943] * 2
    assert busy["topology"]["nvlink_groups"] == [[0, 1]]
    idle = facts_from_profile(PROFILES_DIR / "cn5900x-2x-rtx3090-nvlink-idle.json")
    assert [g["memory_used_mib"] for g in idle["gpus"]] == [2, 2]
    mig = facts_from_profile(PROFILES_DIR / "ceems-2x-a100-pcie40-mig.json")
    assert [g["mig_mode"] for g in mig["gpus"]] == ["Enabled", "Disabled"]
    h200 = facts_from_profile(PROFILES_DIR / "noderecord-8x-h200-nvswitch.json")
    assert h200["topology"]["matrix"][0][7] == "NV18" and h200["gpus"][5]["numa_node"] == 1
    uts = facts_from_profile(PROFILES_DIR / "uts-2x-v100-pcie32.json")
    assert uts["gpus"][1]["cpu_affinity"] == "1,3,5,7,9,11" and uts["gpus"][0]["mig_mode"] is None
    rtx4090 = facts_from_profile(PROFILES_DIR / "seed-1x-rtx4090.json")
    assert (rtx4090["gpus"][0]["compute_capability"], rtx4090["gpus"][0]["memory_total_mib"]) == ("8.9", 24564)
    assert rtx4090["topology"] == {"matrix": [["X"]], "nvlink_groups": []}


def test_standin_answers_exactly_the_module_command_lines():
    seen = []
    run = standin_runner(PROFILES_DIR / "uts-2x-v100-pcie32.json")

    def recording(argv):
        seen.append(tuple(argv[1:]))
        return run(argv)

    ns.collect(recording, str(STANDIN))
    assert seen == [ns.QUERY_ARGS, ns.TABLE_ARGS, ns.TOPO_ARGS]
    rc, out, _ = run([str(STANDIN), "--query-gpu=index", "--format=csv,noheader,nounits", "-i", "0"])
    assert rc == 2 and "unsupported command line" in out


def test_standin_units_header_and_list():
    run = standin_runner(PROFILES_DIR / "ceems-2x-a100-pcie40-mig.json")
    fields = ",".join(ns.QUERY_FIELDS)
    _, with_units, _ = run([str(STANDIN), f"--query-gpu={fields}", "--format=csv"])
    _, nounits, _ = run([str(STANDIN), *ns.QUERY_ARGS])
    assert "40960 MiB" in with_units and with_units.startswith("index, uuid")
    assert parse_query(with_units) == parse_query(nounits)
    _, listing, _ = run([str(STANDIN), *ns.LIST_ARGS])
    gpus = parse_list(listing)
    profile = load("ceems-2x-a100-pcie40-mig")
    assert [g["uuid"] for g in gpus] == [g["uuid"] for g in profile["gpus"]]
    assert [m["profile"] for m in gpus[0]["mig_devices"]] == ["1g.10gb"] * 4


def test_standin_rendered_table_matches_the_captured_one(tmp_path):
    captured = parse_table(read("ceems-2x-a100-pcie40-mig-gpu0only.mig.txt"))
    profile = load("ceems-2x-a100-pcie40-mig")
    del profile["table"]
    path = tmp_path / "rendered.json"
    path.write_text(json.dumps(profile))
    rc, out, _ = standin_runner(path)([str(STANDIN)])
    rendered = parse_table(out)
    assert rc == 0 and out != profile.get("table")
    assert rendered == captured


def variant(tmp_path, name: str, **changes) -> str:
    profile = load(name)
    profile.update(changes)
    path = tmp_path / f"{name}-variant.json"
    path.write_text(json.dumps(profile))
    return str(path)


def test_standin_failures_through_collect(tmp_path):
    with pytest.raises(NvmlError, match="Driver/library version mismatch"):
        facts_from_profile(variant(tmp_path, "uts-2x-v100-pcie32", failure="nvml"))
    with pytest.raises(NvmlError, match="couldn't communicate"):
        facts_from_profile(variant(tmp_path, "uts-2x-v100-pcie32", failure="no-driver"))
    none = facts_from_profile(variant(tmp_path, "uts-2x-v100-pcie32", failure="no-devices"))
    assert none == ns.empty_facts()
    # a sick GPU is an entry with healthy: false; the facts come back unless asked to fail
    path = variant(tmp_path, "noderecord-8x-h200-nvswitch", failure="gpu-error:3")
    facts = facts_from_profile(path)
    assert [g["healthy"] for g in facts["gpus"]] == [True] * 3 + [False] + [True] * 4
    assert facts["gpus"][3]["error"] == "memory.used: [Unknown Error]; memory.free: [Unknown Error]"
    assert len(facts["topology"]["matrix"]) == 8 and facts["cuda_driver_version"]
    assert facts_from_profile(path, "any") == facts
    with pytest.raises(GpuError) as e:
        facts_from_profile(path, "all")
    assert "GPU 3 (00000000:5D:00.0): memory.used: [Unknown Error]" in str(e.value)
    assert [g["healthy"] for g in e.value.facts["gpus"]] == [True] * 3 + [False] + [True] * 4
    # a lost GPU: nvidia-smi prints only the device-handle line for the table and topo -m
    lost = facts_from_profile(variant(tmp_path, "cn5900x-2x-rtx3090-nvlink-busy", failure="gpu-lost:1"))
    assert lost["gpus"][1]["pci_bus_id"] == "00000000:0A:00.0" and "GPU is lost" in lost["gpus"][1]["error"]
    assert lost["gpus"][0]["healthy"] and lost["gpus"][0]["memory_free_mib"] is not None
    assert lost["topology"]["matrix"] == [] and "exited with code 15" in lost["topology"]["error"]
    assert lost["cuda_driver_version"] is None
    with pytest.raises(GpuError, match="GPU is lost"):
        facts_from_profile(variant(tmp_path, "cn5900x-2x-rtx3090-nvlink-busy", failure="gpu-lost:1"), "all")


@pytest.mark.parametrize(
    "failure, words",
    [
        ("gpu-unknown:3", "Unable to determine the device handle for gpu 0000:0B:00.0: Unknown Error"),
        ("gpu-reset:3", "uuid: [GPU requires reset]"),
        ("gpu-na:3", "memory.total: [N/A]"),
        ("gpu-error:3", "memory.used: [Unknown Error]"),
    ],
)
def test_dead_gpu_among_eight_gives_facts_for_all(tmp_path, failure, words):
    """Every dead/unusable form: GPU 3 becomes healthy: false with the reason, the others are read."""
    path = variant(tmp_path, "seed-8x-v100-sxm2-cubemesh", failure=failure)
    if failure == "gpu-na:3":  # [N/A] in memory.used/free: free memory unknown, total still read
        words = "memory.free: [N/A]"
    facts = facts_from_profile(path)
    assert facts["count"] == 8
    assert [g["index"] for g in facts["gpus"]] == list(range(8))
    assert [g["healthy"] for g in facts["gpus"]] == [True] * 3 + [False] + [True] * 4
    assert words in facts["gpus"][3]["error"] and "\n" not in facts["gpus"][3]["error"]
    assert facts["gpus"][3]["pci_bus_id"] == "00000000:0B:00.0"
    assert all(g["memory_free_mib"] == 16160 for g in facts["gpus"] if g["healthy"])
    json.dumps(facts)
    with pytest.raises(GpuError):
        facts_from_profile(path, "all")


def test_written_dead_gpu_shapes():
    q = parse_query(read("written/deadgpu-8x-v100-sxm2-lowercase-handle.query.txt"))
    assert [g["healthy"] for g in q["gpus"]] == [True] * 3 + [False] + [True] * 4
    assert q["gpus"][3]["pci_bus_id"] == "00000000:0B:00.0" and q["gpus"][3]["index"] == 3
    assert q["gpus"][3]["error"] == "Unable to determine the device handle for gpu 0000:0B:00.0: Unknown Error"
    gpus = parse_list(read("written/deadgpu-8x-v100-sxm2-lowercase-handle.list.txt"))
    assert [g["healthy"] for g in gpus] == [True] * 3 + [False] + [True] * 4
    with pytest.raises(ParseError) as e:  # only the device-handle line: no table to read
        parse_table(read("written/deadgpu-8x-v100-sxm2-lowercase-handle.table.txt"))
    assert len(str(e.value).splitlines()) == 1
    reset = parse_query(read("written/reset-required-2x-v100-sxm2.query.txt"))
    assert reset["gpus"][0]["healthy"] and reset["gpus"][0]["memory_free_mib"] == 16160
    bad = reset["gpus"][1]
    assert bad["healthy"] is False and bad["pci_bus_id"] == "00000000:07:00.0" and bad["index"] == 1
    assert bad["error"].startswith("uuid: [GPU requires reset]; name: [GPU requires reset]")
    assert bad["memory_total_mib"] is None and bad["name"] is None
    mixed = parse_query(read("written/unknown-error-and-na-memory-4x-v100-sxm2.query.txt"))
    assert [g["healthy"] for g in mixed["gpus"]] == [True, False, False, True]
    assert mixed["gpus"][1]["error"] == "memory.used: [unknown error]; memory.free: [unknown error]"
    assert mixed["gpus"][2]["error"] == "memory.total: [N/A]; memory.free: [N/A]"


@pytest.mark.parametrize("case", ["GPU", "gpu", "Gpu", "GPU ", "gpu  "])
@pytest.mark.parametrize(
    "words", ["Unknown Error", "unknown error", "GPU is lost.  Reboot the system", "GPU requires reset"]
)
def test_device_handle_lines_in_any_case(case, words):
    line = f"Unable to determine the device handle for {case}0000:5E:00.0: {words}"
    for text in (line, line.upper(), line.lower()):
        q = parse_query("\n".join([ROW0, text, ROW1.replace("1, GPU-bbbb", "2, GPU-cccc")]))
        assert [g["healthy"] for g in q["gpus"]] == [True, False, True]
        assert q["gpus"][1]["pci_bus_id"] == "00000000:5E:00.0"
        gpus = parse_list(f"GPU 0: Tesla V100 (UUID: GPU-a)\n{text}\n")
        assert [g["healthy"] for g in gpus] == [True, False]


@pytest.mark.parametrize("words", ["[Unknown Error]", "[unknown error]", "[GPU REQUIRES RESET]", "[gpu is lost]"])
def test_bracketed_error_words_any_case(words):
    q = parse_query(ROW0.replace(", 4,", f", {words},"))
    assert q["gpus"][0]["healthy"] is False and q["gpus"][0]["error"] == f"memory.used: {words}"


# ---------------------------------------------------------------- any bytes: facts or one line


def _variants(text: str) -> dict:
    """The same output as it reaches us in practice: CRLF, tabs as spaces, ANSI codes with or without ESC."""
    lines = text.splitlines()
    return {
        "crlf": text.replace("\n", "\r\n"),
        "spaces": "\n".join(ln.expandtabs(8) for ln in lines) + "\n",
        "ansi-esc": "\n".join(f"\x1b[1m{ln}\x1b[0m" if ln.strip() else ln for ln in lines) + "\n",
        "ansi-noesc": "\n".join(f"[4m{ln}[0m" if ln.strip() else ln for ln in lines) + "\n",
        "caret-esc": "\n".join(f"^[[4m{ln}^[[0m" if ln.strip() else ln for ln in lines) + "\n",
    }


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("how", ["crlf", "spaces", "ansi-esc", "ansi-noesc", "caret-esc"])
def test_every_capture_survives_transport(name, how):
    """CRLF, spaces for tabs and ANSI codes (with or without their ESC byte) change nothing."""
    parser = {"topo": parse_topology, "query": parse_query, "list": parse_list}.get(kind_of(name), parse_table)
    text = read(name)
    if how == "spaces" and kind_of(name) in ("table", "mig", "list", "query"):
        pytest.skip("no tabs in this kind")
    assert parser(_variants(text)[how]) == parser(text)


def test_written_transport_shapes():
    uts = parse_topology(read("uts-2x-v100-pcie32.topo.txt"))
    assert parse_topology(read("written/ansi-noesc-2x-v100-pcie32.topo.txt")) == uts
    assert parse_topology((CAPTURE_DIR / "written/spaces-crlf-2x-v100-pcie32.topo.txt").read_bytes()) == uts
    q = parse_query((CAPTURE_DIR / "written/nonutf8-name-crlf-2x-v100-sxm2.query.txt").read_bytes())
    assert q["gpus"][0]["name"] == "Tesla V100-SXM2-16GB \ufffddition"
    assert q["gpus"][1]["name"] == "Tesla V100-SXM2-16GB" and all(g["healthy"] for g in q["gpus"])
    json.dumps(q).encode("utf-8")


def test_decode_output_never_passes_raw_bytes():
    assert ns.decode_output(b"caf\xe9\n") == "caf\ufffd\n"
    assert ns.decode_output("caf\udce9") == "caf\ufffd"  # surrogateescape'd byte (Ansible's str decode)
    assert ns.decode_output(None) == ""
    ns.decode_output("caf\udce9").encode("utf-8")


@pytest.mark.parametrize(
    "text",
    [
        "x" * 5000,
        "line one:\nline two..\n" * 300,
        "[4m" + "garbage " * 200 + "[0m",
        b"\xff\xfe garbage \x1b[31m red\x1b[0m " * 100,
        "Failed to initialize NVML: Unknown Error\n" + "z" * 4000,
    ],
)
def test_every_error_is_one_short_line_naming_the_command(text):
    data = text if isinstance(text, bytes) else text.encode()

    def run(argv):
        return 0, data, b""

    with pytest.raises(ns.NvidiaSmiError) as e:
        ns.collect(run, "/usr/bin/nvidia-smi")
    msg = str(e.value)
    assert "\n" not in msg and "\r" not in msg
    assert "`/usr/bin/nvidia-smi --query-gpu=... --format=...`" in msg
    assert len(msg) < 200 + 400, msg
    quoted = re.findall(r'"([^"]*)"', msg)
    assert quoted and all(len(q) <= 200 for q in quoted)
    assert not msg.endswith((":", ": ", "..")) or msg.endswith("...")
    assert "\x1b" not in msg and "[4m" not in msg
    msg.encode("utf-8")


def test_nonutf8_and_crlf_through_standin(tmp_path):
    profile = load("seed-2x-v100-pcie16")
    profile["gpus"][0]["name"] = "Tesla V100-PCIE-16GB \u00e9dition"
    profile.update(output_encoding="latin-1", crlf=True)
    path = tmp_path / "latin1.json"
    path.write_text(json.dumps(profile))
    facts = facts_from_profile(path)
    assert facts["gpus"][0]["name"] == "Tesla V100-PCIE-16GB \ufffddition"
    assert facts["topology"]["matrix"] == [["X", "SYS"], ["SYS", "X"]] and facts["cuda_driver_version"] == "12.2"
    json.dumps(facts).encode("utf-8")


def test_old_driver_without_compute_cap_field(tmp_path):
    path = variant(tmp_path, "seed-1x-v100-pcie16", unsupported_query_fields=["compute_cap"])
    rc, out, _ = standin_runner(path)([str(STANDIN), *ns.QUERY_ARGS])
    assert rc == 2 and 'Field "compute_cap" is not a valid field to query.' in out
    facts = facts_from_profile(path)
    assert facts["count"] == 1 and facts["gpus"][0]["compute_capability"] is None
    assert facts["gpus"][0]["memory_total_mib"] == 16384


def test_standin_without_profile_says_so(tmp_path):
    proc = subprocess.run(
        [str(STANDIN)],
        env={"NVIDIA_SMI_PROFILE": str(tmp_path / "nope.json"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "cannot read profile" in proc.stdout
