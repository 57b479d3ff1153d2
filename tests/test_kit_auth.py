"""Bearer credentials in metadata."""

from __future__ import annotations

import pytest

from workshop.kit.auth import bearer_metadata, bearer_secret
from workshop.kit.errors import Unauthenticated


def test_round_trip() -> None:
    assert bearer_secret(bearer_metadata("wk_abc")) == "wk_abc"
    assert bearer_secret([("Authorization", b"bearer wk_abc")]) == "wk_abc"


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ([], "CREDENTIAL_MISSING"),
        ([("authorization", "Basic abc")], "CREDENTIAL_MALFORMED"),
        ([("authorization", "Bearer")], "CREDENTIAL_MALFORMED"),
        ([("authorization", "Bearer a"), ("authorization", "Bearer b")], "CREDENTIAL_MALFORMED"),
    ],
)
def test_refusals(metadata: list[tuple[str, str]], reason: str) -> None:
    with pytest.raises(Unauthenticated) as caught:
        bearer_secret(metadata)
    assert caught.value.reason == reason


def test_refuses_to_build_bad_metadata() -> None:
    with pytest.raises(ValueError, match="bearer secret"):
        bearer_metadata("two words")
