"""Generate Python contracts (+ .pyi stubs) from proto/ into an output root.

`python -m scripts.gen_proto [OUT_ROOT]` writes `OUT_ROOT/workshop/v1/*`; the
default root is `libs/`. The test for drift calls `generate()` into a
temporary folder and compares.

The output depends on the generators' versions (grpcio-tools bundles protoc and
stamps its version into every file), so generation refuses to run with other
versions of them than the lock requirements/dev.txt names.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from importlib import metadata
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
PACKAGE_DIR = Path("workshop") / "v1"
# descriptors.binpb: the contracts with their comments (source info), which server
# reflection serves so that `grpcurl describe` shows them (workshop.kit.reflection).
DESCRIPTOR_SET = "descriptors.binpb"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi", DESCRIPTOR_SET)
LOCK = REPO / "requirements" / "dev.txt"
GENERATORS = ("grpcio-tools", "mypy-protobuf")


def locked_version(package: str) -> str:
    """The version of `package` pinned in the lock."""
    found = re.search(rf"^{re.escape(package)}==(\S+)", LOCK.read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"{package} is not pinned in {LOCK}")
    return found.group(1)


def check_generators() -> None:
    """Refuse to generate with generator versions other than the lock's."""
    wrong = [
        f"{package} {metadata.version(package)} (the lock says {locked_version(package)})"
        for package in GENERATORS
        if metadata.version(package) != locked_version(package)
    ]
    if wrong:
        raise SystemExit(f"installed {', '.join(wrong)}: run `make setup` to install the lock")


def generate(out_root: Path) -> list[Path]:
    """Write every generated file for proto/workshop/v1 under `out_root`; returns them."""
    check_generators()
    target = out_root / PACKAGE_DIR
    target.mkdir(parents=True, exist_ok=True)
    for stale in target.iterdir():
        if stale.name.endswith(GENERATED_SUFFIXES):
            stale.unlink()
    sources = sorted(str(path.relative_to(PROTO_ROOT)) for path in PROTO_ROOT.rglob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    # protoc finds the mypy-protobuf plugins on PATH: make sure ours come first.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        f"--descriptor_set_out={target / DESCRIPTOR_SET}",
        "--include_source_info",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    (target / "__init__.py").write_text('"""Generated contracts: run `make proto`."""\n')
    (out_root / "workshop" / "__init__.py").touch(exist_ok=True)
    return sorted(path for path in target.iterdir() if path.is_file())


def main() -> None:
    out_root = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "libs"
    for path in generate(out_root):
        print(path.relative_to(out_root))
    shutil.rmtree(REPO / "libs" / "workshop" / "v1" / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
