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

-- The room's public SQL: what leases' fences (7_leases.sql) read of identity. No other
-- room names users, sessions, keys or policy.

-- Whether a key still authenticates: not revoked, not expired, its user (if any) not
-- disabled. The same rules as the coordinator's authentication, read fresh.
-- public: leases (job_claim_many: the claiming key; object_stage, previews_record: the
-- calling service's key)
CREATE FUNCTION key_live_v1(p_key text, p_now timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM keys k LEFT JOIN users u ON u.user_id = k.user_id
        WHERE k.key_id = p_key AND k.revoked_at IS NULL
          AND (k.expires_at IS NULL OR k.expires_at > p_now) AND u.disabled_at IS NULL);
END;
$$;

-- Fences 3 and 4 (docs/leases-and-fences.md) under row locks, for leases'
-- workshop_fence_reason: the policy revision a run recorded (p_policy_revision) is still
-- the policy's, the run's creator (p_created_by, the principal as the run recorded it)
-- still has authority, and the reporting key is still a workshop:run key for the device
-- p_device (or an admin key) of an enabled user. '' when all hold, else the first that
-- failed: POLICY_CHANGED, AUTHORITY_REVOKED or REPORTER_NOT_AUTHORIZED. The policy, the
-- creator's key or session and user, and the reporting key and its user are taken FOR
-- SHARE, so a concurrent revocation or policy raise waits for the caller's commit.
-- public: leases (workshop_fence_reason)
CREATE FUNCTION fence_authority_v1(
    p_policy_revision bigint, p_created_by jsonb, p_reporter text, p_device text,
    p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    creator_kind text := p_created_by ->> 'kind';
    creator_user text := nullif(p_created_by ->> 'user_id', '');
    reporter_user text;
BEGIN
    PERFORM 1 FROM policy WHERE revision = p_policy_revision FOR SHARE;
    IF NOT FOUND THEN
        RETURN 'POLICY_CHANGED';
    END IF;
    IF creator_kind = 'key' THEN
        PERFORM 1 FROM keys
        WHERE key_id = p_created_by ->> 'key_id' AND revoked_at IS NULL
          AND (expires_at IS NULL OR expires_at > p_now)
        FOR SHARE;
        IF NOT FOUND THEN
            RETURN 'AUTHORITY_REVOKED';
        END IF;
    ELSIF creator_kind = 'session' THEN
        PERFORM 1 FROM sessions
        WHERE session_id = p_created_by ->> 'session_id' AND revoked_at IS NULL
          AND expires_at > p_now
        FOR SHARE;
        IF NOT FOUND THEN
            RETURN 'AUTHORITY_REVOKED';
        END IF;
    ELSIF creator_kind <> 'scheduler' THEN
        RETURN 'AUTHORITY_REVOKED';
    END IF;
    IF creator_user IS NOT NULL THEN
        PERFORM 1 FROM users WHERE user_id = creator_user AND disabled_at IS NULL FOR SHARE;
        IF NOT FOUND THEN
            RETURN 'AUTHORITY_REVOKED';
        END IF;
    END IF;
    SELECT k.user_id INTO reporter_user FROM keys k
    WHERE k.key_id = p_reporter AND k.revoked_at IS NULL
      AND (k.expires_at IS NULL OR k.expires_at > p_now)
      AND (k.scopes @> jsonb_build_array(jsonb_build_object('scope', 'workshop:run',
                                                            'device_id', p_device))
           OR k.scopes @> '[{"scope": "admin"}]')
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN 'REPORTER_NOT_AUTHORIZED';
    END IF;
    IF reporter_user IS NOT NULL THEN
        PERFORM 1 FROM users WHERE user_id = reporter_user AND disabled_at IS NULL FOR SHARE;
        IF NOT FOUND THEN
            RETURN 'REPORTER_NOT_AUTHORIZED';
        END IF;
    END IF;
    RETURN '';
END;
$$;

-- Fence 3 as read without locks, for leases' job_end_unfenced: the policy's revision now,
-- and whether the creator p_created_by (a run's recorded principal) still has its key,
-- its session and its (enabled) user. One row. Inlined where it is used (a single-SELECT
-- STABLE SQL function), so the read costs what the join it replaced did.
-- public: leases (job_end_unfenced)
CREATE FUNCTION creator_authority_v1(p_created_by jsonb, p_now timestamptz)
RETURNS TABLE (policy_now bigint, key_ok boolean, session_ok boolean, user_ok boolean)
LANGUAGE sql STABLE AS $$
    SELECT pol.revision, k.key_id IS NOT NULL, s.session_id IS NOT NULL, u.user_id IS NOT NULL
    FROM policy pol
    LEFT JOIN keys k
        ON p_created_by ->> 'kind' = 'key' AND k.key_id = p_created_by ->> 'key_id'
       AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > p_now)
    LEFT JOIN sessions s
        ON p_created_by ->> 'kind' = 'session' AND s.session_id = p_created_by ->> 'session_id'
       AND s.revoked_at IS NULL AND s.expires_at > p_now
    LEFT JOIN users u
        ON u.user_id = nullif(p_created_by ->> 'user_id', '') AND u.disabled_at IS NULL
$$;
