"""The identity room: who is calling, and may they (docs/concepts.md).

Owns principals, scopes and credentials (`auth`: authenticate a secret, `require` a
scope), users' passwords (`passwords`: argon2id off the event loop), users, sessions,
keys and the policy revision as an admin manages them (`accounts.Accounts`), website
sign-in and sign-out with its throttle and a user's own keys (`signin.IdentityApi`), and
their SQL (`auth.sql`). It calls only the platform; every other room asks it who a
principal is and what it may do (docs/architecture.md).
"""
