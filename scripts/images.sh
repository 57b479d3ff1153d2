#!/usr/bin/env bash
# `make images`: every service image, built with podman on this machine from a local
# Debian 12 base (no registry needed), then their sizes. Cached: the base is built once
# per recipe (its tag is the recipe's digest) and each image's layers are podman's layer
# cache, so a second run with nothing changed only checks them.
#
#   localhost/workshop/base:<digest>   mmdebstrap minbase + python3.11, venv, libpython, CAs
#   localhost/workshop/{coordinator,preview,gateway,processor,triton}:$IMAGE_TAG
#
# IMAGE_TAG (default `dev`, the dev overlay's tag) names the images; IMAGES (default all
# five) picks targets. The host's pip settings (index URLs, timeout, proxy) and its CA
# bundle reach the install steps as build secrets (deploy/docker/Dockerfile), never a
# layer. Concurrent runs take turns (flock). docs/deployment.md, "Images".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PODMAN="$ROOT/scripts/podman"
IMAGE_TAG=${IMAGE_TAG:-dev}
IMAGES=${IMAGES:-coordinator preview gateway processor triton}
# pip's view of its settings comes from the venv's pip where there is one.
PIP_PYTHON=${PIP_PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
began=$SECONDS

scripts/system-deps.sh

exec 9>"${TMPDIR:-/tmp}/workshop-images.lock"
flock 9

# The base: Debian 12 minbase with Python 3.11 (and its venv module), the shared
# libpython the Triton python backend stub embeds, and CA certificates.
SUITE=bookworm
PACKAGES=python3.11,python3.11-venv,libpython3.11,ca-certificates
MIRRORS=(
    "deb http://deb.debian.org/debian $SUITE main"
    "deb http://deb.debian.org/debian $SUITE-updates main"
    "deb http://deb.debian.org/debian-security $SUITE-security main"
)
EXCLUDES=(
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
)
recipe=$(printf '%s\n' "$SUITE" "$PACKAGES" "${MIRRORS[@]}" "${EXCLUDES[@]}" | sha256sum)
BASE="localhost/workshop/base:$SUITE-${recipe:0:12}"
if ! "$PODMAN" image exists "$BASE"; then
    echo "images: building the base $BASE (mmdebstrap, about a minute)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mmdebstrap --quiet --variant=minbase --include="$PACKAGES" "${EXCLUDES[@]}" \
        "$SUITE" "$work/rootfs.tar" "${MIRRORS[@]}"
    "$PODMAN" import --quiet "$work/rootfs.tar" "$BASE" >/dev/null
    rm -rf "$work"
    trap - EXIT
fi

# Build secrets: a pip.conf with the host's http(s) index settings, and the CA bundle it
# names, in a private directory removed on exit.
secrets=$(mktemp -d)
trap 'rm -rf "$secrets"' EXIT
chmod 700 "$secrets"
PIP_PYTHON="$PIP_PYTHON" python3 scripts/images_pip_conf.py "$secrets"

for image in $IMAGES; do
    step=$SECONDS
    log="$secrets/$image.log"
    # the image this tag named before: replaced by a changed build, it is removed below, so
    # that rebuilding after every change does not keep a copy of each build on the disk
    before=$("$PODMAN" image inspect --format '{{.Id}}' "localhost/workshop/$image:$IMAGE_TAG" 2>/dev/null || true)
    if ! "$PODMAN" build --layers --quiet -f deploy/docker/Dockerfile --target "$image" \
        --build-arg BASE="$BASE" --build-arg PROCESSOR_BASE="$BASE" \
        --secret id=pip.conf,src="$secrets/pip.conf" \
        --secret id=ca-certificates.crt,src="$secrets/ca-certificates.crt" \
        -t "localhost/workshop/$image:$IMAGE_TAG" . >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "images: $image failed to build" >&2
        exit 1
    fi
    echo "images: $image built in $((SECONDS - step)) s"
    after=$("$PODMAN" image inspect --format '{{.Id}}' "localhost/workshop/$image:$IMAGE_TAG")
    if [ -n "$before" ] && [ "$before" != "$after" ]; then
        "$PODMAN" rmi "$before" >/dev/null 2>&1 || true  # in use by a container: kept
    fi
done

for image in $IMAGES; do
    name="localhost/workshop/$image:$IMAGE_TAG"
    size=$("$PODMAN" image inspect --format '{{.Size}}' "$name")
    printf 'images: %-40s %6d MB\n' "$name" $((size / 1000000))
done
echo "images: done in $((SECONDS - began)) s"
