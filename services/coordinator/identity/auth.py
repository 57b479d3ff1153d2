"""Who is calling, and may they? (Principals, scopes and revocation: docs/concepts.md.)

Secrets are random 256-bit tokens shown once; only their SHA-256 is stored, so
a lookup is one indexed query (a slow password hash would tax every call, and
adds nothing for random secrets). Prefixes tell keys (`wk_`) from sessions
(`ws_`).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from services.coordinator.platform.db import Connection, Row, fetch_one, sql
from services.coordinator.platform.errors import CredentialRejected, InvalidField, ScopeMissing
from workshop.kit.hashing import sha256_hex
from workshop.v1 import common_pb2

KEY_PREFIX = "wk_"
SESSION_PREFIX = "ws_"
# How long a principal read from the database may be reused, in seconds of real time
# (COORDINATOR_PRINCIPAL_CACHE_SECONDS). Only calls whose SQL re-checks the caller's key
# in the transaction that writes use the cache (`servicers.common.Authenticator.cached`),
# so a revocation through another replica is never outrun by a write; it can delay the
# UNAUTHENTICATED answer to such a call by at most this long.
PRINCIPAL_CACHE_SECONDS = 5.0
PRINCIPAL_CACHE_MAX_SECONDS = 5.0


class ScopeName(StrEnum):
    WORKSHOP = "workshop"
    FOOTAGE_READ = "footage:read"
    WORKSHOP_RUN = "workshop:run"
    ADMIN = "admin"
    SERVICE = "service"
    # The gateway process: Login, and GetRun/WatchRun of any run (docs/concepts.md).
    GATEWAY = "gateway"


@dataclasses.dataclass(frozen=True)
class Grant:
    """One scope of a key; device_id and camera_ids qualify the bound scopes."""

    scope: ScopeName
    device_id: str = ""
    camera_ids: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {"scope": self.scope.value}
        if self.device_id:
            value["device_id"] = self.device_id
        if self.camera_ids:
            value["camera_ids"] = list(self.camera_ids)
        return value

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Grant:
        return cls(
            ScopeName(value["scope"]),
            value.get("device_id", ""),
            tuple(value.get("camera_ids", ())),
        )


@dataclasses.dataclass(frozen=True)
class Principal:
    """An authenticated caller: a website session, an API key, or the scheduler."""

    kind: str  # "session" | "key" | "scheduler"
    user_id: str = ""
    session_id: str = ""
    key_id: str = ""
    display_name: str = ""
    grants: tuple[Grant, ...] = ()
    # When the credential stops authenticating by itself (None: never); a principal
    # held in cache is checked against it on every use.
    expires_at: datetime | None = None

    def has(self, scope: ScopeName) -> bool:
        return any(grant.scope is scope for grant in self.grants)

    @property
    def is_admin(self) -> bool:
        return self.has(ScopeName.ADMIN)

    def to_json(self) -> dict[str, str]:
        """What a run records as its creator (fence 3 reads it back)."""
        return {
            "kind": self.kind,
            "user_id": self.user_id,
            "session_id": self.session_id,
            "key_id": self.key_id,
            "display_name": self.display_name,
        }


# The daily scheduler creates runs under its own principal; its authority
# ends only when the policy revision is raised (fence 3).
SCHEDULER = Principal(
    kind="scheduler", display_name="scheduler", grants=(Grant(ScopeName.WORKSHOP),)
)


@dataclasses.dataclass(frozen=True, slots=True)
class SessionCredential(Row):
    """A session found by its secret, with its user's standing."""

    session_id: str
    user_id: str
    expires_at: datetime
    revoked_at: datetime | None
    user_disabled_at: datetime | None
    display_name: str


@dataclasses.dataclass(frozen=True, slots=True)
class KeyCredential(Row):
    """A key found by its secret, with its user's standing (a key may have no user)."""

    key_id: str
    user_id: str | None
    scopes: list[dict[str, object]]  # Grant.to_json of each grant (jsonb)
    expires_at: datetime | None
    revoked_at: datetime | None
    user_disabled_at: datetime | None
    display_name: str


def new_credential(prefix: str) -> tuple[str, str, str]:
    """A fresh (id, secret, hash to store). The id leads the secret, so logs and people can
    name a credential without holding it: `wk_3fa9c2e17b04d6a8.<256 random bits>`."""
    identifier = prefix + secrets.token_hex(8)
    secret = f"{identifier}.{secrets.token_urlsafe(32)}"
    return identifier, secret, sha256_hex(secret.encode())


# What the holder of a rejected credential can do: a key is not signed into again.
KEY_ADVICE = "use a valid key (an admin, or the key's owner, can create one)"
SESSION_ADVICE = "sign in again"
DISABLED_ADVICE = "only an admin can help"


def rejected(what: str, advice: str = KEY_ADVICE) -> CredentialRejected:
    return CredentialRejected(f"The {what}; {advice}.")


