"""Users' passwords: argon2id hashes (argon2-cffi's PasswordHasher, at its default cost).

Unlike key and session secrets, which are random and need only SHA-256, a password is
chosen by a person, so it is stored as a slow, salted argon2id hash in argon2's encoded
form (parameters and salt included, so a later cost still checks older hashes, which a
successful login then replaces). Hashing takes about 0.1 s of CPU and 64 MiB: it runs in
a worker thread (`asyncio.to_thread`), at most `HASHES_AT_ONCE` at a time, so the event
loop keeps serving every other call.

A login of an unknown user, or of a user without a password, is checked against a
fixed dummy hash with the same parameters, so its answer takes as long as a wrong
password's.
"""

from __future__ import annotations

import asyncio
import secrets
import unicodedata

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from services.coordinator.platform.errors import InvalidField

MIN_PASSWORD_BYTES = 12
MAX_PASSWORD_BYTES = 1024
# Hashes in flight per coordinator process (each holds 64 MiB while it runs).
HASHES_AT_ONCE = 4
# A hash of a random password nobody knows, at argon2-cffi's default parameters
# (m=65536, t=3, p=4): what a login without a stored hash is checked against.
DUMMY_HASH = (
    "$argon2id$v=19$m=65536,t=3,p=4$ICDQ5IlqT2lEpeDr+wFryg$"
    "AIUXBcz0f/O2TSm0jMYpLlq+4FGmqQJKQ+Y8ixijktY"
)


def check_new_password(password: str) -> str:
    """A password an admin sets: 12 to 1024 bytes of UTF-8 and no control character.
    The message never quotes it."""
    size = len(password.encode())
    if not MIN_PASSWORD_BYTES <= size <= MAX_PASSWORD_BYTES:
        raise InvalidField(
            f"password must be {MIN_PASSWORD_BYTES} to {MAX_PASSWORD_BYTES} bytes of UTF-8 "
            f"(got {size}).",
            metadata={"field": "password"},
        )
    if any(unicodedata.category(character) == "Cc" for character in password):
        raise InvalidField(
            "password must not contain control characters (tabs, newlines and the like).",
            metadata={"field": "password"},
        )
    return password


def check_login_password(password: str) -> str:
    """A password as typed at login: present and not over the limit (a short one is
    checked, and fails, like any wrong one)."""
    if not password:
        raise InvalidField("password is required.", metadata={"field": "password"})
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise InvalidField(
            f"password is at most {MAX_PASSWORD_BYTES} bytes.", metadata={"field": "password"}
        )
    return password


def _normalized(password: str) -> bytes:
    # The same characters typed on different systems may arrive composed or decomposed.
    return unicodedata.normalize("NFC", password).encode()


class Passwords:
    """Hashes and checks passwords off the event loop."""

    def __init__(self, hasher: PasswordHasher | None = None) -> None:
        self._hasher = hasher or PasswordHasher()
        self._slots = asyncio.Semaphore(HASHES_AT_ONCE)
        # The fixed dummy where new hashes get its parameters, else one made with theirs.
        self._dummy = (
            DUMMY_HASH
            if not self._hasher.check_needs_rehash(DUMMY_HASH)
            else self._hasher.hash(secrets.token_urlsafe(32))
        )

    async def hash(self, password: str) -> str:
        async with self._slots:
            return await asyncio.to_thread(self._hasher.hash, _normalized(password))

    async def verify(self, stored: str | None, password: str) -> bool:
        """Whether `password` matches the `stored` hash; with none stored (unknown user, no
        password) the dummy hash is checked all the same, and the answer is False."""
        async with self._slots:
            matches = await asyncio.to_thread(self._verify, stored or self._dummy, password)
        return matches and stored is not None

    def needs_rehash(self, stored: str) -> bool:
        """Whether `stored` was made with other parameters than new hashes get."""
        return self._hasher.check_needs_rehash(stored)

    def _verify(self, stored: str, password: str) -> bool:
        try:
            return self._hasher.verify(stored, _normalized(password))
        except (VerificationError, InvalidHashError):
            return False
