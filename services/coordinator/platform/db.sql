-- The pool's own statements (db.py).

-- name: array_types
-- Every array type the coordinator's statements pass or read, named once when a connection
-- opens so that asyncpg looks up all their element types in one catalog query
-- (tests/service/test_coordinator_fast_paths.py checks that no statement needs another).
SELECT NULL::boolean[], NULL::integer[], NULL::bigint[], NULL::real[],
       NULL::double precision[], NULL::timestamptz[], NULL::uuid[];
