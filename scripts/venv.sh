# Sourced by the lane scripts: stamped_venv PYTHON REQUIREMENTS VENV [STAMP] [NODEPS]
# (Re)builds VENV with PYTHON from REQUIREMENTS (and NODEPS, a requirements file installed after it with
# --no-deps) when any of them changed since the last build (a stamp of all in STAMP, default VENV/.stamp);
# otherwise does nothing.
stamped_venv() {
  local py=$1 req=$2 venv=$3 stamp=${4:-$3/.stamp} nodeps=${5:-} want
  want=$(cat "$req" ${nodeps:+"$nodeps"} <("$py" -V 2>&1) | sha256sum | cut -d' ' -f1)
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
    if [ -n "$nodeps" ]; then "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$nodeps"; fi
    echo "$want" > "$stamp"
  fi
}
