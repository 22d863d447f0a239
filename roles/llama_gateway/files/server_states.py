# Read by the llama_gateway role and run on the gateway host: print {server: status} of one backend as JSON,
# from HAProxy's runtime API (show stat). Arguments: the socket path, the backend. Exit 3 without a socket.
import csv
import json
import os
import socket
import sys

path, backend = sys.argv[1], sys.argv[2]
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
states = {
    r["svname"]: r["status"].split(" ")[0]
    for r in rows
    if r.get("pxname") == backend and r.get("svname") not in ("FRONTEND", "BACKEND")
}
print(json.dumps(states))
