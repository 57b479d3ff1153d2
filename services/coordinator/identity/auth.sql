-- Credentials, principals and the policy revision.

-- name: key_by_secret_hash
-- Also records the use ($2 = now), at most once a minute per key, in the same round trip.
WITH touched AS (
    UPDATE keys SET last_used_at = $2::timestamptz
    WHERE secret_hash = $1 AND (last_used_at IS NULL OR last_used_at < $2::timestamptz - interval '1 minute')
)
SELECT k.key_id, k.name, k.user_id, k.scopes, k.expires_at, k.revoked_at,
       u.disabled_at AS user_disabled_at, coalesce(u.display_name, k.name) AS display_name
FROM keys k LEFT JOIN users u ON u.user_id = k.user_id
WHERE k.secret_hash = $1;

-- name: session_by_secret_hash
SELECT s.session_id, s.user_id, s.expires_at, s.revoked_at,
       u.disabled_at AS user_disabled_at, u.display_name
FROM sessions s JOIN users u ON u.user_id = s.user_id
WHERE s.secret_hash = $1;

-- A user as operators see it: never the password's hash, only whether there is one.

-- name: user_create
INSERT INTO users (user_id, display_name, created_at) VALUES ($1, $2, $3)
ON CONFLICT (user_id) DO NOTHING
RETURNING user_id, display_name, created_at, disabled_at, password_hash IS NOT NULL AS has_password;

-- name: user_get
SELECT user_id, display_name, created_at, disabled_at, password_hash IS NOT NULL AS has_password
FROM users WHERE user_id = $1;

-- name: user_disable
UPDATE users SET disabled_at = coalesce(disabled_at, $2) WHERE user_id = $1
RETURNING user_id, display_name, created_at, disabled_at, password_hash IS NOT NULL AS has_password;

-- name: user_set_password
-- $2: the new argon2id hash. Also clears the user's counted login failures ($3: the
-- subject 'user:<id>'), in the same statement.
WITH cleared AS (
    DELETE FROM login_failures WHERE subject = $3 AND EXISTS (SELECT 1 FROM users WHERE user_id = $1)
)
UPDATE users SET password_hash = $2 WHERE user_id = $1
RETURNING user_id, display_name, created_at, disabled_at, password_hash IS NOT NULL AS has_password;

-- name: user_rehash_password
-- A stored hash made with older argon2 parameters, replaced after a successful login
-- unless the password was changed meanwhile.
UPDATE users SET password_hash = $3 WHERE user_id = $1 AND password_hash = $2;

-- name: user_login
-- What Login needs of a user: the hash to check and whether they are disabled.
SELECT user_id, password_hash, disabled_at FROM users WHERE user_id = $1;

-- name: session_create
INSERT INTO sessions (session_id, user_id, secret_hash, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: session_revoke
UPDATE sessions SET revoked_at = coalesce(revoked_at, $2) WHERE session_id = $1 RETURNING *;

-- name: session_revoke_by_secret_hash
-- Logout: the calling session, found by its secret, revoked or expired already or not.
UPDATE sessions SET revoked_at = coalesce(revoked_at, $2) WHERE secret_hash = $1 RETURNING *;

-- name: key_create
-- nullable: user_id, expires_at
INSERT INTO keys (key_id, name, user_id, secret_hash, scopes, created_at, expires_at)
VALUES (:key_id::text, :name::text, :user_id::text, :secret_hash::text, :scopes::jsonb,
        :created_at::timestamptz, :expires_at::timestamptz)
RETURNING *;

-- name: key_revoke
UPDATE keys SET revoked_at = coalesce(revoked_at, $2) WHERE key_id = $1 RETURNING *;

-- name: key_list
-- Newest first; the page token is the (created_at, key_id) of the last row.
SELECT * FROM keys
WHERE ($1 OR revoked_at IS NULL)
  AND ($2::timestamptz IS NULL OR (created_at, key_id) < ($2, $3::text))
ORDER BY created_at DESC, key_id DESC
LIMIT $4;

-- name: key_list_of_user
-- A user's own keys, newest first; without include_revoked, only the live ones (neither
-- revoked nor expired at now). The page token is the (created_at, key_id) of the last row.
-- nullable: after_at, after_id
SELECT * FROM keys
WHERE user_id = :user_id::text
  AND (:include_revoked::boolean
       OR (revoked_at IS NULL AND (expires_at IS NULL OR expires_at > :now::timestamptz)))
  AND (:after_at::timestamptz IS NULL OR (created_at, key_id) < (:after_at, :after_id::text))
ORDER BY created_at DESC, key_id DESC
LIMIT :limit::bigint;

-- name: key_revoke_of_user
-- Only a key of user $2: another user's key is not found.
UPDATE keys SET revoked_at = coalesce(revoked_at, $3) WHERE key_id = $1 AND user_id = $2
RETURNING *;

-- Login throttling (docs/concepts.md#signing-in). A subject is 'user:<user id>' or
-- 'address:<client address>'; each failed login leaves one row per subject.

-- name: login_subject_lock
-- Serializes the throttle check and the record of one subject across every replica until
-- the transaction ends (Login locks its two subjects in one order). The two-key form keeps
-- clear of the one-key locks of migrations, the scheduler and maintenance.
SELECT pg_advisory_xact_lock(hashtext('workshop.coordinator.login'), hashtext($1));

-- name: login_blocking_failures
-- For each subject $1[i] with limit $2[i]: its limit-th newest failure after $3 (the
-- window's start), which must leave the window before it may try again; NULL: below
-- its limit.
SELECT s.subject,
       (SELECT f.failed_at FROM login_failures f
        WHERE f.subject = s.subject AND f.failed_at > $3
        ORDER BY f.failed_at DESC
        OFFSET s.lim - 1 LIMIT 1) AS blocking_at
FROM unnest($1::text[], $2::int[]) AS s (subject, lim);

-- name: login_failures_record
-- One attempt ($2) counted against each of its subjects ($1) at $3; Login records it
-- before checking the password and forgets it when the password was right.
INSERT INTO login_failures (subject, failed_at, attempt_id)
SELECT subject, $3, $2 FROM unnest($1::text[]) AS subject;

-- name: login_failures_forget
-- Attempt $2 of subjects $1 was no failure; $3 (a user's subject, or NULL) loses every
-- counted failure (a successful login).
DELETE FROM login_failures
WHERE (subject = ANY($1::text[]) AND attempt_id = $2) OR subject = $3;

-- name: login_failures_prune
-- Failures that left the window ($1: its start); the maintenance pass.
DELETE FROM login_failures WHERE failed_at <= $1;

-- name: policy_revision_share
-- Inside run admission: the revision a new run's snapshot records, held until it commits.
SELECT revision FROM policy FOR SHARE;

-- name: policy_get
SELECT revision FROM policy;

-- name: policy_raise
UPDATE policy SET revision = revision + 1
WHERE $1::bigint IS NULL OR revision = $1
RETURNING revision;
