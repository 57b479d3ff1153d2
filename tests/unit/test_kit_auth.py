"""Bearer credentials in metadata."""

from __future__ import annotations

import pytest

from workshop.kit.auth import MAX_SECRET_BYTES, bearer_metadata, bearer_secret
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


def test_a_secret_over_the_bound_is_malformed_and_says_its_length() -> None:
    at_bound = "k" * MAX_SECRET_BYTES
    assert bearer_secret(bearer_metadata(at_bound)) == at_bound
    with pytest.raises(Unauthenticated) as caught:
        bearer_secret(bearer_metadata(at_bound + "k"))
    assert caught.value.reason == "CREDENTIAL_MALFORMED"
    assert f"{MAX_SECRET_BYTES + 1} bytes" in caught.value.message
    assert caught.value.metadata == {
        "limit_bytes": str(MAX_SECRET_BYTES),
        "length_bytes": str(MAX_SECRET_BYTES + 1),
    }
