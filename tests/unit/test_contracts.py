"""The committed generated contracts are exactly what `make proto` produces."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import gen_proto
from scripts.gen_proto import GENERATED_SUFFIXES, REPO, generate

COMMITTED = REPO / "libs" / "workshop" / "v1"


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    fresh = {path.name: path.read_bytes() for path in generate(tmp_path)}
    committed = {
        path.name: path.read_bytes()
        for path in COMMITTED.iterdir()
        if path.name.endswith(GENERATED_SUFFIXES) or path.name == "__init__.py"
    }
    assert sorted(fresh) == sorted(committed), "run `make proto` and commit the result"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"out of date, run `make proto`: {stale}"


def test_every_proto_has_generated_code() -> None:
    protos = sorted(path.stem for path in (REPO / "proto" / "workshop" / "v1").glob("*.proto"))
    assert protos, "no contracts found"
    for stem in protos:
        assert (COMMITTED / f"{stem}_pb2.py").exists()
        assert (COMMITTED / f"{stem}_pb2.pyi").exists()


def test_the_installed_generators_are_the_locked_ones() -> None:
    gen_proto.check_generators()


def test_generation_refuses_generators_other_than_the_locked_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "dev.txt"
    lock.write_text("grpcio-tools==0.0.1 \\\n    --hash=sha256:00\nmypy-protobuf==0.0.2\n")
    monkeypatch.setattr(gen_proto, "LOCK", lock)
    with pytest.raises(SystemExit, match=r"grpcio-tools .* \(the lock says 0\.0\.1\)"):
        generate(tmp_path / "out")
    assert not (tmp_path / "out").exists()
