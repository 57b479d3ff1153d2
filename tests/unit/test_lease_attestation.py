"""Signing and verifying lease attestations (workshop.kit.lease_attestation): each check
both ways, on the exact bytes signed."""

from __future__ import annotations

import hmac

from google.protobuf.timestamp_pb2 import Timestamp

from workshop.kit.lease_attestation import (
    MIN_KEY_CHARS,
    SKEW_SECONDS,
    credential_sha256,
    key_problem,
    sign,
    verify,
)
from workshop.v1 import common_pb2
from workshop.v1 import publication_pb2 as pub

KEY = b"k" * MIN_KEY_CHARS
SECRET = "processor-secret"
CODE = "c" * 64
NOW = 1_800_000_000.0
LEASE = common_pb2.LeaseRef(run_id="r1", job_id="j0", generation=2, token="tok")
FACTS = pub.CheckLeaseResponse(
    lease_expires_at=Timestamp(seconds=int(NOW) + 300),
    mode=common_pb2.RUN_MODE_FULL,
    kind=common_pb2.RUN_KIND_WORKFLOW,
    camera_id="cam",
    slot_count=120,
    checked_at=Timestamp(seconds=int(NOW)),
)


def claims(valid_for: float = 10.0, **changes: object) -> pub.LeaseClaims:
    until = NOW + valid_for
    values: dict[str, object] = {
        "lease": LEASE,
        "credential_sha256": credential_sha256(SECRET),
        "code_sha256": CODE,
        "facts": FACTS,
        "valid_until": Timestamp(seconds=int(until), nanos=int(until % 1 * 1e9)),
    }
    values.update(changes)
    return pub.LeaseClaims(**values)  # type: ignore[arg-type]


def verified(
    attestation: pub.LeaseAttestation,
    *,
    key: bytes = KEY,
    lease: common_pb2.LeaseRef = LEASE,
    code: str = CODE,
    secret: str = SECRET,
    now: float = NOW,
    longest: float = 10.0,
) -> tuple[pub.CheckLeaseResponse | None, str]:
    verdict = verify(
        key,
        attestation,
        lease=lease,
        code_sha256=code,
        credential=secret,
        now=now,
        longest_seconds=longest,
    )
    return verdict.facts, verdict.reason


def test_a_signed_statement_verifies_and_gives_its_facts() -> None:
    assert verified(sign(KEY, claims())) == (FACTS, "")
    # one second before its end, by the verifier's clock
    assert verified(sign(KEY, claims()), now=NOW + 9)[0] == FACTS


def test_a_statement_signed_with_another_key_or_changed_after_signing_is_not_taken() -> None:
    assert verified(sign(b"x" * MIN_KEY_CHARS, claims())) == (None, "mac")
    signed = sign(KEY, claims())
    assert verified(signed, key=b"x" * MIN_KEY_CHARS) == (None, "mac")
    tampered_mac = pub.LeaseAttestation(claims=signed.claims, mac=bytes(32))
    assert verified(tampered_mac) == (None, "mac")
    # claims of another lease under this lease's MAC
    other = claims(lease=common_pb2.LeaseRef(run_id="r1", job_id="j1", generation=2, token="x"))
    swapped = pub.LeaseAttestation(claims=other.SerializeToString(), mac=signed.mac)
    assert verified(swapped) == (None, "mac")
    assert verified(pub.LeaseAttestation()) == (None, "mac")


def test_the_mac_covers_the_bytes_sent_and_unparsable_bytes_are_not_taken() -> None:
    junk = b"\xff\xff\xff"
    assert verified(pub.LeaseAttestation(claims=junk, mac=sign(KEY, claims()).mac)) == (
        None,
        "mac",
    )
    signed_junk = pub.LeaseAttestation(claims=junk, mac=hmac.digest(KEY, junk, "sha256"))
    assert verified(signed_junk) == (None, "unparsable")


def test_a_statement_is_only_for_its_own_lease_code_and_caller() -> None:
    signed = sign(KEY, claims())
    for other in (
        common_pb2.LeaseRef(run_id="r2", job_id="j0", generation=2, token="tok"),
        common_pb2.LeaseRef(run_id="r1", job_id="j1", generation=2, token="tok"),
        common_pb2.LeaseRef(run_id="r1", job_id="j0", generation=3, token="tok"),
        common_pb2.LeaseRef(run_id="r1", job_id="j0", generation=2, token="other"),
    ):
        assert verified(signed, lease=other) == (None, "lease")
    assert verified(signed, code="d" * 64) == (None, "code")
    assert verified(signed, secret="another-processor") == (None, "credential")


def test_a_statement_holds_only_before_its_end_and_never_longer_than_the_verifier_allows() -> None:
    signed = sign(KEY, claims(valid_for=0.001))
    assert verified(signed)[0] == FACTS
    assert verified(signed, now=NOW + 0.001) == (None, "expired")
    assert verified(sign(KEY, claims(valid_for=10.0)), now=NOW + 10) == (None, "expired")
    # an end beyond the verifier's own reuse (+ skew) is a clock apart or a longer claim
    assert verified(sign(KEY, claims(valid_for=10 + SKEW_SECONDS)))[0] == FACTS
    assert verified(sign(KEY, claims(valid_for=10 + SKEW_SECONDS + 0.01))) == (
        None,
        "too_far_ahead",
    )
    assert verified(sign(KEY, claims()), longest=5.0) == (None, "too_far_ahead")
    assert verified(sign(KEY, claims()), now=NOW - 3600) == (None, "too_far_ahead")


def test_a_statement_without_facts_is_not_taken() -> None:
    bare = claims()
    bare.ClearField("facts")
    assert verified(sign(KEY, bare)) == (None, "no_facts")


def test_the_key_setting_is_empty_or_long_enough() -> None:
    assert key_problem("") is None
    assert key_problem("a" * MIN_KEY_CHARS) is None
    assert key_problem("a" * (MIN_KEY_CHARS - 1)) is not None
    assert key_problem(" " + "a" * MIN_KEY_CHARS) is not None
