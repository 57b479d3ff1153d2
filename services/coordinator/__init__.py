"""The coordinator: Workshop's durable core over Postgres (docs/architecture.md).

Organised by domain, in rooms that each own their tables, SQL and service class:
`platform` (db, migrations, clock, errors) under `identity`, `resources`, `workflows`,
`runs`, `review`, `leases` and `previews`; `servicers` adapt them to gRPC; `app`
composes them and `__main__` serves or migrates. The schema is release 0.1's baseline
(`migrations/0001_release_0_1/`, one file per room) and the migrations after it.
"""
