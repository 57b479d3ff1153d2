-- Workshop coordinator: website sign-in and a user's own keys (docs/concepts.md#signing-in).
--
-- users.password_hash is the argon2id hash of the user's password in argon2's encoded
-- form (its parameters and salt included); NULL: the user cannot sign in with a
-- password. login_failures holds one row per failed login per subject ('user:<user id>'
-- and 'address:<client address>'; the two rows of one attempt share its attempt_id),
-- which IdentityService.Login counts over a sliding window, so every replica shares the
-- throttle; the maintenance pass deletes rows older than the window. keys_by_user pages
-- a user's own keys. Additive: coordinators of the previous version neither read nor
-- write any of it.
ALTER TABLE users ADD COLUMN password_hash text;

CREATE TABLE login_failures (
    subject    text NOT NULL,
    failed_at  timestamptz NOT NULL,
    attempt_id text NOT NULL,
    PRIMARY KEY (subject, failed_at, attempt_id)
);
CREATE INDEX login_failures_by_time ON login_failures (failed_at);

CREATE INDEX keys_by_user ON keys (user_id, created_at DESC, key_id DESC)
    WHERE user_id IS NOT NULL;
