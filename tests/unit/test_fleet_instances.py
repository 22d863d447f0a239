"""The one instance resolver (plugins/module_utils/fleet_instances.py): defaults, autotune and model
upgrades applied once, every problem naming host, instance and field, the planner's settings and the
server's arguments derived from the same resolved instance, and the documentation that must not drift."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.llamafleet.mtp.plugins.module_utils import fleet_instances as fi
from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_server_args as la
from ansible_collections.llamafleet.mtp.plugins.module_utils import tensor_plan

from tests.harness.gguf import make_models

REPO = Path(__file__).resolve().parents[2]
MODELS = [{"name": "m", "source": "controller"}, {"name": "m2", "source": "controller"}]


def resolve(instances, **kw):
    return fi.resolve(instances, host="h1", models=["m", "m2"], **kw)


def test_defaults_are_applied_once():
    (inst,), problems = resolve([{"name": "main", "model": "m", "port": 8080}])
    assert problems == []
    assert inst["draft_n_max"] == fi.DEFAULT_DRAFT_N_MAX == 2
    assert inst["parallel"] == 1 and inst["cache_type_k"] == "f16" and inst["host"] == "127.0.0.1"
    assert inst["mtp"] is None  # decided by the plan: on when the model has MTP layers


def test_autotune_fills_only_unpinned_draft_n_max():
    out, problems = resolve(
        [{"name": "a", "model": "m", "port": 8080}, {"name": "b", "model": "m", "port": 8081, "draft_n_max": 4}],
        autotune={"a": 3, "b": 1},
    )
    assert problems == []
    assert [i["draft_n_max"] for i in out] == [3, 4]


def test_autotune_entry_with_p_min_fills_each_unset_field_and_is_checked():
    """llamafleet_autotune as bench.yml --tags autotune writes it now ({draft_n_max, spec_draft_p_min}) or before
    (a bare draft-n-max); each tuned field applies where the instance leaves it unset, and a bad entry is refused
    naming host, instance and field."""
    out, problems = resolve(
        [{"name": "a", "model": "m", "port": 8080}, {"name": "b", "model": "m", "port": 8081, "spec_draft_p_min": 0.2},
         {"name": "c", "model": "m", "port": 8082}],
        autotune={"a": {"draft_n_max": 3, "spec_draft_p_min": 0.6}, "b": {"draft_n_max": 1, "spec_draft_p_min": "0.8"},
                  "c": 4},
    )  # fmt: skip
    assert problems == []
    assert [(i["draft_n_max"], i.get("spec_draft_p_min")) for i in out] == [(3, 0.6), (1, 0.2), (4, None)]
    _, problems = resolve(
        [{"name": "a", "model": "m", "port": 8080}, {"name": "b", "model": "m", "port": 8081}],
        autotune={"a": {"spec_draft_p_min": 1.5, "threads": 2}, "b": 0},
    )
    text = "\n".join(problems)
    assert "host h1, instance 'a', field 'spec_draft_p_min': llamafleet_autotune gives 1.5" in text
    assert "host h1, instance 'a', field 'llamafleet_autotune': 'threads' is not a tuned field" in text
    assert "host h1, instance 'b', field 'draft_n_max': llamafleet_autotune gives 0" in text


def test_model_upgrade_and_bench_override():
    (inst,), problems = resolve(
        [{"name": "a", "model": "m", "port": 8080}],
        model_overrides={"a": "m2"},
        instance_overrides={"a": {"mtp": False}},
    )
    assert problems == []
    assert inst["model"] == "m2" and inst["mtp"] is False


def test_every_problem_names_host_instance_and_field():
    _, problems = resolve(
        [
            {"name": "a", "model": "nope", "port": 80.5, "contxt": 4096, "cache_type_k": "q3"},
            {"name": "b", "model": "m", "port": 8081, "draft_n_max": 0},
            {"name": "b", "model": "m", "port": 8081},
        ],
        autotune={"zz": 2},
        model_overrides={"a": "m2"},
    )
    text = "\n".join(problems)
    assert "host h1, instance 'a', field 'contxt': unknown field (did you mean 'context'?)" in text
    assert "host h1, instance 'a', field 'port': must be a int" in text
    assert "host h1, instance 'a', field 'cache_type_k': must be one of" in text
    assert "host h1, instance 'b', field 'draft_n_max': draft_n_max 0 must be 1-16" in text
    assert "host h1, instance 'b', field 'name': is declared twice" in text
    assert "host h1, instance 'b', field 'port': 8081 is also the port of 'b'" in text
    assert "host h1, instance 'zz', field 'llamafleet_autotune'" in text
    assert all(p.startswith("host h1") for p in problems)


def test_bounds_and_access_are_checked_by_the_resolver_before_any_host_changes():
    """What llama_server_args refused only in the server stage (after other hosts had changed) the resolver - the
    facts stage - refuses now, naming host, instance and field: the port range, an upper bound for draft_n_max, a
    non-loopback bind without an API key, an API key that cannot be one credential line, a host that is a list."""
    _, problems = resolve(
        [
            {"name": "a", "model": "m", "port": 80},
            {"name": "b", "model": "m", "port": 8081, "draft_n_max": 99},
            {"name": "c", "model": "m", "port": 8082, "host": "0.0.0.0"},
            {"name": "d", "model": "m", "port": 8083, "host": "0.0.0.0", "api_key": "two\nlines"},
            {"name": "e", "model": "m", "port": 8084, "host": "10.0.0.1,10.0.0.2", "api_key": "k"},
            {"name": "f", "model": "m", "port": 8085, "api_key": ""},
            {"name": "ok", "model": "m", "port": 8086, "host": "0.0.0.0", "api_key": "k", "draft_n_max": 16},
            {"name": "open", "model": "m", "port": 8087, "host": "::", "allow_unauthenticated": True},
        ]
    )
    text = "\n".join(problems)
    assert "host h1, instance 'a', field 'port': port 80 must be 1024-65535 (the service runs without" in text
    assert "host h1, instance 'b', field 'draft_n_max': draft_n_max 99 must be 1-16" in text
    assert "host h1, instance 'c', field 'host': host 0.0.0.0 is not a loopback address and there is no api_key" in text
    assert "host h1, instance 'd', field 'api_key': api_key may not contain newlines or commas" in text
    assert "host h1, instance 'e', field 'host': host '10.0.0.1,10.0.0.2' must be one IP address" in text
    assert "host h1, instance 'f', field 'api_key': api_key is empty" in text
    assert not [p for p in problems if "'ok'" in p or "'open'" in p], problems
    assert "two\nlines" not in text and "two\\nlines" not in text  # the key itself is never in a message
    assert len(problems) == 6, problems


def test_model_not_declared():
    _, problems = resolve([{"name": "a", "model": "nope", "port": 8080}])
    assert problems == ["host h1, instance 'a', field 'model': 'nope' is not in llamafleet_models (declared: m, m2)"]


def test_declared_state_raises_one_message():
    with pytest.raises(fi.DeclaredStateError) as e:
        fi.declared_state(host="h1", ref="b9180", instances=[{"name": "a", "port": 8080}], models=MODELS)
    assert str(e.value).startswith("llamafleet: nothing was changed")
    assert "host h1, instance 'a', field 'model'" in str(e.value)


def test_templated_strings_are_coerced():
    (inst,), problems = resolve([{"name": "a", "model": "m", "port": "8080", "context": "4096", "mtp": "true"}])
    assert problems == [] and inst["port"] == 8080 and inst["context"] == 4096 and inst["mtp"] is True


@pytest.mark.parametrize(
    "running,declared,refused",
    [
        ("pull/22673", "mainline-0c1e570", False),  # the PR merged: an upgrade
        ("mainline-0c1e570", "pull/22673", True),  # back to the PR branch: nobody declared that
        ("b9180", "b9000", True),
        ("b9000", "b9180", False),
        ("b9180", "pull/22673", True),
        ("b9180", "feature-branch", False),  # unknown order: not refused
        ("pull/1", "pull/2", False),  # two PR branches: unknown order
        ("mainline-0c1e570", "b9180", False),  # mainline vs a release: unknown order (may be one commit)
        ("b9180", "mainline-0c1e570", False),
        ("b9180", "pull/22673", True),
    ],
)
def test_downgrade_rule(running, declared, refused):
    problem = fi.downgrade_problem("h1", {"ref": running, "name": "x-" + running}, declared)
    assert bool(problem) is refused
    if refused:
        assert running in problem and declared in problem and "llamafleet_allow_downgrade" in problem
    assert fi.downgrade_problem("h1", {"ref": running}, declared, allow=True) is None


def test_planner_kwargs_are_what_the_planner_takes():
    (inst,), _ = resolve(
        [{"name": "a", "model": "m", "port": 8080, "draft_cache_type_k": "q8_0", "kv_unified": True, "max_gpus": 2}]
    )
    kwargs = fi.planner_kwargs(inst)
    assert kwargs["draft_cache_type_k"] == "q8_0" and kwargs["kv_unified"] is True and kwargs["max_gpus"] == 2
    import inspect

    takes = set(inspect.signature(tensor_plan.plan).parameters) | set(tensor_plan.SETTINGS_DEFAULTS)
    assert set(kwargs) <= takes, set(kwargs) - takes


def test_batch_and_ubatch_reach_the_planner(tmp_path):
    """A tuned ubatch changes the compute buffers the plan counts (bench.yml's sweep runs ub256 and ub1024)."""
    from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import gguf_info

    gguf = gguf_info(make_models.build_model("agree", tmp_path, name="t").paths[0])
    gpu = {"count": 1, "gpus": [{"index": 0, "name": "x", "memory_total_mib": 16384, "memory_free_mib": 16000}]}
    computes = {}
    for ub in (256, 512, 2048):
        (inst,), problems = resolve(
            [{"name": "a", "model": "m", "port": 8080, "context": 4096, "ubatch_size": ub, "batch_size": 2048}]
        )
        assert not problems
        kwargs = fi.planner_kwargs(inst)
        assert kwargs["n_ubatch"] == ub and kwargs["n_batch"] == 2048
        p = tensor_plan.plan(gpu, gguf, **kwargs)
        assert p["settings"]["n_ubatch"] == ub
        computes[ub] = sum(p["instances"][0]["per_device"][0]["compute_terms_mib"].values())
    assert computes[256] < computes[512] < computes[2048], computes


def test_plan_and_server_agree(tmp_path):
    """The planner's settings and the server's arguments come from one resolved instance (no drift)."""
    path = make_models.build_model("agree", tmp_path, name="t").paths[0]
    from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import gguf_info

    gguf = gguf_info(str(path))
    (inst,), _ = resolve(
        [{"name": "a", "model": "m", "port": 8080, "context": 2048, "cache_type_k": "q8_0"}], autotune={"a": 3}
    )
    out = fi.plan_host(
        host="h1",
        instances=[inst],
        models={"m": {"gguf": gguf, "path": str(path)}},
        gpu_facts={"count": 0, "gpus": []},
        host_state={"mem_available_bytes": 8 << 30, "instances": {}},
    )
    assert out["problems"] == []
    plan = out["plan"]["a"]
    assert plan["settings"]["draft_n_max"] == 3 and plan["settings"]["cache_type_k"] == "q8_0"
    caps = {"flags": ["--model", "--host", "--port", "--ctx-size", "--parallel", "--cache-type-k", "--cache-type-v",
                      "--spec-type", "--spec-draft-n-max", "--spec-draft-type-k", "--spec-draft-type-v",
                      "--metrics", "--no-webui"], "mtp_spec_type": "draft-mtp"}  # fmt: skip
    info = dict(la.model_info_from_gguf(gguf, "id"), paths=["/var/lib/llama-models/m/t.gguf"])
    served = "/var/lib/llama-models/m/t.gguf"  # where model_fetch puts it (the unit hides /tmp)
    (r,) = la.render(
        out["instances"], capabilities=caps, model_info={served: info}, models={"m": {"path": served}},
        plans=out["plan"], binary="/opt/llama.cpp/current/bin/llama-server",
    )  # fmt: skip
    assert "--spec-draft-n-max 3" in " ".join(r["args"]) and "--cache-type-k q8_0" in " ".join(r["args"])


def test_plan_refuses_context_above_training_and_ram(tmp_path):
    path = make_models.build_model("agree", tmp_path, name="t").paths[0]
    from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import gguf_info

    gguf = gguf_info(str(path))
    train = gguf["context_length"]
    (big,), _ = resolve([{"name": "a", "model": "m", "port": 8080, "context": 99999999}])
    out = fi.plan_host(
        host="h1",
        instances=[big],
        models={"m": {"gguf": gguf}},
        gpu_facts={"count": 0, "gpus": []},
        host_state={"mem_available_bytes": 4 << 30, "instances": {"a": {"rss_bytes": 100 << 20}}},
    )
    text = "\n".join(out["problems"])
    assert "host h1, instance 'a', field 'context': 99999999 gives 100000000 tokens per slot" in text
    assert f"above the model's training context {train}" in text
    assert "MiB of host RAM" in text and "MemAvailable 4096 MiB + 100 MiB held by the running instances" in text
    # rope scaling opts into a longer context; memory is still checked
    (rope,), _ = resolve([{"name": "a", "model": "m", "port": 8080, "context": train * 2, "rope_scaling": "yarn"}])
    ok = fi.plan_host(
        host="h1", instances=[rope], models={"m": {"gguf": gguf}}, gpu_facts={"count": 0, "gpus": []},
        host_state={"mem_available_bytes": 8 << 30, "instances": {}},
    )  # fmt: skip
    assert ok["problems"] == []


def test_default_ref_matches_the_build_role():
    defaults = yaml.safe_load((REPO / "roles/llamacpp_mtp_build/defaults/main.yml").read_text())
    assert defaults["llamacpp_mtp_build_ref"] == fi.DEFAULT_REF


def _field_docs():
    spec = importlib.util.spec_from_file_location("field_docs", REPO / "scripts" / "field_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_generated_field_docs_are_current():
    """The role's argument_specs and the module's DOCUMENTATION carry FIELDS as scripts/field_docs.py writes them."""
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "field_docs.py"), "--check"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    specs = yaml.safe_load((REPO / "roles/llama_server_systemd/meta/argument_specs.yml").read_text())
    opts = specs["argument_specs"]["main"]["options"]["llama_server_systemd_instances"]["options"]
    assert list(opts) == list(fi.FIELDS)
    assert opts["api_key"]["no_log"] is True and opts["draft_n_max"]["default"] == fi.DEFAULT_DRAFT_N_MAX
    assert opts["draft_n_max"]["description"] == fi.FIELDS["draft_n_max"]["doc"]
    src = (REPO / "plugins/modules/llama_server_args.py").read_text()
    doc = next(
        n.value.value
        for n in ast.parse(src).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "DOCUMENTATION"
    )
    sub = yaml.safe_load(doc)["options"]["instances"]["suboptions"]
    assert {k: {kk: vv for kk, vv in v.items() if kk != "no_log"} for k, v in opts.items()} == sub


def test_a_changed_field_makes_the_docs_stale(monkeypatch):
    mod = _field_docs()
    path, indent, extra = mod.REPO / mod.TARGETS[0][0], mod.TARGETS[0][1], mod.TARGETS[0][2]
    assert mod.regenerate(path, indent, extra) == path.read_text()
    monkeypatch.setitem(mod.FIELDS, "port", dict(mod.FIELDS["port"], doc="another description"))
    assert "another description" in mod.regenerate(path, indent, extra) != path.read_text()


# ------------------------------------------------------------------------------------------------
# every field a user can write works through the resolver -> planner -> server path (the seeds' host
# shapes: real nvidia-smi captures through the stand-in and parser, the Qwen3.6-27B header stand-in)

GPU_CAPS = {
    "flags": [
        *("--model", "--host", "--port", "--ctx-size", "--parallel", "--kv-unified", "--cache-type-k"),
        *("--cache-type-v", "--spec-type", "--spec-draft-n-max", "--spec-draft-type-k", "--spec-draft-type-v"),
        *("--metrics", "--no-webui", "--n-gpu-layers", "--split-mode", "--main-gpu", "--tensor-split"),
    ],
    "mtp_spec_type": "draft-mtp",
    "has_cuda": True,
    "split_modes": ["none", "layer", "row", "tensor"],
}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import gguf_info

    from tests.unit.test_tensor_plan import write_qwen_header

    out = tmp_path_factory.mktemp("qwen") / "Qwen3.6-27B-Q4_K_M-mtp.gguf"
    write_qwen_header(out)
    return gguf_info(out)


def _through(raw, gguf, profile, **kw):
    from tests.unit.nvsmi_profiles import facts_from_profile, profile_path

    insts, problems = fi.resolve(raw, host="h1", models=["qwen"], **kw)
    assert problems == []
    out = fi.plan_host(
        host="h1",
        instances=insts,
        models={"qwen": {"gguf": gguf}},
        gpu_facts=facts_from_profile(profile_path(profile)),
        host_state={},
    )
    assert out["problems"] == [], out["problems"]
    served = "/var/lib/llama-models/qwen/q.gguf"
    info = dict(la.model_info_from_gguf(gguf, "id"), paths=[served])
    rendered = la.render(
        out["instances"],
        capabilities=GPU_CAPS,
        model_info={served: info},
        models={"qwen": {"path": served}},
        plans=out["plan"],
        binary="/opt/llama.cpp/current/bin/llama-server",
    )
    return out["plan"], rendered


def test_draft_cache_types_and_kv_unified_work_through_site(qwen):
    plan, (r,) = _through(
        [
            {
                "name": "q",
                "model": "qwen",
                "port": 8080,
                "context": 32768,
                "parallel": 2,
                "kv_unified": True,
                "draft_cache_type_k": "q8_0",
                "draft_cache_type_v": "q8_0",
            }
        ],
        qwen,
        "seed-1x-rtx3090",
    )
    args = " ".join(r["args"])
    # kv_unified: one KV stream of the whole context for both slots (the plan's n_ctx_seq)
    assert plan["q"]["settings"]["draft_cache_type_k"] == "q8_0" and plan["q"]["settings"]["n_ctx_seq"] == 32768
    assert "--spec-draft-type-k q8_0 --spec-draft-type-v q8_0" in args and "--kv-unified" in args


def test_forced_tensor_split_and_max_gpus_work_through_site(qwen):
    # A forced -ts over the GPUs the instance names: the planner checks the fit within those GPUs, the
    # server runs on all of them with the forced split.
    plan, (r,) = _through(
        [{"name": "q", "model": "qwen", "port": 8080, "context": 65536, "devices": [2, 3], "tensor_split": "3,2"}],
        qwen,
        "jtkj003-8x-a100-sxm4-nvswitch",
    )
    assert plan["q"]["fits"] and set(plan["q"]["instances"][0]["devices"]) <= {2, 3}
    assert r["args"][r["args"].index("--tensor-split") + 1] == "3,2" and r["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    # max_gpus bounds the planner: the seeds' 2x V100 262144 q4_0 case needs both GPUs, and max_gpus 1 refuses it
    from tests.unit.nvsmi_profiles import facts_from_profile, profile_path

    raw = {
        "name": "q",
        "model": "qwen",
        "port": 8080,
        "context": 262144,
        "cache_type_k": "q4_0",
        "cache_type_v": "q4_0",
    }
    for max_gpus, fits in ((2, True), (1, False)):
        (inst,), _ = fi.resolve([dict(raw, max_gpus=max_gpus)], host="h1", models=["qwen"])
        out = fi.plan_host(
            host="h1",
            instances=[inst],
            models={"qwen": {"gguf": qwen}},
            gpu_facts=facts_from_profile(profile_path("seed-2x-v100-pcie16")),
            host_state={},
        )
        assert (out["problems"] == []) is fits, out["problems"]
        if not fits:
            assert out["problems"][0].startswith("host h1, instance 'q':")


def test_replicas_auto_and_devices_work_through_site(qwen):
    plan, rendered = _through(
        [{"name": "q", "model": "qwen", "port": 8080, "context": 32768, "replicas": "auto"}],
        qwen,
        "noderecord-8x-h200-nvswitch",
    )
    assert len(rendered) == len(plan["q"]["instances"]) > 1
    assert [r["port"] for r in rendered] == list(range(8080, 8080 + len(rendered)))
    _, (one,) = _through(
        [{"name": "d", "model": "qwen", "port": 9000, "context": 32768, "devices": [1]}],
        qwen,
        "noderecord-8x-h200-nvswitch",
    )
    assert one["devices"] == [1] and one["env"]["CUDA_VISIBLE_DEVICES"] == "1"


def test_ref_order_reads_refs_as_the_build_does():
    """One ref grammar: every spelling of a pull request the build accepts is that pull request here too, and what
    the build refuses (an all-digit 7+ character ref: a PR or a sha prefix?) has no order."""
    from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_instances import ref_order

    for spelling in ("22673", "#22673", "pull/22673", "pr/22673", "refs/pull/22673/head", 22673):
        assert ref_order(spelling) == (0, 22673), spelling
    assert ref_order("b9180") == (1, 9180) and ref_order("master") == (2, 0)
    assert ref_order("1234567") is None and ref_order("feature-x") is None and ref_order("") is None
    assert ref_order("pull/22673") < ref_order("b9180")


def test_table_flag_fields_are_controlled_and_n_min_stays_within_n_max():
    """A field FIELDS renders as it is ("flag") owns every spelling of its flag (extra_args may not use one), and
    spec_draft_n_min above draft_n_max (every draft discarded) is refused by the resolver, naming the field."""
    for key, spec in fi.FIELDS.items():
        for flag in spec.get("flag") or []:
            assert la._CONTROLLED[flag] == key
    _, problems = resolve([{"name": "a", "model": "m", "port": 8080, "draft_n_max": 2, "spec_draft_n_min": 3}])
    assert problems == ["host h1, instance 'a', field 'spec_draft_n_min': 3 is above draft_n_max 2: every draft "
                        "would be discarded"]  # fmt: skip
    (inst,), problems = resolve([{"name": "a", "model": "m", "port": 8080, "spec_draft_n_min": 2}])
    assert problems == [] and inst["spec_draft_n_min"] == 2


def test_one_tensor_split_and_mtp_rule(tmp_path):
    """The resolver (facts stage), the planner and the server's arguments refuse -sm tensor with MTP in one text."""
    from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import gguf_info

    rule = tensor_plan.tensor_split_mtp_problem("tensor", True, False, "force_split_mode_tensor")
    assert "#23294" in rule and "force_split_mode_tensor: true" in rule
    assert tensor_plan.tensor_split_mtp_problem("layer", True, False) is None
    assert tensor_plan.tensor_split_mtp_problem("tensor", True, True) is None
    _, problems = resolve([{"name": "a", "model": "m", "port": 8080, "split_mode": "tensor", "mtp": True}])
    assert problems == [f"host h1, instance 'a', field 'split_mode': {rule}"]
    gguf = gguf_info(make_models.build_model("agree", tmp_path, name="t").paths[0])
    gpus = {"count": 2, "gpus": [{"index": i, "name": "x", "memory_total_mib": 16384, "memory_free_mib": 16000}
                                 for i in range(2)]}  # fmt: skip
    with pytest.raises(tensor_plan.PlanError) as e:
        tensor_plan.plan(gpus, gguf, context=4096, split_mode="tensor", mtp=True)
    assert e.value.message == tensor_plan.tensor_split_mtp_problem("tensor", True, False)


def test_every_field_refuses_a_bad_value_naming_host_instance_and_field():
    """Each field of the table, given a value it must refuse (tests/unit/field_cases.py, derived from FIELDS), is
    refused by the resolver - the facts stage, before any host changes - naming host, instance and field; one call
    with all of them lists every problem at once."""
    from tests.unit.field_cases import bad_instances

    cases = bad_instances(fi.FIELDS, "m")
    assert set(cases) == set(fi.FIELDS)
    missed = {}
    for key, (label, inst) in cases.items():
        _out, problems = resolve([{"name": "main", "model": "m", "port": 8080}, inst])
        if not any(p.startswith(fi.where("h1", label, key) + ":") for p in problems):
            missed[key] = (inst[key], problems)
    assert not missed, missed
    _out, problems = resolve([inst for _label, inst in cases.values()])
    named = {key for key, (label, _inst) in cases.items() if any(fi.where("h1", label, key) in p for p in problems)}
    assert named == set(cases)


def test_slot_prompt_similarity_defaults_to_0_and_is_refused_with_the_prompt_cache_off():
    """0 (the default) makes llama-server save a slot's prompt to its host-memory prompt cache at every switch;
    with that cache turned off in extra_args it would only lose the similarity pick, so the resolver refuses the
    pair before any host changes, naming host, instance and field; an explicit value or the cache on passes."""
    (inst,), problems = resolve([{"name": "a", "model": "m", "port": 8080}])
    assert problems == [] and inst["slot_prompt_similarity"] == 0.0
    _, problems = resolve(
        [
            {"name": "off", "model": "m", "port": 8080, "extra_args": ["--cache-ram", "0"]},
            {"name": "off2", "model": "m", "port": 8081, "extra_args": ["-cram=0"]},
            {"name": "own", "model": "m", "port": 8082, "extra_args": ["--cache-ram", "0"],
             "slot_prompt_similarity": 0.1},
            {"name": "big", "model": "m", "port": 8083, "extra_args": ["--cache-ram", "16384"]},
            {"name": "bad", "model": "m", "port": 8084, "slot_prompt_similarity": 1.5},
        ]
    )  # fmt: skip
    text = "\n".join(problems)
    for name in ("off", "off2"):
        assert (
            f"host h1, instance '{name}', field 'slot_prompt_similarity': 0 (the default) relies on llama-server's "
            "host-memory prompt cache, which extra_args turns off (--cache-ram 0)"
        ) in text
    assert "host h1, instance 'bad', field 'slot_prompt_similarity': slot_prompt_similarity 1.5 must be" in text
    assert len(problems) == 3, problems
