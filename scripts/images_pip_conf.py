"""Writes the build secrets of `make images` (scripts/images.sh) into a private directory:
`pip.conf`, the host's pip settings that an install inside a build needs (index URLs,
trusted hosts, timeout, retries, proxy), and `ca-certificates.crt`, the CA bundle the
host's pip trusts. The Dockerfile mounts both for the one RUN that installs a lock, so
neither lands in a layer.

Only http(s) indexes travel: a `file://` index or a find-links directory is this host's
disk, which the build does not see (the locks' hashes pin what any index serves). Run
with any Python 3; pip's own view of its settings (`pip config list`) comes from PYTHON.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

SECRET_CA = "/run/secrets/ca-certificates.crt"
URL_KEYS = ("index-url", "extra-index-url")
PLAIN_KEYS = ("trusted-host", "timeout", "default-timeout", "retries", "proxy")
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def pip_settings(python: str) -> dict[str, str]:
    """`pip config list` as {key: value}; later variants (env) override earlier ones."""
    try:
        listed = subprocess.run(
            [python, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section in (":env:", "global", "install") and value:
            settings[key] = str(ast.literal_eval(value))
    return settings


def main(directory: Path, python: str) -> None:
    settings = pip_settings(python)
    lines = ["[global]"]
    for key in URL_KEYS:
        urls = [u for u in settings.get(key, "").split() if u.startswith(("http://", "https://"))]
        if urls:
            lines.append(f"{key} = {' '.join(urls)}")
    for key in PLAIN_KEYS:
        if settings.get(key):
            lines.append(f"{key} = {settings[key]}")
    proxy = os.environ.get("https_proxy") or os.environ.get("HTTPS_PROXY")
    if proxy and "proxy" not in settings:
        lines.append(f"proxy = {proxy}")
    bundle = next(
        (
            Path(p)
            for p in (
                settings.get("cert"),
                os.environ.get("REQUESTS_CA_BUNDLE"),
                os.environ.get("SSL_CERT_FILE"),
                SYSTEM_BUNDLE,
            )
            if p and Path(p).is_file()
        ),
        None,
    )
    target = directory / "ca-certificates.crt"
    if bundle is not None:
        shutil.copyfile(bundle, target)
        lines.append(f"cert = {SECRET_CA}")
    else:
        target.write_bytes(b"")
    (directory / "pip.conf").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), os.environ.get("PIP_PYTHON", sys.executable))
