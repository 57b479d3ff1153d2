"""Website sign-in and sign-out, and a user's own Agent keys (docs/concepts.md#signing-in).

Login is the gateway's call (scope `gateway`, or admin): the gateway is trusted to pass
its client's address. Failed logins are counted per user and per client address over a
sliding window, in Postgres (table login_failures), so every replica and every gateway
share the throttle:

1. One short transaction locks both subjects (advisory locks, in one order), refuses
   with LOGIN_THROTTLED when either is at its limit, and otherwise records the attempt
   as a failure of both before the password is checked. Two concurrent guesses at a
   subject's last allowed failure therefore cannot both be checked: the second finds
   the first one's row.
2. The password is checked off the event loop (a dummy hash for an unknown user or one
   without a password, so the answer takes as long).
3. A wrong password keeps the failure; the right one forgets this attempt and clears
   the user's failures (not the address's) in the transaction that creates the session.
   A disabled user's right password is no failure either, but gets no session.

A coordinator that stops between 1 and 3 leaves the attempt counted as a failure.
Requests with a malformed field are refused before step 1 and never count.
"""

from __future__ import annotations

import dataclasses
import math
import re
import secrets
import unicodedata
from collections.abc import Sequence
from datetime import datetime, timedelta

from services.coordinator.identity import auth
from services.coordinator.identity.accounts import (
    DEFAULT_SESSION_TTL,
    GrantTargets,
    KeyRow,
    SessionRow,
    check_grant_targets,
    insert_key,
    insert_session,
    login_subject,
)
from services.coordinator.identity.auth import Grant, Principal, ScopeName
from services.coordinator.identity.auth_params import KeyListOfUser
from services.coordinator.identity.passwords import Passwords, check_login_password
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
from services.coordinator.platform.errors import (
    InvalidField,
    LoginFailed,
    LoginThrottled,
    NotASession,
    NotFound,
    ScopeMissing,
)
from services.coordinator.platform.fields import check_id
from workshop.kit.hashing import sha256_hex

# Scopes a user may grant their own keys; never workshop:run, admin, service or gateway.
OWN_KEY_SCOPES = (ScopeName.WORKSHOP, ScopeName.FOOTAGE_READ)
DEFAULT_OWN_KEY_TTL = timedelta(days=90)
MAX_OWN_KEY_TTL = timedelta(days=365)
MAX_KEY_NAME_CHARACTERS = 100
# A client address as the gateway passes it: IPv4 or IPv6 text (with a zone), a name.
_CLIENT_ADDRESS = re.compile(r"[\x21-\x7e]{1,64}")


LOGIN_WINDOW = timedelta(minutes=15)
LOGIN_USER_FAILURES = 5
LOGIN_ADDRESS_FAILURES = 20


@dataclasses.dataclass(frozen=True)
class LoginLimits:
    """Failed logins allowed per user and per client address within the sliding window
    (COORDINATOR_LOGIN_*)."""

    window: timedelta = LOGIN_WINDOW
    user_failures: int = LOGIN_USER_FAILURES
    address_failures: int = LOGIN_ADDRESS_FAILURES


@dataclasses.dataclass(frozen=True, slots=True)
class LoginUser(Row):
    """What Login reads of a user: the hash to check (None: no password) and standing."""

    user_id: str
    password_hash: str | None
    disabled_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class BlockingFailure(Row):
    """A subject's failure that must leave the window before it may try again (None:
    the subject is below its limit)."""

    subject: str
    blocking_at: datetime | None


async def forget_login_failures(connection: Connection, before: datetime) -> int:
    """Deletes the failed logins recorded before `before` (maintenance's pass, on its own
    connection); returns how many."""
    status = await connection.execute(sql("auth", "login_failures_prune"), before)
    return int(status.split()[-1])  # the status "DELETE <count>"


def address_subject(client_address: str) -> str:
    return f"address:{client_address}"


def check_client_address(value: str) -> str:
    if not _CLIENT_ADDRESS.fullmatch(value):
        raise InvalidField(
            "client_address must be the website client's address: 1 to 64 visible ASCII "
            "characters, no whitespace.",
            metadata={"field": "client_address"},
        )
    return value


def check_key_name(value: str) -> str:
    if not 1 <= len(value) <= MAX_KEY_NAME_CHARACTERS or any(
        unicodedata.category(character) == "Cc" for character in value
    ):
        raise InvalidField(
            f"name must be 1 to {MAX_KEY_NAME_CHARACTERS} characters without control characters.",
            metadata={"field": "name"},
        )
    return value


def _require_session(who: Principal, what: str) -> None:
    if who.kind != "session":
        raise ScopeMissing(
            f"Only a signed-in website user may {what}; a key cannot (an admin manages keys "
            "with OperatorService)."
        )


