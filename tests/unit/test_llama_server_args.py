"""llama_server_args: rendering llama-server instances for systemd, and the health verdict.

Inputs come from the real pipeline: capabilities parsed from real llama-server captures
(tests/fixtures/llama-server: mainline spells MTP draft-mtp, the PR 22673 stand-in spells it mtp,
the CUDA device list is a real third-party capture; the old-format help is hand-made, see its
SOURCES.md), model facts read by the real GGUF header reader from models written by
tests/harness/gguf (tiny servable models and the Qwen3.6-27B header stand-in), and GPU plans made by
the real tensor_split planner from nvidia-smi stand-in profiles. The last tests run the module
through ``ansible localhost`` against a real model file (and a real binary when one is built).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import gguf_header
from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_caps as lc
from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_server_args as la
from ansible_collections.llamafleet.mtp.plugins.module_utils.tensor_plan import plan
from ansible_run import needs_ansible
from ansible_run import run_module as _run_module
from nvsmi_profiles import facts_from_profile, profile_path

from tests.harness.gguf import make_models
from tests.harness.gguf import qwen36_27b_header as qwen

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "llama-server"
BUILDS = Path(os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet")) / "builds"
MAINLINE_BIN = Path(os.environ.get("LLAMA_SERVER_BIN") or BUILDS / "0d91d73bb065-cpu" / "bin" / "llama-server")
BIN = "/opt/llama.cpp/current/bin/llama-server"

AGREE = "/var/lib/llama-models/tiny-agree.gguf"
PLAIN = "/var/lib/llama-models/tiny-plain.gguf"
QWEN = "/var/lib/llama-models/qwen/Qwen3.6-27B-Q4_K_M-mtp.gguf"


# ------------------------------------------------------------------------------------------------
# inputs from the real pipeline


def caps_of(name: str, devices: str = "mainline-0c1e570") -> dict:
    caps = {"binary": BIN}
    caps.update(lc.parse_version((FIX / f"{name}.version.txt").read_text()))
    caps.update(lc.parse_help((FIX / f"{name}.help.txt").read_text()))
    caps.update(lc.parse_list_devices((FIX / f"{devices}.list-devices.txt").read_text()))
    return caps


MAINLINE = caps_of("mainline-0c1e570")
PR = caps_of("pr22673-standin")
CUDA = caps_of("mainline-0c1e570", devices="llama-swap-4x-cuda")  # same flags, a CUDA build's device list
OLD = caps_of("handmade-old-9333")


@pytest.fixture(scope="module")
def model_info(tmp_path_factory):
    """model_info for tiny agree/plain models and the Qwen3.6-27B header, keyed by their install paths."""
    out = tmp_path_factory.mktemp("models")
    files = {
        AGREE: make_models.build_model("agree", out, name="tiny-agree"),
        PLAIN: make_models.build_model("plain", out, name="tiny-plain"),
    }
    info = {}
    for path, mf in files.items():
        g = gguf_header.gguf_info(mf.paths[0])
        info[path] = dict(la.model_info_from_gguf(g, "test"), paths=[path])
    qpath = out / "Qwen3.6-27B-Q4_K_M-mtp.gguf"
    qwen.write_qwen36_27b_header(qpath)
    info[QWEN] = dict(la.model_info_from_gguf(gguf_header.gguf_info(qpath), "sha256:x"), paths=[QWEN])
    return info


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen") / "Qwen3.6-27B-Q4_K_M-mtp.gguf"
    qwen.write_qwen36_27b_header(out)
    return gguf_header.gguf_info(out)


_FACTS = {}


def facts(profile):
    if profile not in _FACTS:
        _FACTS[profile] = facts_from_profile(profile_path(profile))
    return copy.deepcopy(_FACTS[profile])


def render(instances, model_info, caps=MAINLINE, **kw):
    return la.render(instances, capabilities=caps, model_info=model_info, binary=BIN, **kw)


def refused(instances, model_info, caps=MAINLINE, **kw) -> str:
    with pytest.raises(la.ServerArgsError) as e:
        render(instances, model_info, caps, **kw)
    return str(e.value)


def value(args, flag):
    return args[args.index(flag) + 1]


# ------------------------------------------------------------------------------------------------
# MTP spelling follows the binary; MTP refused where it cannot work


def test_spec_type_spelling_follows_the_binary(model_info):
    inst = [{"name": "a", "model_path": AGREE, "port": 8081}]
    (main,) = render(inst, model_info, MAINLINE)
    (pr,) = render(inst, model_info, PR)
    assert value(main["args"], "--spec-type") == "draft-mtp"
    assert value(pr["args"], "--spec-type") == "mtp"
    assert main["spec_type"] == "draft-mtp" and pr["spec_type"] == "mtp"
    # defaults: one slot and 2 drafted tokens, as the seeds recommend with MTP
    assert value(main["args"], "--parallel") == "1" and main["parallel"] == 1  # published: the gateway's maxconn
    assert value(main["args"], "--spec-draft-n-max") == "2"
    assert main["args"][:6] == ["--model", AGREE, "--host", "127.0.0.1", "--port", "8081"]
    assert {"--metrics", "--no-webui"} <= set(main["args"])


def test_plain_model_with_mtp_is_refused(model_info):
    msg = refused([{"name": "b", "model_path": PLAIN, "port": 8082}], model_info)
    assert "mtp is on but model /var/lib/llama-models/tiny-plain.gguf has no MTP (nextn) layers" in msg
    assert "set mtp: false" in msg and "nothing was changed" in msg
    (ok,) = render([{"name": "b", "model_path": PLAIN, "port": 8082, "mtp": False}], model_info)
    assert "--spec-type" not in ok["args"] and not ok["mtp"] and ok["spec_type"] is None


def test_binary_without_mtp_is_refused(model_info):
    caps = dict(MAINLINE, mtp_spec_type=None, mtp_supported=False, spec_types=["none", "draft-simple"])
    msg = refused([{"name": "a", "model_path": AGREE, "port": 8081}], model_info, caps)
    assert "has no MTP speculative type (--spec-type lists: none, draft-simple)" in msg


def test_old_binary_refused_for_flags_it_does_not_know(model_info):
    msg = refused([{"name": "a", "model_path": AGREE, "port": 8081}], model_info, OLD)
    assert "does not know --spec-draft-n-max" in msg
    assert "does not know --parallel" in msg


def test_spec_draft_p_min_rendered_with_mtp_and_refused_where_the_binary_lacks_it(model_info):
    inst = [{"name": "a", "model_path": AGREE, "port": 8081, "spec_draft_p_min": 0.6}]
    (main,) = render(inst, model_info, MAINLINE)
    (pr,) = render(inst, model_info, PR)
    assert value(main["args"], "--spec-draft-p-min") == "0.6" == value(pr["args"], "--spec-draft-p-min")
    (plain,) = render([{"name": "b", "model_path": PLAIN, "port": 8082, "mtp": False, "spec_draft_p_min": 0.6}],
                      model_info)  # fmt: skip
    assert "--spec-draft-p-min" not in plain["args"]  # MTP off: nothing drafts
    (unset,) = render([{"name": "a", "model_path": AGREE, "port": 8081}], model_info)
    assert "--spec-draft-p-min" not in unset["args"]  # llama.cpp's own default
    caps = dict(MAINLINE, flags=[f for f in MAINLINE["flags"] if f not in ("--spec-draft-p-min", "--draft-p-min")])
    msg = refused(inst, model_info, caps)
    assert "instance 'a', field 'spec_draft_p_min': it renders --spec-draft-p-min, which the binary" in msg
    (both,) = render([dict(inst[0], spec_draft_n_min=1, temp=0.7)], model_info)
    a = both["args"]
    assert value(a, "--spec-draft-n-min") == "1" and value(a, "--temp") == "0.7"
    assert (
        a.index("--spec-draft-n-max")
        < a.index("--spec-draft-p-min")
        < a.index("--spec-draft-n-min")
        < a.index("--temp")
    )
    assert "field 'spec_draft_p_min'" in refused([dict(inst[0], spec_draft_p_min=1.5)], model_info)
    assert "spec_draft_p_min" in refused([dict(inst[0], extra_args=["--spec-draft-p-min", "0.2"])], model_info)


def test_split_mode_tensor_with_mtp_refused_unless_forced(model_info):
    inst = {"name": "t", "model_path": AGREE, "port": 8081, "devices": [0, 1], "split_mode": "tensor"}
    msg = refused([inst], model_info, CUDA)
    assert "split mode tensor with MTP is refused" in msg and "force_split_mode_tensor: true" in msg
    (r,) = render([dict(inst, force_split_mode_tensor=True)], model_info, CUDA)
    assert value(r["args"], "--split-mode") == "tensor"
    (r,) = render([dict(inst, mtp=False)], model_info, CUDA)
    assert value(r["args"], "--split-mode") == "tensor"


# ------------------------------------------------------------------------------------------------
# API key and bind address


def test_api_key_only_as_credential_file(model_info):
    key = "sk-very-secret-9c1e"
    (r,) = render([{"name": "k", "model_path": AGREE, "port": 8083, "api_key": key}], model_info)
    assert value(r["args"], "--api-key-file") == "/run/credentials/llama-server@k.service/api-key"
    assert r["api_key"] is True and r["key_file"] == "/etc/llama-server/k.key"
    assert f"LoadCredential=api-key:{r['key_file']}" in r["dropin"].splitlines()
    text = json.dumps(r)
    assert key not in text  # not in args, env, env file, drop-in or anything else rendered


@pytest.mark.parametrize("bad", ["--api-key", "--api-key=abc", "--api-key-file"])
def test_api_key_in_extra_args_refused(model_info, bad):
    msg = refused([{"name": "k", "model_path": AGREE, "port": 8083, "extra_args": [bad, "x"]}], model_info)
    assert "API keys never go on the command line" in msg


@pytest.mark.parametrize("name", ["LLAMA_API_KEY", "LLAMA_ARG_API_KEY", "CUDA_VISIBLE_DEVICES"])
def test_reserved_environment_refused(model_info, name):
    msg = refused([{"name": "e", "model_path": AGREE, "port": 8083, "environment": {name: "x"}}], model_info)
    assert f"instance 'e', field 'environment': may not set {name}" in msg


def test_non_loopback_needs_key_or_explicit_permission(model_info):
    base = {"name": "n", "model_path": AGREE, "port": 8084, "host": "0.0.0.0"}
    msg = refused([base], model_info)
    assert "host 0.0.0.0 is not a loopback address and there is no api_key" in msg
    (r,) = render([dict(base, allow_unauthenticated=True)], model_info)
    assert value(r["args"], "--host") == "0.0.0.0"
    assert r["health_url"] == "http://127.0.0.1:8084/health"
    (r,) = render([dict(base, api_key="k")], model_info, advertise_host="node7")
    assert r["url"] == "http://node7:8084"
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        (r,) = render([dict(base, host=host)], model_info)
    assert r["health_url"] == "http://localhost:8084/health"
    (r,) = render([dict(base, host="::1")], model_info)
    assert r["health_url"] == "http://[::1]:8084/health"


# ------------------------------------------------------------------------------------------------
# names, ports, models


def test_duplicate_names_and_port_clashes_refused(model_info):
    a = {"name": "a", "model_path": AGREE, "port": 8081}
    msg = refused([a, dict(a, port=8082)], model_info)
    assert "instance name 'a' is used 2 times" in msg
    msg = refused([a, dict(a, name="b")], model_info)
    assert "port 8081 is used by both 'a' and 'b'" in msg
    # every problem is listed at once
    msg = refused([a, dict(a, name="b"), dict(a, name="Bad Name!"), dict(a, name="c", port=80)], model_info)
    assert "port 8081 is used by both" in msg and "'Bad Name!' must be" in msg and "port 80 must be 1024-65535" in msg


def test_model_from_model_fetch_facts(model_info):
    models = {"tiny-agree": {"path": AGREE, "sha256": "ab" * 32}}
    (r,) = render([{"name": "a", "model": "tiny-agree", "port": 8081}], model_info, models=models)
    assert r["model"] == "tiny-agree" and value(r["args"], "--model") == AGREE
    msg = refused([{"name": "a", "model": "qwen", "port": 8081}], model_info, models=models)
    assert "model 'qwen' is not in model_fetch_facts (known: tiny-agree)" in msg
    msg = refused([{"name": "a", "model": "tiny-agree", "model_path": AGREE, "port": 8081}], model_info, models=models)
    assert "set either model" in msg
    msg = refused([{"name": "a", "port": 8081}], model_info)
    assert "no model; set model" in msg


def test_models_hidden_by_the_sandbox_or_unsafe_paths_refused(model_info):
    info = dict(model_info)
    info["/home/me/m.gguf"] = dict(model_info[AGREE], paths=["/home/me/m.gguf"])
    info["/srv/my models/m.gguf"] = dict(model_info[AGREE], paths=["/srv/my models/m.gguf"])
    msg = refused([{"name": "h", "model_path": "/home/me/m.gguf", "port": 8081}], info)
    assert "is under /home, which the hardened unit hides" in msg
    msg = refused([{"name": "s", "model_path": "/srv/my models/m.gguf", "port": 8081}], info)
    assert "must be absolute, without whitespace" in msg


# ------------------------------------------------------------------------------------------------
# extra arguments and environment


def test_extra_args_known_flags_pass_controlled_and_unknown_refused(model_info):
    base = {"name": "x", "model_path": AGREE, "port": 8081}
    (r,) = render([dict(base, extra_args=["--top-nsigma", "-1.0", "--cont-batching"])], model_info)
    assert r["args"][-3:] == ["--top-nsigma", "-1.0", "--cont-batching"]
    msg = refused([dict(base, extra_args=["-c", "4096"])], model_info)
    assert "field 'extra_args': may not contain -c: the role renders it; set the instance's context instead" in msg
    msg = refused([dict(base, extra_args=["--no-such-flag"])], model_info)
    assert "--no-such-flag is not an option of this llama-server" in msg
    msg = refused([dict(base, extra_args=["--alias", "two words"])], model_info)
    assert "contains whitespace" in msg
    msg = refused([dict(base, extra_args=["--draft-max", "4"])], model_info)
    assert "--draft-max has been removed" in msg


def test_sampling_and_tuning_flags(model_info):
    inst = {
        "name": "s",
        "model_path": AGREE,
        "port": 8081,
        "temp": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "min_p": 0.0,
        "repeat_penalty": 1.05,
        "threads": 8,
        "batch_size": 2048,
        "ubatch_size": 512,
        "flash_attn": "on",
        "alias": "qwen,qwen3.6",
        "webui": True,
        "metrics": False,
        "context": 8192,
        "cache_type_k": "q8_0",
        "cache_type_v": "q8_0",
        "draft_n_max": 3,
    }
    (r,) = render([inst], model_info)
    a = r["args"]
    assert (value(a, "--temp"), value(a, "--top-k"), value(a, "--top-p")) == ("0.6", "20", "0.95")
    assert (value(a, "--min-p"), value(a, "--repeat-penalty")) == ("0.0", "1.05")
    assert (value(a, "--threads"), value(a, "--batch-size"), value(a, "--ubatch-size")) == ("8", "2048", "512")
    # the model's own name first (a model_path instance: the file's name), then the alias field's names
    assert (value(a, "--flash-attn"), value(a, "--ctx-size")) == ("on", "8192")
    assert value(a, "--alias") == "tiny-agree,qwen,qwen3.6"
    assert (value(a, "--cache-type-k"), value(a, "--spec-draft-n-max")) == ("q8_0", "3")
    assert "--no-webui" not in a and "--metrics" not in a
    # every flag rendered is one the binary's --help lists
    assert all(t in MAINLINE["flags"] for t in a if t.startswith("--"))


# ------------------------------------------------------------------------------------------------
# GPUs from the tensor_split plan


def test_gpu_plan_sets_devices_split_and_environment(model_info, qwen_gguf):
    p = plan(facts("seed-2x-v100-pcie16"), qwen_gguf, context=262144, cache_type_k="q4_0", cache_type_v="q4_0")
    pi = p["instances"][0]
    (r,) = render([{"name": "qwen", "model_path": QWEN, "port": 8080}], model_info, CUDA, plans={"qwen": p})
    a = r["args"]
    assert r["mode"] == "gpu" and r["devices"] == pi["devices"] == [0, 1]
    assert r["env"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": pi["cuda_visible_devices"]}
    assert value(a, "--tensor-split") == pi["tensor_split_arg"]
    assert value(a, "--split-mode") == "layer" and value(a, "--main-gpu") == str(pi["main_gpu"])
    assert value(a, "--n-gpu-layers") == str(pi["n_gpu_layers"])
    assert (value(a, "--ctx-size"), value(a, "--cache-type-k"), value(a, "--cache-type-v")) == (
        "262144",
        "q4_0",
        "q4_0",
    )
    assert value(a, "--spec-draft-type-k") == "f16"
    # the plan's own argument list says the same (short spellings there, long ones here)
    la_args = pi["llama_args"]
    assert la_args[la_args.index("-ts") + 1] == value(a, "--tensor-split")
    assert la_args[la_args.index("-c") + 1] == value(a, "--ctx-size")
    assert la_args[la_args.index("-ngl") + 1] == value(a, "--n-gpu-layers")
    # CUDA relaxations only in this instance's drop-in
    lines = r["dropin"].splitlines()
    assert {"PrivateDevices=no", "DeviceAllow=/dev/nvidia0 rw", "DeviceAllow=/dev/nvidia1 rw"} <= set(lines)
    assert {"DeviceAllow=/dev/nvidiactl rw", "DeviceAllow=/dev/nvidia-uvm rw", "MemoryDenyWriteExecute=no"} <= set(
        lines
    )
    assert "CUDA_VISIBLE_DEVICES=0,1" in r["env_file"].splitlines()


def test_setting_that_disagrees_with_the_plan_refused(model_info, qwen_gguf):
    p = plan(facts("seed-2x-v100-pcie16"), qwen_gguf, context=262144, cache_type_k="q4_0", cache_type_v="q4_0")
    inst = {"name": "qwen", "model_path": QWEN, "port": 8080, "context": 131072}
    msg = refused([inst], model_info, CUDA, plans={"qwen": p})
    assert "context is 131072 but llamafleet_plan['qwen'] was planned with 262144" in msg
    (r,) = render([dict(inst, context=262144)], model_info, CUDA, plans={"qwen": p})
    assert value(r["args"], "--ctx-size") == "262144"


def test_replicas_auto_one_instance_per_planned_group(model_info, qwen_gguf):
    p = plan(facts("noderecord-8x-h200-nvswitch"), qwen_gguf, context=262144, replicas="auto")
    inst = {"name": "q", "model_path": QWEN, "port": 9000, "replicas": "auto", "api_key": "k"}
    rs = render([inst], model_info, CUDA, plans={"q": p})
    assert len(rs) == len(p["instances"]) == 8
    assert [r["name"] for r in rs] == [f"q-{i}" for i in range(8)]
    assert [r["port"] for r in rs] == list(range(9000, 9008))
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in rs] == [pi["cuda_visible_devices"] for pi in p["instances"]]
    assert len({r["key_file"] for r in rs}) == 8
    assert all(value(r["args"], "--api-key-file").endswith(f"llama-server@{r['name']}.service/api-key") for r in rs)
    # the replicas' ports must not clash with another instance
    msg = refused([inst, {"name": "other", "model_path": AGREE, "port": 9003}], model_info, CUDA, plans={"q": p})
    assert "port 9003 is used by both 'q-3' and 'other'" in msg


def test_cpu_plan_and_cpu_instances(model_info):
    p = plan({"count": 0, "gpus": [], "source": "none"}, _agree_gguf(model_info), context=2048, cpu_ok=True)
    (r,) = render([{"name": "c", "model_path": AGREE, "port": 8081}], model_info, MAINLINE, plans={"c": p})
    assert r["mode"] == "cpu" and r["env"] == {} and "--n-gpu-layers" not in r["args"]
    assert value(r["args"], "--ctx-size") == "2048"
    assert "DeviceAllow" not in r["dropin"] and "PrivateDevices" not in r["dropin"]
    # a CUDA build running a CPU instance hides the GPUs and offloads nothing
    (r,) = render([{"name": "c", "model_path": AGREE, "port": 8081}], model_info, CUDA)
    assert r["env"] == {"CUDA_VISIBLE_DEVICES": ""} and value(r["args"], "--n-gpu-layers") == "0"
    # a CPU build cannot serve a GPU plan
    msg = refused([{"name": "g", "model_path": AGREE, "port": 8081, "devices": [0]}], model_info, MAINLINE)
    assert "has no CUDA backend" in msg


def _agree_gguf(model_info):
    # plan() needs the full gguf_info; rebuild it from a fresh agree model (same bytes as the fixture's)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        mf = make_models.build_model("agree", d, name="tiny-agree")
        return gguf_header.gguf_info(mf.paths[0])


# ------------------------------------------------------------------------------------------------
# the files systemd reads


def test_env_file_splits_back_into_the_arguments(model_info):
    (r,) = render([{"name": "a", "model_path": AGREE, "port": 8081}], model_info, binary_identity="/x:1:2")
    lines = r["env_file"].splitlines()
    (line,) = [ln for ln in lines if ln.startswith("LLAMA_SERVER_ARGS=")]
    assert line.split("=", 1)[1].split() == r["args"]  # systemd splits $LLAMA_SERVER_ARGS at whitespace
    assert f"# binary: {BIN} [/x:1:2]" in lines and f"# model: {AGREE} [test]" in lines
    assert "ReadOnlyPaths=-/var/lib/llama-models" in r["dropin"].splitlines()


def test_a_new_binary_changes_the_env_file(model_info):
    inst = [{"name": "a", "model_path": AGREE, "port": 8081}]
    (one,) = render(inst, model_info, binary_identity="/b/1:10:1")
    (two,) = render(inst, model_info, binary_identity="/b/2:10:1")
    assert one["args"] == two["args"] and one["env_file"] != two["env_file"]


def test_health_timeout_sized_to_the_model(model_info):
    assert la.health_timeout(0) == 60
    assert la.health_timeout(16 * 1024**3) == 60 + 16 * 30
    assert la.health_timeout(int(1.5 * 1024**3), base_s=10, per_gib_s=20) == 40
    (r,) = render([{"name": "q", "model_path": QWEN, "port": 8080, "mtp": True}], model_info)
    assert r["health_timeout"] == la.health_timeout(model_info[QWEN]["size_bytes"])
    (r,) = render([{"name": "q", "model_path": QWEN, "port": 8080, "health_timeout": 900}], model_info)
    assert r["health_timeout"] == 900


# ------------------------------------------------------------------------------------------------
# health verdict

ACTIVE = {"ActiveState": "active", "SubState": "running", "MainPID": "100", "NRestarts": "0", "Result": "success"}
BASE = {"MainPID": "100", "NRestarts": "0"}


@pytest.mark.parametrize(
    "status, unit, state, words",
    [
        (200, ACTIVE, "ready", "200"),
        (503, ACTIVE, "loading", "loading"),
        (None, ACTIVE, "starting", "nothing answers"),
        (404, ACTIVE, "failed", "HTTP 404"),
        (None, dict(ACTIVE, ActiveState="activating", SubState="start"), "starting", "activating"),
        (None, dict(ACTIVE, ActiveState="activating", SubState="auto-restart", MainPID="0"), "failed", "exited"),
        (None, dict(ACTIVE, ActiveState="failed", SubState="failed", Result="exit-code"), "failed", "exit-code"),
        (200, dict(ACTIVE, MainPID="200"), "failed", "pid 100 -> 200"),
        (503, dict(ACTIVE, NRestarts="1"), "failed", "restarted it (1 time"),
        (200, dict(ACTIVE, ActiveState="inactive", SubState="dead"), "failed", "exited"),
    ],
)
def test_health_verdict(status, unit, state, words):
    got, reason = la.health_verdict(status, unit, BASE)
    assert got == state and words in reason


# ------------------------------------------------------------------------------------------------
# the module, run for real


def run_module(name, args, check_mode=False):
    """The exit status is not cross-checked here (as before)."""
    return _run_module(name, args, check_mode=check_mode, check_rc=False)


@pytest.fixture(scope="module")
def served():
    """A real model file in a directory the unit's sandbox does not hide (pytest's tmp is under /tmp,
    which PrivateTmp hides, so the module would refuse it; so may the checkout, e.g. a CI clone
    under /tmp): the harness cache dir, else tests/output/ (git-ignored)."""
    base = Path(os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet"))
    if not (base.is_dir() and os.access(base, os.W_OK)) or str(base).startswith(("/tmp/", "/var/tmp/")):
        base = REPO / "tests" / "output"
    d = base / "test-output" / f"llama-server-args-{os.getpid()}"
    mf = make_models.build_model("agree", d, name="tiny-agree")
    yield str(mf.paths[0])
    for p in mf.paths:
        p.unlink()
    d.rmdir()


@needs_ansible
def test_module_renders_from_a_real_model_file(served, tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")  # only stat()ed: its capabilities are the mainline capture's
    binary.chmod(0o755)
    key = "module-test-key-55e1"
    args = {
        "instances": [{"name": "a", "model_path": served, "port": 8081, "api_key": key}],
        "binary": str(binary),
        "capabilities": MAINLINE,
    }
    result = run_module("llama_server_args", args, check_mode=True)
    assert not result.get("failed"), result
    assert result["changed"] is False
    (r,) = result["instances"]
    assert value(r["args"], "--spec-type") == "draft-mtp"
    assert result["binary_identity"].startswith(f"{binary}:10:")
    assert key not in json.dumps(result)
    bad = run_module("llama_server_args", dict(args, instances=[dict(args["instances"][0], mtp=False, port=80)]))
    assert bad["failed"] and "port 80 must be 1024-65535" in bad["msg"]


@needs_ansible
@pytest.mark.slow
@pytest.mark.skipif(not os.access(MAINLINE_BIN, os.X_OK), reason=f"no llama-server build at {MAINLINE_BIN}")
def test_module_with_probed_capabilities_of_the_real_binary(served):
    probe = run_module("llama_server_capabilities", {"binary": str(MAINLINE_BIN)})
    assert not probe.get("failed"), probe
    args = {
        "instances": [{"name": "a", "model_path": served, "port": 8081}],
        "binary": str(MAINLINE_BIN),
        "capabilities": probe["capabilities"],
    }
    result = run_module("llama_server_args", args)
    (r,) = result["instances"]
    assert value(r["args"], "--spec-type") == probe["capabilities"]["mtp_spec_type"]


def test_slot_prompt_similarity_default_rendered_where_the_binary_has_it_and_the_prompt_cache(model_info):
    """The default 0 is rendered where the binary lists --slot-prompt-similarity and --cache-ram (the mainline and
    PR captures); a binary without either keeps its own behaviour (not rendered, not refused); a value the
    inventory sets is refused there, naming the field."""
    inst = [{"name": "a", "model_path": AGREE, "port": 8081}]
    (main,) = render(inst, model_info, MAINLINE)
    (pr,) = render(inst, model_info, PR)
    assert value(main["args"], "--slot-prompt-similarity") == "0.0" == value(pr["args"], "--slot-prompt-similarity")
    (plain,) = render([{"name": "b", "model_path": PLAIN, "port": 8082, "mtp": False}], model_info)
    assert value(plain["args"], "--slot-prompt-similarity") == "0.0"  # not an MTP setting
    (own,) = render([dict(inst[0], slot_prompt_similarity=0.25)], model_info)
    assert value(own["args"], "--slot-prompt-similarity") == "0.25"
    for missing in ("--cache-ram", "--slot-prompt-similarity"):
        caps = dict(MAINLINE, flags=[f for f in MAINLINE["flags"] if f != missing])
        (kept,) = render(inst, model_info, caps)
        assert "--slot-prompt-similarity" not in kept["args"]
    caps = dict(MAINLINE, flags=[f for f in MAINLINE["flags"] if f != "--slot-prompt-similarity"])
    msg = refused([dict(inst[0], slot_prompt_similarity=0.25)], model_info, caps)
    assert "instance 'a', field 'slot_prompt_similarity': it renders --slot-prompt-similarity, which" in msg
    assert "slot_prompt_similarity" in refused([dict(inst[0], extra_args=["-sps", "0.5"])], model_info)


def test_every_instance_answers_to_its_declared_name():
    """--alias always carries the declared model's name (never llama-server's file-path default); an explicit alias
    adds names; each name once; a model_path instance answers to its file's name, a split set's without the part."""
    from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_instances import served_names

    assert served_names({"model": "qwen3.6-27b-mtp"}) == ["qwen3.6-27b-mtp"]
    assert served_names({"model": "big", "alias": "big, b ,c,,b"}) == ["big", "b", "c"]
    assert served_names({"model_path": "/m/Qwen3.6-27B-Q4_K_M-mtp.gguf"}) == ["Qwen3.6-27B-Q4_K_M-mtp"]
    assert served_names({"model_path": "/m/q-00001-of-00003.gguf", "alias": "q"}) == ["q"]
    assert served_names({}) == []
