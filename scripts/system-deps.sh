#!/usr/bin/env bash
# Installs the Debian packages Workshop's tests and demo need, when they are
# missing: PostgreSQL 15 (throwaway clusters), a shared libpython3.11 (the
# Triton python backend stub embeds it) and Chromium (the web console's browser
# tests, tests/system/test_console.py, drive it through Playwright), what `make images`
# and the image tests run: podman with runc (crun refuses hybrid cgroups), catatonit (the
# init of podman's pod infra containers) and mmdebstrap (the local Debian base image), and
# Prometheus for its promtool (deploy/prometheus/'s rules are checked and unit-tested with
# `promtool check rules` and `promtool test rules`, tests/unit/test_alert_rules.py). Does
# nothing when all are present.
set -euo pipefail

missing=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
pylib=$(python3.11 -c 'import sysconfig, os; d = sysconfig.get_config_var("LIBDIR"); print(os.path.exists(os.path.join(d, "libpython3.11.so.1.0")))' 2>/dev/null || echo False)
if [ "$pylib" != "True" ] && ! ldconfig -p 2>/dev/null | grep -q 'libpython3.11.so.1.0'; then
    missing+=(libpython3.11)
fi
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v podman >/dev/null || missing+=(podman)
[ -x /usr/sbin/runc ] || missing+=(runc)
[ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v promtool >/dev/null || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "system-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Debian's prometheus package starts its server (init script) when installed; only
    # promtool is wanted. A policy-rc.d that denies every start keeps it (and any other
    # service) stopped; one the machine already has is left as it is.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    echo "system-deps: please install: ${missing[*]} (apt-get install ${missing[*]})" >&2
    exit 1
fi
