"""``systemd.journal`` stand-in: ``send`` and ``sendv`` append JSON lines to $LLAMAFLEET_TEST_JOURNAL."""

import json
import os


def sendv(*fields):
    entry = {}
    for field in fields:
        name, _, value = str(field).partition("=")
        entry[name] = value
    with open(os.environ["LLAMAFLEET_TEST_JOURNAL"], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def send(MESSAGE, **fields):  # noqa: N803 - python3-systemd's signature
    sendv("MESSAGE=" + str(MESSAGE), *(f"{k}={v}" for k, v in fields.items()))