class IdentityApi:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        passwords: Passwords,
        grant_targets: GrantTargets,
        limits: LoginLimits | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.passwords = passwords
        self.grant_targets = grant_targets
        self.limits = limits or LoginLimits()

    # signing in and out -----------------------------------------------------------------

    async def login(
        self, who: Principal, user_id: str, password: str, client_address: str
    ) -> tuple[SessionRow, str]:
        """A new website session of `user_id` and its secret, for the right password."""
        auth.require(who, ScopeName.GATEWAY)
        check_id("user_id", user_id)
        check_login_password(password)
        check_client_address(client_address)
        subjects = [login_subject(user_id), address_subject(client_address)]
        attempt = secrets.token_hex(8)
        user = await self._count_attempt(user_id, subjects, attempt)
        stored = user.password_hash if user is not None else None
        if user is None or stored is None or not await self.passwords.verify(stored, password):
            if stored is None:  # as long as a wrong password takes
                await self.passwords.verify(None, password)
            raise LoginFailed()  # the attempt stays counted against both subjects
        enabled = user.disabled_at is None
        session: tuple[SessionRow, str] | None = None
        async with self.db.transaction() as connection:
            # no failure; a success also clears the user's earlier ones
            await connection.execute(
                sql("auth", "login_failures_forget"),
                subjects,
                attempt,
                subjects[0] if enabled else None,
            )
            if enabled:
                session = await insert_session(
                    connection, user_id, DEFAULT_SESSION_TTL, self.clock.now()
                )
        if session is None:
            raise auth.rejected("user is disabled", auth.DISABLED_ADVICE)
        if self.passwords.needs_rehash(stored):
            await self._rehash(user_id, stored, password)
        return session

    async def _rehash(self, user_id: str, stored: str, password: str) -> None:
        """Replaces a hash made with older parameters (unless it changed meanwhile)."""
        fresh = await self.passwords.hash(password)
        async with self.db.connection() as connection:
            await connection.execute(sql("auth", "user_rehash_password"), user_id, stored, fresh)

    async def _count_attempt(
        self, user_id: str, subjects: Sequence[str], attempt: str
    ) -> LoginUser | None:
        """Records `attempt` as a failure of every subject, or LoginThrottled when one is at
        its limit; returns the user (None: unknown)."""
        limits = self.limits
        now = self.clock.now()
        async with self.db.transaction() as connection:
            for subject in sorted(subjects):
                await connection.execute(sql("auth", "login_subject_lock"), subject)
            blocking = await fetch_all(
                connection,
                BlockingFailure,
                sql("auth", "login_blocking_failures"),
                list(subjects),
                [limits.user_failures, limits.address_failures],
                now - limits.window,
            )
            waits = [
                failure.blocking_at + limits.window - now
                for failure in blocking
                if failure.blocking_at is not None
            ]
            if waits:
                raise LoginThrottled(max(1, math.ceil(max(waits).total_seconds())))
            await connection.execute(sql("auth", "login_failures_record"), subjects, attempt, now)
            return await fetch_one(connection, LoginUser, sql("auth", "user_login"), user_id)

    async def logout(self, secret: str) -> SessionRow:
        """Revokes the session whose secret this is (already revoked or expired: as it is).
        A key's secret is refused: a valid key with NOT_A_SESSION (a key is revoked
        instead), any other as authenticate refuses it."""
        if not secret.startswith(auth.SESSION_PREFIX):
            async with self.db.connection() as connection:
                await auth.authenticate(connection, secret, self.clock.now())
            raise NotASession(
                "Logout ends a website session; a key is revoked instead "
                "(IdentityService.RevokeOwnKey or OperatorService.RevokeKey)."
            )
        async with self.db.connection() as connection:
            row = await fetch_one(
                connection,
                SessionRow,
                sql("auth", "session_revoke_by_secret_hash"),
                sha256_hex(secret.encode()),
                self.clock.now(),
            )
        if row is None:
            raise auth.rejected("session is unknown", auth.SESSION_ADVICE)
        return row

    # a user's own keys ------------------------------------------------------------------

    async def create_own_key(
        self, who: Principal, *, name: str, grants: Sequence[Grant], ttl: timedelta | None
    ) -> tuple[KeyRow, str]:
        _require_session(who, "create their own keys")
        check_key_name(name)
        for grant in grants:
            if grant.scope not in OWN_KEY_SCOPES:
                raise ScopeMissing(
                    f"A user's own key may not hold scope '{grant.scope.value}'; only "
                    "'workshop' and 'footage:read' (an admin grants the others)."
                )
        checked = auth.validate_grants(grants)
        lifetime = DEFAULT_OWN_KEY_TTL if ttl is None else ttl
        if not timedelta(0) < lifetime <= MAX_OWN_KEY_TTL:
            raise InvalidField(
                "ttl must be positive and at most 365 days.", metadata={"field": "ttl"}
            )
        async with self.db.transaction() as connection:
            await check_grant_targets(connection, checked, who.user_id, self.grant_targets)
            return await insert_key(
                connection, name, checked, who.user_id, lifetime, self.clock.now()
            )

    async def list_own_keys(
        self,
        who: Principal,
        include_revoked: bool,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[KeyRow]:
        _require_session(who, "list their own keys")
        after_at, after_id = after if after else (None, None)
        async with self.db.connection() as connection:
            return await fetch_all(
                connection,
                KeyRow,
                *bind(
                    KeyListOfUser(
                        user_id=who.user_id,
                        include_revoked=include_revoked,
                        now=self.clock.now(),
                        after_at=after_at,
                        after_id=after_id,
                        limit=limit,
                    )
                ),
            )

    async def revoke_own_key(self, who: Principal, key_id: str) -> KeyRow:
        _require_session(who, "revoke their own keys")
        async with self.db.connection() as connection:
            row = await fetch_one(
                connection,
                KeyRow,
                sql("auth", "key_revoke_of_user"),
                key_id,
                who.user_id,
                self.clock.now(),
            )
        if row is None:  # another user's key is not found either
            raise NotFound("key", key_id, f"Key {key_id!r} does not exist.")
        return row
