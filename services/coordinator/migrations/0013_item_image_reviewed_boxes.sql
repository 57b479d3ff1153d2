-- A bucket item's image is read with its boxes after review (docs/review.md, "Corrections"):
-- as corrected (or as detected), each with its class after the correction, its sighting's
-- relabel or its item decision, as GetReview's `reviewed_boxes`, exports and the summary
-- already have them. bucket_item_for_read_v2 (0002) applied sighting relabels only, so an
-- image read after a correction showed the detections.
--
-- Pre-migration: a new function; a coordinator of the release before keeps calling
-- bucket_item_for_read_v2, which stays (its images show relabels only, as before). Nothing
-- to post-migrate until no such coordinator serves.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- A run's bucket item by its id, as reading its image needs it: its boxes after review
-- (corrections, relabels and the item decision applied; rejected boxes included, with
-- their class). No row: the run has no such item.
-- public: previews (image_for_read)
CREATE FUNCTION bucket_item_for_read_v3(p_run text, p_item text)
RETURNS TABLE (object_key text, boxes jsonb, frame_time timestamptz, camera_id text,
               sha256 text)
LANGUAGE sql STABLE AS $$
    SELECT bi.object_key,
           (SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                       'class_name', r.class_name, 'score', r.score, 'x', r.x, 'y', r.y,
                       'w', r.w, 'h', r.h, 'track_id', r.track_id))
                       ORDER BY r.box_index), '[]'::jsonb)
            FROM bucket_item_reviewed_boxes_v1(bi.boxes, bi.corrected_boxes, bi.box_states,
                                               bi.box_relabels, bi.item_state,
                                               bi.item_relabel) r),
           bi.frame_time, bi.camera_id, bi.sha256
    FROM bucket_items bi
    WHERE bi.run_id = p_run AND bi.item_id = p_item
$$;
