# Read by the llama_gateway role and run on the gateway host: print the servers of the given backends as a JSON
# list of {backend, server, status, inherited, sessions}, from HAProxy's runtime API (show stat). Arguments: the
# socket path, then one or more backends. "inherited": the state comes from a tracked server ("MAINT (via
# llama/x)"), put back with that one. Exit 3 without a socket.
import csv
import json
import os
import socket
import sys

path, backends = sys.argv[1], sys.argv[2:]
if not os.path.exists(path):
    sys.exit(3)
s = socket.socket(socket.AF_UNIX)
s.connect(path)
s.sendall(b"show stat\n")
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
rows = csv.DictReader(data.decode().lstrip("# ").splitlines())
print(
    json.dumps(
        [
            {
                "backend": r["pxname"],
                "server": r["svname"],
                "status": r["status"].split(" ")[0],
                "inherited": "(via " in r["status"],
                "sessions": int(r.get("scur") or 0),
            }
            for r in rows
            if r.get("pxname") in backends and r.get("svname") not in ("FRONTEND", "BACKEND")
        ]
    )
)
