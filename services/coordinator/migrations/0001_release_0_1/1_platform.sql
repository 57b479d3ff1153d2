-- Release 0.1, room platform: its tables, indexes, triggers and functions.

-- The manual clock (COORDINATOR_MANUAL_CLOCK=1): one row, the offset from real time that
-- AdvanceClock only ever grows; every replica and every restart read it here.
CREATE TABLE manual_clock (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    ahead_us  bigint NOT NULL CHECK (ahead_us >= 0)  -- microseconds ahead of real time
);

INSERT INTO manual_clock (singleton, ahead_us) VALUES (true, 0);
