"""Canonical JSON, SHA-256 and the runtime id of docs/concepts.md."""

from __future__ import annotations

import hashlib
from pathlib import Path

import services.processor
from workshop.kit import processor_manifest
from workshop.kit.hashing import canonical_json, runtime_id, sha256_hex, tree_sha256


def test_canonical_json_sorts_keys_without_spaces() -> None:
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"é"],"b":1}'.encode()


def test_runtime_id_follows_the_spec() -> None:
    text = '{"code_sha256":"abc","device_id":"gpu-box","engine":"workshop-processor"}'
    expected = "workshop-" + hashlib.sha256(text.encode()).hexdigest()[:32]
    got = runtime_id(engine="workshop-processor", device_id="gpu-box", code_sha256="abc")
    assert got == expected
    assert len(got) == len("workshop-") + 32


def test_sha256_hex() -> None:
    assert sha256_hex(b"") == hashlib.sha256(b"").hexdigest()


def _tree(root: Path, files: dict[str, bytes]) -> str:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return tree_sha256(root, [root / name for name in files])


def test_tree_digest_changes_with_any_content_or_name(tmp_path: Path) -> None:
    base = _tree(tmp_path / "a", {"x.py": b"one", "pkg/y.py": b"two"})
    assert base == _tree(tmp_path / "b", {"pkg/y.py": b"two", "x.py": b"one"})
    assert base != _tree(tmp_path / "c", {"x.py": b"one", "pkg/y.py": b"tw0"})
    assert base != _tree(tmp_path / "d", {"z.py": b"one", "pkg/y.py": b"two"})
    # bytes moved across a file boundary still change the digest
    assert base != _tree(tmp_path / "e", {"x.py": b"onet", "pkg/y.py": b"wo"})


def test_processor_manifest_changes_when_its_source_changes(tmp_path: Path) -> None:
    root = tmp_path / "processor"
    root.mkdir()
    (root / "loop.py").write_text("x = 1\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "loop.cpython-311.pyc").write_bytes(b"cache")
    before = processor_manifest.manifest_for("gpu-box", root)
    (root / "__pycache__" / "loop.cpython-311.pyc").write_bytes(b"other cache")
    assert processor_manifest.manifest_for("gpu-box", root) == before
    (root / "loop.py").write_text("x = 2\n")
    after = processor_manifest.manifest_for("gpu-box", root)
    assert after["code_sha256"] != before["code_sha256"]
    assert after["runtime_id"] != before["runtime_id"]
    assert after["runtime_id"] == runtime_id(
        engine=processor_manifest.ENGINE, device_id="gpu-box", code_sha256=after["code_sha256"]
    )


def test_processor_manifest_hashes_the_installed_processor_package() -> None:
    # The manifest lives in the kit, so its default root is found by name, not beside it.
    package = Path(services.processor.__file__).resolve().parent
    assert processor_manifest.package_root() == package
    assert processor_manifest.code_sha256() == processor_manifest.code_sha256(package)
    digest = tree_sha256(package, processor_manifest.source_files(package))
    assert processor_manifest.manifest_for("gpu-box")["code_sha256"] == digest
    assert processor_manifest.registration("gpu-box").code_sha256 == digest
