-- Release 0.1, room identity: its tables, indexes, triggers and functions.

-- password_hash: the argon2id hash of the user's password, argon2's encoded form (NULL:
-- no password, no sign-in).
CREATE TABLE users (
    user_id       text PRIMARY KEY,
    display_name  text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL,
    disabled_at   timestamptz,
    password_hash text
);

-- Secrets are random 256-bit values; only their SHA-256 is stored.
CREATE TABLE sessions (
    session_id  text PRIMARY KEY,
    user_id     text NOT NULL REFERENCES users (user_id),
    secret_hash text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);

-- scopes: [{"scope": "workshop"}, {"scope": "footage:read", "camera_ids": [..]},
--          {"scope": "workshop:run", "device_id": ".."}, {"scope": "admin"}, {"scope": "service"},
--          {"scope": "gateway"}]
CREATE TABLE keys (
    key_id       text PRIMARY KEY,
    name         text NOT NULL DEFAULT '',
    user_id      text REFERENCES users (user_id),
    secret_hash  text NOT NULL UNIQUE,
    scopes       jsonb NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz
);

-- A user's own keys, newest first (IdentityService.ListOwnKeys).
CREATE INDEX keys_by_user ON keys (user_id, created_at DESC, key_id DESC)
    WHERE user_id IS NOT NULL;

-- Failed logins (IdentityService.Login), one row per subject ('user:<user id>',
-- 'address:<client address>') per failed attempt; counted over a sliding window, and
-- deleted by the maintenance pass once older than it.
CREATE TABLE login_failures (
    subject    text NOT NULL,
    failed_at  timestamptz NOT NULL,
    attempt_id text NOT NULL,
    PRIMARY KEY (subject, failed_at, attempt_id)
);

CREATE INDEX login_failures_by_time ON login_failures (failed_at);

-- The policy revision (docs/concepts.md): one row; raising it retires in-flight authority.
CREATE TABLE policy (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    revision  bigint NOT NULL CHECK (revision >= 1)
);

INSERT INTO policy (singleton, revision) VALUES (true, 1);

-- Whether a key still authenticates: not revoked, not expired, its user (if any) not
-- disabled. The same rules as the coordinator's authentication, read fresh.
CREATE FUNCTION key_live(p_key text, p_now timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM keys k LEFT JOIN users u ON u.user_id = k.user_id
        WHERE k.key_id = p_key AND k.revoked_at IS NULL
          AND (k.expires_at IS NULL OR k.expires_at > p_now) AND u.disabled_at IS NULL);
END;
$$;
