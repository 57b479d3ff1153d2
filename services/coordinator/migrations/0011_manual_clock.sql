-- Workshop coordinator: the manual clock's offset is kept in the database.
--
-- With COORDINATOR_MANUAL_CLOCK=1 the coordinator follows real time plus an offset that
-- an admin moves forward (AdvanceClock), and it promises never to move backwards. The
-- offset lived in each process's memory, so a restarted coordinator moved the clock back
-- by everything it had been advanced, and two replicas each kept their own. It is now
-- this one row: a move adds to it in one statement and announces the new offset on
-- `workshop_clock`; every replica reads it when it starts and when it hears a move.
CREATE TABLE manual_clock (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    ahead_us  bigint NOT NULL CHECK (ahead_us >= 0)  -- microseconds ahead of real time
);
INSERT INTO manual_clock (singleton, ahead_us) VALUES (true, 0);
