-- A commit refreshes the review queue's columns of the sightings it extends from the items
-- it adds alone (docs/upgrading.md, 0015; docs/review.md, "Review queue").
--
-- sightings_refresh_v1 (0010) recomputes a sighting's columns from all its items, and every
-- commit called it for each sighting it made or changed: a sighting that stays open across
-- many jobs (a parked car) cost each commit more than the one before (O(sighting length)).
-- A commit that only adds items to a sighting (its items already written keep their boxes
-- in it) knows the new columns from the old ones and the added boxes: those are undecided,
-- so the sighting is pending, its pending items grow by them, its score is the greater of
-- its own and theirs, and its newest decision stays. sightings_refresh_v2 does that for the
-- sightings the caller names as only appended to, and the full recomputation for the
-- others (a regroup that moved written boxes) and for any appended one the shortcut cannot
-- answer exactly (a decided added box, or a negative score after a stored score of 0, which
-- may stand for no score at all).
--
-- Pre-migration: a new function. sightings_refresh_v1 stays: sightings_bulk_decide_v1 and
-- bulk_decision_undo_v1 call it, and so does a coordinator of the release before. Nothing to
-- post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- Sets the review columns of run p_run's sightings p_sightings from all their items (as
-- sightings_refresh_v1), and of its sightings p_appended from their columns and the boxes
-- the items p_items (just written, in the caller's transaction) hold in them: the caller
-- names as appended only sightings whose other items are as they were when the columns
-- were last set. Called under their timelines' locks. Returns how many rows it refreshed.
CREATE FUNCTION sightings_refresh_v2(
    p_run text, p_sightings text[], p_appended text[], p_items text[]
) RETURNS integer LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    quick text[] := '{}';
    remaining text[];
BEGIN
    IF cardinality(p_appended) > 0 THEN
        -- (the added items by primary key; each box of theirs that p_appended names)
        WITH added AS (
            SELECT b.sighting_id, count(*)::integer AS boxes,
                   bool_and(bi.box_states[b.position] IS NULL
                            AND bi.box_decided_by[b.position] IS NULL
                            AND bi.box_decided_at[b.position] IS NULL) AS undecided,
                   max((bi.boxes -> (b.position - 1) ->> 'score')::real) AS score
            FROM bucket_items bi
            CROSS JOIN LATERAL (
                SELECT u.sighting_id, u.position::integer AS position
                FROM unnest(bi.box_sightings) WITH ORDINALITY AS u (sighting_id, position)
            ) b
            WHERE bi.item_id = ANY (p_items) AND bi.run_id = p_run
              AND b.sighting_id = ANY (p_appended)
            GROUP BY b.sighting_id
        ), updated AS (
            UPDATE sightings s
            SET review_state = 'pending', pending_items = s.pending_items + a.boxes,
                relabel_class = NULL,
                score = CASE WHEN a.score IS NULL THEN s.score ELSE greatest(s.score, a.score) END
            FROM added a
            WHERE s.run_id = p_run AND s.sighting_id = a.sighting_id AND a.undecided
              AND NOT coalesce(a.score < 0 AND s.score = 0, false)
            RETURNING s.sighting_id
        )
        SELECT coalesce(array_agg(u.sighting_id), '{}') INTO quick FROM updated u;
    END IF;
    SELECT coalesce(array_agg(DISTINCT r.sighting_id), '{}') INTO remaining
    FROM unnest(p_sightings || p_appended) AS r (sighting_id)
    WHERE r.sighting_id <> ALL (quick);
    IF cardinality(remaining) = 0 THEN
        RETURN cardinality(quick);
    END IF;
    RETURN cardinality(quick)
        + sightings_refresh_v1(array_fill(p_run, ARRAY[cardinality(remaining)]), remaining);
END;
$$;
