"""Shared pytest setup for unit tests.

Modules and module_utils are imported by their collection path
(ansible_collections.llamafleet.mtp.plugins...), resolved through the committed symlink
collections/ansible_collections/llamafleet/mtp -> repository root (pyproject's pythonpath).
"""

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

# No test writes where a user's run reads: the checkout's ansible.cfg caches facts in ./.cache/facts for 24 hours,
# so facts a test's stand-in hardware produced (a V100 from the nvidia-smi stand-in) would be read by the next real
# run on that host name. Every ansible the tests start (ansible-runner, the CLI) caches into this session's own
# directory instead (the variable overrides fact_caching_connection; xdist workers each get their own).
os.environ["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = tempfile.mkdtemp(prefix="llamafleet-test-facts-")


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
