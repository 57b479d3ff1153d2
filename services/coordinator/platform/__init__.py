"""The coordinator's platform: what every domain stands on and none owns.

`db` (the only module that imports asyncpg: pool, connections, typed rows, named SQL),
`queries` (the named-SQL loader), `versions` and `migrate` (which migrations this code
knows; applying them), `clock` (the injectable, optionally manual clock), `errors` (the
coordinator's error classes), `metrics` (its own series) and `fields` (checks on request
fields every RPC shares), with their SQL (`migrate.sql`, `clock.sql`). Platform modules
import nothing of the rooms (docs/architecture.md).
"""
