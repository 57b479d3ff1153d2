"""Signed lease attestations (publication.proto LeaseAttestation), pure: no gRPC, no clock.

The coordinator answers a claim with a statement that the lease held just then, signed
with a secret it shares with the preview service (HMAC-SHA256). The preview service takes
a statement it can verify for the CheckLease answer it would otherwise ask for, for no
longer than it would keep that answer (10 s): so an attestation allows exactly what a
cached CheckLease answer allows, and saves the coordinator a call per job.

The MAC covers the serialized LeaseClaims exactly as sent, so no canonical form is needed:
the verifier parses the bytes it checked. A statement that does not verify is no refusal;
the caller asks CheckLease instead (`Verdict.facts` is None, `Verdict.reason` says why).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac

from google.protobuf.message import DecodeError

from workshop.v1 import common_pb2
from workshop.v1 import publication_pb2 as pub

# Characters a key needs at least: 32 random characters are well over HMAC-SHA256's
# 128-bit security level whatever alphabet a deployment draws them from.
MIN_KEY_CHARS = 32
# How long a statement is valid after the claim: the preview service's CheckLease reuse
# (services/preview/leases.py CHECK_SECONDS).
VALID_SECONDS = 10
# How far a statement's end may lie beyond the verifier's own bound, for clocks that
# differ a little; a clock further off makes every statement fall back, never last longer.
SKEW_SECONDS = 1.0


def key_problem(value: str) -> str | None:
    """A settings check: empty (attestations off), or a secret long enough to sign with."""
    if not value:
        return None
    if len(value) < MIN_KEY_CHARS or any(ch.isspace() for ch in value):
        return f"must be empty (off) or at least {MIN_KEY_CHARS} characters without spaces"
    return None


def credential_sha256(secret: str) -> str:
    """What a statement names its caller by: the hex SHA-256 of its bearer secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def sign(key: bytes, claims: pub.LeaseClaims) -> pub.LeaseAttestation:
    body = claims.SerializeToString()
    return pub.LeaseAttestation(claims=body, mac=hmac.digest(key, body, "sha256"))


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """The lease's facts when the statement verified; else None and why not (for logs)."""

    facts: pub.CheckLeaseResponse | None
    reason: str = ""


def verify(
    key: bytes,
    attestation: pub.LeaseAttestation,
    *,
    lease: common_pb2.LeaseRef,
    code_sha256: str,
    credential: str,
    now: float,
    longest_seconds: float,
) -> Verdict:
    """The facts a statement gives for this request, if its MAC is right, it names this
    lease, code and caller's credential, and `now` (epoch seconds, the verifier's clock)
    lies before its end, which lies at most `longest_seconds` (+ skew) after `now`."""
    expected = hmac.digest(key, attestation.claims, "sha256")
    if not hmac.compare_digest(expected, attestation.mac):
        return Verdict(None, "mac")
    claims = pub.LeaseClaims()
    try:
        claims.ParseFromString(attestation.claims)
    except DecodeError:  # signed by our key, so only a coordinator's bug gets here
        return Verdict(None, "unparsable")
    stated = claims.lease
    if (stated.run_id, stated.job_id, stated.generation, stated.token) != (
        lease.run_id,
        lease.job_id,
        lease.generation,
        lease.token,
    ):
        return Verdict(None, "lease")
    if claims.code_sha256 != code_sha256:
        return Verdict(None, "code")
    if not hmac.compare_digest(claims.credential_sha256, credential_sha256(credential)):
        return Verdict(None, "credential")
    until = claims.valid_until.seconds + claims.valid_until.nanos / 1e9
    if not now < until <= now + longest_seconds + SKEW_SECONDS:
        return Verdict(None, "expired" if until <= now else "too_far_ahead")
    if not claims.HasField("facts"):
        return Verdict(None, "no_facts")
    return Verdict(claims.facts)
