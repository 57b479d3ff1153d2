"""The committed generated contracts are exactly what `make proto` produces."""

from __future__ import annotations

from pathlib import Path

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
