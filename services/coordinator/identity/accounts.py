"""Users, sessions and keys as an admin manages them, and the policy revision
(docs/concepts.md): the identity room's rows and its `Accounts` service.

Every method takes the caller's principal and checks it holds `admin`. Sessions and keys
are made by `insert_session` and `insert_key` (CreateSession and Login, CreateKey, a
user's own keys and `create-admin-key` all make theirs there). Whether the devices and
cameras a grant names exist is the resources room's knowledge: identity asks through the
`GrantTargets` check it is given (app.py wires resources' check), so it never reads their
tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Grant, Principal, ScopeName
from services.coordinator.identity.auth_params import KeyCreate
from services.coordinator.identity.passwords import Passwords, check_new_password
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import (
    Connection,
    Database,
    Row,
    bind,
    fetch_all,
    fetch_one,
    sql,
)
from services.coordinator.platform.errors import IdConflict, InvalidField, NotFound, StaleRevision
from services.coordinator.platform.fields import check_id
from workshop.kit.errors import FailedPrecondition

DEFAULT_SESSION_TTL = timedelta(hours=12)
MAX_SESSION_TTL = timedelta(days=30)

R = TypeVar("R", bound="Row")

# NotFound unless every device and camera the grants name exists, read in the caller's
# transaction (`connection`).
GrantTargets = Callable[[Connection, Sequence[Grant]], Awaitable[None]]


@dataclasses.dataclass(frozen=True, slots=True)
class UserRow(Row):
    user_id: str
    display_name: str
    created_at: datetime
    disabled_at: datetime | None
    has_password: bool  # never the hash itself


@dataclasses.dataclass(frozen=True, slots=True)
class SessionRow(Row):
    session_id: str
    user_id: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class KeyRow(Row):
    key_id: str
    name: str
    user_id: str | None
    scopes: list[dict[str, object]]  # Grant.to_json of each grant (jsonb)
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    @property
    def grants(self) -> tuple[Grant, ...]:
        return tuple(Grant.from_json(value) for value in self.scopes)


def login_subject(user_id: str) -> str:
    """The throttle's subject for a user's failed logins (table login_failures)."""
    return f"user:{user_id}"


def _require_admin(principal: Principal) -> None:
    auth.require(principal, ScopeName.ADMIN)


class Accounts:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        grant_targets: GrantTargets,
        passwords: Passwords | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.grant_targets = grant_targets
        self.passwords = passwords or Passwords()

    async def create_user(self, who: Principal, user_id: str, display_name: str) -> UserRow:
        _require_admin(who)
        check_id("user_id", user_id)
        row = await self._one(
            UserRow, sql("auth", "user_create"), user_id, display_name, self.clock.now()
        )
        if row is not None:
            return row
        existing = await self._one(UserRow, sql("auth", "user_get"), user_id)
        assert existing is not None  # the insert found it
        if existing.display_name != display_name:
            raise IdConflict(f"User {user_id!r} exists with another display name.")
        return existing

    async def disable_user(self, who: Principal, user_id: str) -> UserRow:
        _require_admin(who)
        row = await self._one(UserRow, sql("auth", "user_disable"), user_id, self.clock.now())
        if row is None:
            raise NotFound("user", user_id, f"User {user_id!r} does not exist.")
        return row

    async def set_user_password(self, who: Principal, user_id: str, password: str) -> UserRow:
        """Stores the argon2id hash of a new password and clears the user's counted login
        failures. The password is never logged, stored or quoted."""
        _require_admin(who)
        check_new_password(password)
        if await self._one(UserRow, sql("auth", "user_get"), user_id) is None:
            raise NotFound("user", user_id, f"User {user_id!r} does not exist.")
        digest = await self.passwords.hash(password)
        row = await self._one(
            UserRow, sql("auth", "user_set_password"), user_id, digest, login_subject(user_id)
        )
        if row is None:  # gone meanwhile (users are never deleted today)
            raise NotFound("user", user_id, f"User {user_id!r} does not exist.")
        return row

    async def create_session(
        self, who: Principal, user_id: str, ttl: timedelta | None
    ) -> tuple[SessionRow, str]:
        _require_admin(who)
        lifetime = ttl if ttl else DEFAULT_SESSION_TTL
        if not timedelta(0) < lifetime <= MAX_SESSION_TTL:
            raise InvalidField("A session's ttl must be positive and at most 30 days.")
        user = await self._one(UserRow, sql("auth", "user_get"), user_id)
        if user is None:
            raise NotFound("user", user_id, f"User {user_id!r} does not exist.")
        if user.disabled_at is not None:
            raise FailedPrecondition(f"User {user_id!r} is disabled.", reason="AUTHORITY_REVOKED")
        async with self.db.connection() as connection:
            return await insert_session(connection, user_id, lifetime, self.clock.now())

    async def revoke_session(self, who: Principal, session_id: str) -> SessionRow:
        _require_admin(who)
        row = await self._one(
            SessionRow, sql("auth", "session_revoke"), session_id, self.clock.now()
        )
        if row is None:
            raise NotFound("session", session_id, f"Session {session_id!r} does not exist.")
        return row

    async def create_key(
        self,
        who: Principal,
        *,
        name: str,
        grants: Sequence[Grant],
        user_id: str,
        ttl: timedelta | None,
    ) -> tuple[KeyRow, str]:
        _require_admin(who)
        checked = auth.validate_grants(grants)
        if ttl is not None and ttl <= timedelta(0):
            raise InvalidField("ttl must be positive.")
        async with self.db.transaction() as connection:
            await check_grant_targets(connection, checked, user_id, self.grant_targets)
            return await insert_key(connection, name, checked, user_id, ttl, self.clock.now())

    async def revoke_key(self, who: Principal, key_id: str) -> KeyRow:
        _require_admin(who)
        row = await self._one(KeyRow, sql("auth", "key_revoke"), key_id, self.clock.now())
        if row is None:
            raise NotFound("key", key_id, f"Key {key_id!r} does not exist.")
        return row

    async def list_keys(
        self,
        who: Principal,
        include_revoked: bool,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[KeyRow]:
        _require_admin(who)
        after_at, after_id = after if after else (None, None)
        return await self._all(
            KeyRow, sql("auth", "key_list"), include_revoked, after_at, after_id, limit
        )

    async def policy_revision(self, who: Principal) -> int:
        _require_admin(who)
        revision = await self._revision(sql("auth", "policy_get"))
        assert revision is not None  # the policy table holds its one row
        return revision

    async def raise_policy_revision(self, who: Principal, expected: int | None) -> int:
        _require_admin(who)
        revision = await self._revision(sql("auth", "policy_raise"), expected)
        if revision is None:
            current = await self._revision(sql("auth", "policy_get"))
            raise StaleRevision(
                f"The policy revision is {current}, not {expected}.",
                metadata={"current_revision": str(current)},
            )
        return int(revision)

    # helpers ----------------------------------------------------------------------------------

    async def _all(self, row: type[R], query: str, *args: object) -> list[R]:
        async with self.db.connection() as connection:
            return await fetch_all(connection, row, query, *args)

    async def _one(self, row: type[R], query: str, *args: object) -> R | None:
        async with self.db.connection() as connection:
            return await fetch_one(connection, row, query, *args)

    async def _revision(self, query: str, *args: object) -> int | None:
        """The policy revision `query` answers (None: a raise that found another)."""
        async with self.db.connection() as connection:
            revision: int | None = await connection.fetchval(query, *args)
            return revision


async def check_grant_targets(
    connection: Connection, grants: Sequence[Grant], user_id: str, targets: GrantTargets
) -> None:
    """NotFound unless the user (when one is named) and every device and camera the grants
    name exist."""
    if user_id and await connection.fetchrow(sql("auth", "user_get"), user_id) is None:
        raise NotFound("user", user_id, f"User {user_id!r} does not exist.")
    await targets(connection, grants)


async def insert_session(
    connection: Connection, user_id: str, lifetime: timedelta, now: datetime
) -> tuple[SessionRow, str]:
    """Stores a new session of `user_id` (checked to exist and be enabled by the caller);
    returns its row and its secret (shown once). CreateSession and Login both make their
    sessions here."""
    session_id, secret, digest = auth.new_credential(auth.SESSION_PREFIX)
    row = await fetch_one(
        connection,
        SessionRow,
        sql("auth", "session_create"),
        session_id,
        user_id,
        digest,
        now,
        now + lifetime,
    )
    assert row is not None  # an insert returns its row
    return row, secret


async def insert_key(
    connection: Connection,
    name: str,
    grants: Sequence[Grant],
    user_id: str,
    ttl: timedelta | None,
    now: datetime,
) -> tuple[KeyRow, str]:
    """Stores a new key; returns its row and its secret (shown once)."""
    key_id, secret, digest = auth.new_credential(auth.KEY_PREFIX)
    row = await fetch_one(
        connection,
        KeyRow,
        *bind(
            KeyCreate(
                key_id=key_id,
                name=name,
                user_id=user_id or None,
                secret_hash=digest,
                scopes=[grant.to_json() for grant in grants],
                created_at=now,
                expires_at=now + ttl if ttl else None,
            )
        ),
    )
    assert row is not None  # an insert returns its row
    return row, secret
