#!/usr/bin/env bash
# `make setup`: the virtualenv holds exactly requirements/dev.txt (hashes
# required, no dependency resolution) plus this project, editable; a package an
# earlier lock installed and this one does not name is uninstalled.
#
# The lock is installed by uv (parallel downloads, bytecode compiled on every core: about
# 15 s on a fresh 2-core machine, against 70 s for pip), itself installed first from the
# lock's own hashed `uv==` entry. uv reads no pip configuration: where it cannot install
# (an index only pip.conf names, say), pip installs the same lock instead.
#
# Two `make` at once (two demos in a fresh clone) take turns on a lock file, and
# the second finds the work done; a venv older than its lock is built again.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$1 venv=$2 lock=requirements/dev.txt
exec 9>"$venv.setup-lock"
flock 9
stamp=$venv/.installed
if [[ -f $stamp && $stamp -nt $lock && $stamp -nt pyproject.toml ]]; then
    exit 0
fi
scripts/system-deps.sh
"$python" -m venv "$venv"
install_with_uv() {
    local uv_pin
    uv_pin=$(mktemp)
    # the `uv==` entry and its hash lines, up to the first line that is not a continuation
    awk '/^uv==/ {take = 1} take {print} take && !/\\$/ {exit}' "$lock" >"$uv_pin"
    "$venv/bin/python" -m pip install --quiet --require-hashes --no-deps -r "$uv_pin" &&
        "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --require-hashes \
            --no-deps --compile-bytecode -r "$lock"
    local status=$?
    rm -f "$uv_pin"
    return $status
}
if ! install_with_uv; then
    echo "setup: uv could not install $lock; installing it with pip"
    "$venv/bin/python" -m pip install --quiet --require-hashes --no-deps -r "$lock"
fi
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
unlocked=$("$venv/bin/python" scripts/unlocked_packages.py "$lock")
if [[ -n $unlocked ]]; then
    echo "setup: removing packages the lock does not name: $unlocked"
    # shellcheck disable=SC2086  # one name per word
    "$venv/bin/python" -m pip uninstall --quiet --yes $unlocked
fi
touch "$stamp"
