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

-- name: user_create
INSERT INTO users (user_id, display_name, created_at) VALUES ($1, $2, $3)
ON CONFLICT (user_id) DO NOTHING
RETURNING *;

-- name: user_get
SELECT * FROM users WHERE user_id = $1;

-- name: user_disable
UPDATE users SET disabled_at = coalesce(disabled_at, $2) WHERE user_id = $1 RETURNING *;

-- name: session_create
INSERT INTO sessions (session_id, user_id, secret_hash, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: session_revoke
UPDATE sessions SET revoked_at = coalesce(revoked_at, $2) WHERE session_id = $1 RETURNING *;

-- name: key_create
INSERT INTO keys (key_id, name, user_id, secret_hash, scopes, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
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

-- name: policy_get
SELECT revision FROM policy;

-- name: policy_raise
UPDATE policy SET revision = revision + 1
WHERE $1::bigint IS NULL OR revision = $1
RETURNING revision;
