"""Stand-in for python3-systemd (``systemd.journal`` / ``systemd.daemon``) in unit tests.

The controller of this project's tests is a container without systemd-journald, so AnsibleModule would log
its invocation to syslog, where nothing keeps it. With this folder on PYTHONPATH a module takes the code path
it takes on a systemd host: ``journal.send(MESSAGE=..., **fields)``; each call is appended as one JSON line
to the file named by ``$LLAMAFLEET_TEST_JOURNAL``, so a test can read every entry a module logged, fields
included. The sandbox fleet's tests read the real journal of real systemd hosts.
"""
