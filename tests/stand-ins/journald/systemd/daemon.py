"""``systemd.daemon`` stand-in: the module runs "under systemd" while $LLAMAFLEET_TEST_JOURNAL is set."""

import os


def booted():
    return bool(os.environ.get("LLAMAFLEET_TEST_JOURNAL"))