async def authenticate(connection: Connection, secret: str, now: datetime) -> Principal:
    """The principal behind `secret`, or CredentialRejected."""
    digest = sha256_hex(secret.encode())
    if secret.startswith(SESSION_PREFIX):
        session = await fetch_one(
            connection, SessionCredential, sql("auth", "session_by_secret_hash"), digest
        )
        if session is None:
            raise rejected("session is unknown", SESSION_ADVICE)
        if session.revoked_at is not None:
            raise rejected("session was revoked", SESSION_ADVICE)
        if session.expires_at <= now:
            raise rejected("session has expired", SESSION_ADVICE)
        if session.user_disabled_at is not None:
            raise rejected("user is disabled", DISABLED_ADVICE)
        # A website session acts for its user: runs, reviews and all footage.
        return Principal(
            kind="session",
            user_id=session.user_id,
            session_id=session.session_id,
            display_name=session.display_name,
            grants=(Grant(ScopeName.WORKSHOP), Grant(ScopeName.FOOTAGE_READ)),
            expires_at=session.expires_at,
        )
    key = await fetch_one(connection, KeyCredential, sql("auth", "key_by_secret_hash"), digest, now)
    if key is None or not secret.startswith(KEY_PREFIX):
        raise rejected("key is unknown")
    if key.revoked_at is not None:
        raise rejected("key was revoked")
    if key.expires_at is not None and key.expires_at <= now:
        raise rejected("key has expired")
    if key.user_disabled_at is not None:
        raise rejected("key's user is disabled", DISABLED_ADVICE)
    return Principal(
        kind="key",
        user_id=key.user_id or "",
        key_id=key.key_id,
        display_name=key.display_name,
        grants=tuple(Grant.from_json(value) for value in key.scopes),
        expires_at=key.expires_at,
    )


def require(principal: Principal, *scopes: ScopeName) -> None:
    """PermissionDenied unless the principal holds one of `scopes` (admin holds all)."""
    if principal.is_admin or any(principal.has(scope) for scope in scopes):
        return
    names = " or ".join(f"'{scope.value}'" for scope in scopes)
    raise ScopeMissing(f"This call needs a key with scope {names}.")


def cameras_reached(who: Principal, *scopes: ScopeName) -> frozenset[str] | None:
    """The cameras `who` reaches through its grants of `scopes`: None for every camera (a
    session, an admin, or a `workshop` grant bound to no camera), else the union of those
    grants' cameras (empty: none)."""
    if who.kind == "session" or who.is_admin:
        return None
    cameras: set[str] = set()
    for grant in who.grants:
        if grant.scope not in scopes:
            continue
        if grant.scope is ScopeName.WORKSHOP and not grant.camera_ids:
            return None
        cameras.update(grant.camera_ids)
    return frozenset(cameras)


def may_read_camera(reader: Principal, camera_id: str) -> bool:
    """Sessions, admin keys, workshop keys covering the camera, footage:read for it."""
    reach = cameras_reached(reader, ScopeName.WORKSHOP, ScopeName.FOOTAGE_READ)
    return reach is None or camera_id in reach


def validate_grants(grants: Iterable[Grant]) -> tuple[Grant, ...]:
    """The grants of a new key, checked for shape (existence is the store's job)."""
    checked = tuple(grants)
    if not checked:
        raise InvalidField("A key needs at least one scope.")
    for grant in checked:
        if grant.scope is ScopeName.WORKSHOP_RUN and not grant.device_id:
            raise InvalidField("A 'workshop:run' scope must name the device it is bound to.")
        if grant.scope is ScopeName.FOOTAGE_READ and not grant.camera_ids:
            raise InvalidField("A 'footage:read' scope must list the cameras it may read.")
        if grant.scope not in (ScopeName.WORKSHOP_RUN,) and grant.device_id:
            raise InvalidField(f"Scope '{grant.scope.value}' takes no device.")
        if grant.scope is ScopeName.GATEWAY and grant.camera_ids:
            raise InvalidField("Scope 'gateway' takes no cameras.")
    return checked


# A principal as the contract shows it (who created a run, saved a workflow, decided a
# sighting): rooms freeze it into snapshots, and servicers render stored principals.
PRINCIPAL_KINDS = {
    "session": common_pb2.PRINCIPAL_KIND_SESSION,
    "key": common_pb2.PRINCIPAL_KIND_KEY,
    "scheduler": common_pb2.PRINCIPAL_KIND_SCHEDULER,
}


def principal_proto(value: Mapping[str, str]) -> common_pb2.Principal:
    """A stored principal (`Principal.to_json`) as the contract's Principal."""
    return common_pb2.Principal(
        kind=PRINCIPAL_KINDS.get(value.get("kind", ""), common_pb2.PRINCIPAL_KIND_UNSPECIFIED),
        user_id=value.get("user_id", ""),
        session_id=value.get("session_id", ""),
        key_id=value.get("key_id", ""),
        display_name=value.get("display_name", ""),
    )


async def policy_revision_for_run(connection: Connection) -> int:
    """The policy revision a new run records, read FOR SHARE so that raising it waits for
    the admitting transaction (runs and photos call this inside their insert)."""
    revision: int = await connection.fetchval(sql("auth", "policy_revision_share"))
    return revision
