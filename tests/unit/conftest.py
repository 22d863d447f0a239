"""Shared pytest setup for unit tests.

Modules and module_utils are imported by their collection path
(ansible_collections.llamafleet.mtp.plugins...), resolved through the committed symlink
collections/ansible_collections/llamafleet/mtp -> repository root (pyproject's pythonpath).
"""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
