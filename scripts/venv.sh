# Sourced by the lane scripts: stamped_venv PYTHON REQUIREMENTS VENV [STAMP]
# (Re)builds VENV with PYTHON from REQUIREMENTS when either changed since the last build (a stamp of both in
# STAMP, default VENV/.stamp); otherwise does nothing.
stamped_venv() {
  local py=$1 req=$2 venv=$3 stamp=${4:-$3/.stamp} want
  want=$(cat "$req" <("$py" -V 2>&1) | sha256sum | cut -d' ' -f1)
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
    echo "$want" > "$stamp"
  fi
}
