#!/usr/bin/env bash
# `make lock`: re-resolve the locks in requirements/ from pyproject.toml with uv.
#
# requirements/dev.txt is the whole toolchain (every extra, the linters, the stub
# generators, the build backend); one file per service extra (what its image
# installs) is resolved under dev.txt as a constraint, so a service's lock never
# names another version than the suite was tested with. Versions already in a lock
# are kept unless a bound in pyproject.toml excludes them; to move one, delete its
# line (or the file) and run this again. Targets CPython 3.11 on x86_64 Linux with
# glibc >= 2.36 (Debian 12), the machines this project runs on.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-.venv/bin/uv}
compile() {
    "$uv" pip compile pyproject.toml requirements/build.in --quiet --generate-hashes \
        --python-version 3.11 --python-platform x86_64-manylinux_2_36 \
        --custom-compile-command "make lock" "$@"
}
compile --extra dev -o requirements/dev.txt
for extra in coordinator preview gateway processor triton cli; do
    compile --extra "$extra" -c requirements/dev.txt -o "requirements/$extra.txt"
done
echo "locked: $(ls requirements/*.txt | tr '\n' ' ')"
