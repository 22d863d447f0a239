"""No secret reaches a managed host's journal through AnsibleModule's invocation log.

AnsibleModule logs every option that is not no_log ("Invoked with ...") to the journal, a list or dict
option as its Python repr, in which a no_log suboption's value with a newline, quote, backslash or non-ASCII
character is escaped and so not masked. The collection's modules that take secrets use
module_utils/secret_module.AnsibleModule, which masks the data structures first.

- Every module whose argument spec has a no_log option at any depth uses that class (the argument spec
  is taken from each module's own main(), as ansible-test's validate-modules takes it).
- host_files runs for real with secrets of every awkward shape (a key file's trailing newline, the
  gateway's multi-line key lists, quotes, a backslash, non-ASCII); its journal entries are read through
  tests/stand-ins/journald (a stand-in for python3-systemd: this controller has no journald) and hold
  the paths but none of the secrets. The sandbox fleet's test reads real hosts' journals.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from unittest import mock

import pytest
from ansible_run import needs_ansible, run_adhoc

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "stand-ins" / "journald"
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if p.stem != "__init__")


class _Spec(Exception):
    def __init__(self, cls, spec):
        super().__init__("captured")
        self.cls, self.spec = cls, spec


def _capture(self, *args, **kwargs):
    raise _Spec(type(self), kwargs.get("argument_spec", args[0] if args else {}))


def _no_log_paths(spec, prefix=""):
    for name, opts in spec.items():
        if opts.get("no_log"):
            yield prefix + name
        if opts.get("options"):
            yield from _no_log_paths(opts["options"], f"{prefix}{name}.")


def module_spec(name):
    from ansible.module_utils import basic

    mod = importlib.import_module(f"ansible_collections.llamafleet.mtp.plugins.modules.{name}")
    if not hasattr(mod, "main"):
        return None, None
    with mock.patch.object(basic.AnsibleModule, "__init__", _capture), pytest.raises(_Spec) as caught:
        mod.main()
    return caught.value.cls, caught.value.spec


@pytest.mark.parametrize("name", MODULES)
def test_modules_with_secrets_mask_them_in_the_invocation_log(name):
    pytest.importorskip("ansible")
    from ansible_collections.llamafleet.mtp.plugins.module_utils.secret_module import AnsibleModule

    cls, spec = module_spec(name)
    if spec is None:
        pytest.skip(f"{name} is documentation for an action plugin")
    secrets = list(_no_log_paths(spec))
    if secrets:
        assert issubclass(cls, AnsibleModule), (
            f"{name} takes secrets ({', '.join(secrets)}) but uses {cls.__module__}.{cls.__name__}: "
            "use module_utils.secret_module.AnsibleModule"
        )


def test_the_known_secret_takers_are_found():
    """The walk above finds every module that takes a secret (it would pass vacuously on a wrong walk)."""
    pytest.importorskip("ansible")
    found = {name for name in MODULES if (s := module_spec(name)[1]) and list(_no_log_paths(s))}
    assert {"host_files", "llama_server_args", "hf_download", "github_pr_info", "llama_bench"} <= found, found


SECRETS = [
    "sk-trailing-newline-0042\n",  # every API key file the server role writes
    "Bearer sk-gw-one-0042\nBearer sk-gw-two-0042\n",  # the gateway's key lists
    'sk-quote\'s-"both"-0042',
    "sk-back\\slash-0042",
    "sk-non-ascii-\u00e9\u2713-0042",
]


@needs_ansible
def test_host_files_journal_holds_paths_but_no_secret(tmp_path):
    journal = tmp_path / "journal.jsonl"
    d = tmp_path / "keys"
    args = {
        "directories": [{"path": str(d), "mode": "0700"}],
        "private_files": [{"path": f"{d}/k{i}.lst", "content": s} for i, s in enumerate(SECRETS)],
    }
    env = {"PYTHONPATH": str(STANDIN), "LLAMAFLEET_TEST_JOURNAL": str(journal)}
    result, output = run_adhoc("host_files", args, extra_env=env, extra_args=["-vvv"])
    assert result["changed"], result
    assert [(d / f"k{i}.lst").read_text() for i in range(len(SECRETS))] == SECRETS
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    invoked = [e for e in entries if "Invoked with" in e.get("MESSAGE", "")]
    assert invoked, f"the module logged no invocation through the journal stand-in: {entries}"
    text = journal.read_text() + output + json.dumps(result)
    assert f"{d}/k0.lst" in invoked[0]["MESSAGE"]  # what is not secret is still logged
    for s in SECRETS:
        for part in {s, s.strip(), json.dumps(s)[1:-1], repr(s)[1:-1], *s.split("\n")} - {""}:
            assert part not in text, f"secret {s!r} logged as {part!r}"
