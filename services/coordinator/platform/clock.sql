-- The manual clock (COORDINATOR_MANUAL_CLOCK=1): real time plus this offset, which
-- every replica reads from here.

-- name: manual_clock_get
SELECT ahead_us FROM manual_clock;

-- name: manual_clock_advance
-- Adds $1 microseconds and announces the new offset to every replica, in one statement.
WITH moved AS (
    UPDATE manual_clock SET ahead_us = ahead_us + $1::bigint RETURNING ahead_us
)
SELECT moved.ahead_us, pg_notify('workshop_clock', moved.ahead_us::text) IS NULL AS announced
FROM moved;
