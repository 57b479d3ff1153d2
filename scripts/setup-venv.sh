#!/usr/bin/env bash
# `make setup`: the virtualenv holds exactly requirements/dev.txt (hashes
# required, no dependency resolution) plus this project, editable; a package an
# earlier lock installed and this one does not name is uninstalled.
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
"$venv/bin/python" -m pip install --quiet --require-hashes --no-deps -r "$lock"
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
unlocked=$("$venv/bin/python" scripts/unlocked_packages.py "$lock")
if [[ -n $unlocked ]]; then
    echo "setup: removing packages the lock does not name: $unlocked"
    # shellcheck disable=SC2086  # one name per word
    "$venv/bin/python" -m pip uninstall --quiet --yes $unlocked
fi
touch "$stamp"
