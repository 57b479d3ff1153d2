-- Review, sightings, the summary and bucket datasets (docs/review.md).

-- name: timelines_of_items
SELECT DISTINCT run_id, bucket_id, camera_id FROM bucket_items
WHERE item_id = ANY ($1::text[])
ORDER BY 1, 2, 3;

-- name: timeline_lock
SELECT 1 FROM sighting_timelines
WHERE run_id = $1 AND bucket_id = $2 AND camera_id = $3
FOR UPDATE;

-- name: timeline_regroup_rows
-- The boxes a regroup of a timeline reads: from 5 s before its first ungrouped box on;
-- those before that box are fixed (they say which sightings are open), the rest are
-- grouped again. No rows: nothing to group.
-- (MATERIALIZED: the first time is found once, not once per row.)
WITH start AS MATERIALIZED (
    SELECT min(frame_time) AS first_ungrouped FROM sighting_boxes
    WHERE run_id = $1 AND bucket_id = $2 AND camera_id = $3 AND sighting_id = ''
)
SELECT sb.item_id, sb.box_index, sb.frame_time, sb.class_name, sb.x, sb.y, sb.w, sb.h,
       sb.sighting_id, sb.frame_time < start.first_ungrouped AS fixed
FROM sighting_boxes sb, start
WHERE sb.run_id = $1 AND sb.bucket_id = $2 AND sb.camera_id = $3
  AND sb.frame_time >= start.first_ungrouped - interval '5 seconds';

-- name: timeline_rows_from
-- The boxes a regroup of a timeline reads when boxes from $4 on are being added (they are
-- not in the table yet): from 5 s before $4 or its first ungrouped box, whichever is
-- earlier; those before that are fixed, the rest are grouped again with the new ones.
WITH start AS MATERIALIZED (
    SELECT least($4::timestamptz, min(frame_time)) AS first_ungrouped FROM sighting_boxes
    WHERE run_id = $1 AND bucket_id = $2 AND camera_id = $3 AND sighting_id = ''
)
SELECT sb.item_id, sb.box_index, sb.frame_time, sb.class_name, sb.x, sb.y, sb.w, sb.h,
       sb.sighting_id, sb.frame_time < start.first_ungrouped AS fixed
FROM sighting_boxes sb, start
WHERE sb.run_id = $1 AND sb.bucket_id = $2 AND sb.camera_id = $3
  AND sb.frame_time >= start.first_ungrouped - interval '5 seconds';

-- name: items_new_boxes
-- The boxes of the committed items $1 that sighting_boxes does not hold yet, read from
-- the items as the table would hold them (box_index -1: an item without boxes), by
-- timeline.
SELECT bi.run_id, bi.bucket_id, bi.camera_id, bi.item_id,
       coalesce(b.ordinal - 1, -1)::integer AS box_index, bi.frame_time,
       coalesce(b.box ->> 'class_name', '') AS class_name,
       coalesce((b.box ->> 'x')::real, 0) AS x, coalesce((b.box ->> 'y')::real, 0) AS y,
       coalesce((b.box ->> 'w')::real, 0) AS w, coalesce((b.box ->> 'h')::real, 0) AS h
FROM bucket_items bi
LEFT JOIN LATERAL jsonb_array_elements(bi.boxes) WITH ORDINALITY AS b (box, ordinal) ON true
WHERE bi.item_id = ANY ($1::text[])
  AND NOT EXISTS (SELECT 1 FROM sighting_boxes sb WHERE sb.item_id = bi.item_id)
ORDER BY bi.run_id, bi.bucket_id, bi.camera_id;

-- name: sighting_boxes_add_grouped
-- The boxes (item $1[i], box $2[i]) of committed items, from the items, with their
-- sightings $3[i] (items_new_boxes' rows, grouped).
INSERT INTO sighting_boxes (item_id, box_index, run_id, bucket_id, camera_id, frame_time,
                            class_name, score, x, y, w, h, track_id, sighting_id)
SELECT bi.item_id, u.box_index, bi.run_id, bi.bucket_id, bi.camera_id, bi.frame_time,
       coalesce(b.box ->> 'class_name', ''), coalesce((b.box ->> 'score')::real, 0),
       coalesce((b.box ->> 'x')::real, 0), coalesce((b.box ->> 'y')::real, 0),
       coalesce((b.box ->> 'w')::real, 0), coalesce((b.box ->> 'h')::real, 0),
       (b.box ->> 'track_id')::bigint, u.sighting_id
FROM unnest($1::text[], $2::integer[], $3::text[]) AS u (item_id, box_index, sighting_id)
JOIN bucket_items bi ON bi.item_id = u.item_id
LEFT JOIN LATERAL (SELECT bi.boxes -> u.box_index AS box) b ON u.box_index >= 0;

-- name: timeline_assign
UPDATE sighting_boxes sb SET sighting_id = u.sighting_id
FROM unnest($1::text[], $2::integer[], $3::text[]) AS u (item_id, box_index, sighting_id)
WHERE sb.item_id = u.item_id AND sb.box_index = u.box_index;

-- name: timelines_ungrouped
SELECT DISTINCT run_id, bucket_id, camera_id FROM sighting_boxes
WHERE sighting_id = '' LIMIT $1;

-- name: sighting_lock
SELECT bucket_id, camera_id, sighting_id, ungrouped FROM sighting_lock_v1($1, $2, $3);

-- name: sighting_decide
-- nullable: relabel_class
SELECT sighting_decide_v1(p_run => :run_id::text, p_sighting => :sighting_id::text,
                       p_state => :review_state::text, p_relabel => :relabel_class::text,
                       p_by => :decided_by::jsonb, p_now => :now::timestamptz);

-- name: review_run
-- (only the snapshot's models: the page needs their class lists)
SELECT r.run_id, r.mode, r.kind, r.expires_at,
       jsonb_build_object('models', coalesce(s.snapshot -> 'models', '[]'::jsonb)) AS snapshot
FROM run_facts_v1($1) r CROSS JOIN run_snapshot_v1($1) s;

-- name: review_items_page
-- A page of a full run's bucket items, oldest frame first, after the key ($3, $4) (the
-- first page passes review.FIRST_KEY: a plain comparison lets the index start there).
-- Their boxes come from items_boxes (boxes NULL here).
SELECT bi.item_id, bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index, bi.camera_id,
       bi.recording_id, bi.recording_generation, bi.output_current, bi.frame_time,
       NULL::jsonb AS boxes, bi.review_state, bi.relabel_class, bi.saved_at, bi.reviewed_at
FROM bucket_items_current bi
WHERE bi.run_id = $1
  AND ($2::text[] IS NULL OR bi.camera_id = ANY ($2))
  AND (bi.frame_time, bi.item_id) > ($3::timestamptz, $4::text)
ORDER BY bi.frame_time, bi.item_id
LIMIT $5;

-- name: review_previews_page
-- A page of a test run's published previews still readable at now, oldest frame first,
-- after the key (after_frame_time, after_item_id); cameras as in review_items_page.
-- (runs' run_published_previews, which leases implement; resources' recording_state)
-- nullable: cameras
SELECT so.item_id, '' AS bucket_id, :run_id::text AS run_id, so.job_index, so.slot_index,
       so.camera_id, so.recording_id, so.recording_generation,
       (rec.generation = so.recording_generation AND rec.deleted_at IS NULL) AS output_current,
       so.frame_time, so.boxes, 'pending' AS review_state, NULL::text AS relabel_class,
       so.published_at AS saved_at, NULL::timestamptz AS reviewed_at
FROM run_published_previews_v1(:run_id) so
CROSS JOIN LATERAL recording_state_v1(so.recording_id) rec
WHERE so.item_id IS NOT NULL
  AND so.deleted_at IS NULL
  AND (so.collectable_at IS NULL OR so.collectable_at > :now::timestamptz)
  AND (:cameras::text[] IS NULL OR so.camera_id = ANY (:cameras))
  AND (so.frame_time, so.item_id) > (:after_frame_time::timestamptz, :after_item_id::text)
ORDER BY so.frame_time, so.item_id
LIMIT :limit::bigint;

-- name: review_recordings
SELECT job_index, recording_id, camera_id, generation, sha256, byte_size, object_key,
       start_at, end_at, fps, slot_count
FROM snapshot_recordings_of_v1($1)
WHERE ($2::text[] IS NULL OR camera_id = ANY ($2))
ORDER BY job_index;

-- name: items_boxes
-- The boxes of bucket items with their reviews, in item and box order (box_index -1: an
-- item without boxes, no box to show).
SELECT item_id, box_index, class_name, score, x, y, w, h, track_id, sighting_id, review_state,
       relabel_class
FROM sighting_boxes
WHERE item_id = ANY ($1::text[])
ORDER BY item_id, box_index;

-- name: review_page_boxes
-- The boxes of a review page, whose items are the run's range [(first_frame_time,
-- first_item_id), (last_frame_time, last_item_id)] in (frame_time, item_id) order, with
-- their reviews (box_index -1: an item without boxes); one scan of
-- sighting_boxes_by_run_frame. Cameras as in review_items_page.
-- nullable: cameras
SELECT item_id, box_index, class_name, score, x, y, w, h, track_id, sighting_id, review_state,
       relabel_class
FROM sighting_boxes
WHERE run_id = :run_id::text
  AND (frame_time, item_id) >= (:first_frame_time::timestamptz, :first_item_id::text)
  AND (frame_time, item_id) <= (:last_frame_time::timestamptz, :last_item_id::text)
  AND (:cameras::text[] IS NULL OR camera_id = ANY (:cameras))
ORDER BY item_id, box_index;

-- name: sightings_get
-- Sightings with their items in frame order and the counts their shared state is read
-- from.
SELECT sb.sighting_id, min(sb.bucket_id) AS bucket_id, min(sb.camera_id) AS camera_id,
       min(sb.class_name) AS class_name,
       array_agg(sb.item_id ORDER BY sb.frame_time, sb.item_id) AS item_ids,
       min(sb.frame_time) AS first_frame_time, max(sb.frame_time) AS last_frame_time,
       count(*) FILTER (WHERE sb.review_state = 'pending') AS pending,
       count(*) FILTER (WHERE sb.review_state = 'accepted') AS accepted,
       count(*) FILTER (WHERE sb.review_state = 'rejected') AS rejected,
       count(DISTINCT coalesce(sb.relabel_class, '')) AS relabel_variants,
       max(sb.relabel_class) AS relabel_class,
       max(sb.decided_at) AS decided_at,
       (array_agg(sb.decided_by ORDER BY sb.decided_at DESC NULLS LAST))[1] AS decided_by
FROM sighting_boxes sb
WHERE sb.sighting_id = ANY ($1::text[])
GROUP BY sb.sighting_id
ORDER BY min(sb.frame_time), sb.sighting_id;

-- name: bucket_exists
SELECT bucket_id FROM buckets_live_v1() WHERE bucket_id = $1;

-- name: bucket_items_page
-- A page of a bucket's items, oldest frame first, after the key (after_frame_time,
-- after_item_id), filtered by review states, class after relabels, camera (camera_id, or
-- the cameras the reader may see) and frame time [frame_time_from, frame_time_to).
-- nullable: review_states, class_name, camera_id, cameras, frame_time_from, frame_time_to
SELECT bi.item_id, bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index, bi.camera_id,
       bi.recording_id, bi.recording_generation, bi.output_current, bi.frame_time,
       NULL::jsonb AS boxes, bi.review_state, bi.relabel_class, bi.saved_at, bi.reviewed_at,
       bi.object_key, bi.sha256
FROM bucket_items_current bi
WHERE bi.bucket_id = :bucket_id::text
  AND (:review_states::text[] IS NULL OR bi.review_state = ANY (:review_states))
  AND (:class_name::text IS NULL OR EXISTS (
          SELECT 1 FROM sighting_boxes sb
          WHERE sb.item_id = bi.item_id
            AND coalesce(sb.relabel_class, sb.class_name) = :class_name))
  AND (:camera_id::text IS NULL OR bi.camera_id = :camera_id)
  AND (:cameras::text[] IS NULL OR bi.camera_id = ANY (:cameras))
  AND (:frame_time_from::timestamptz IS NULL OR bi.frame_time >= :frame_time_from)
  AND (:frame_time_to::timestamptz IS NULL OR bi.frame_time < :frame_time_to)
  AND (bi.frame_time, bi.item_id) > (:after_frame_time::timestamptz, :after_item_id::text)
ORDER BY bi.frame_time, bi.item_id
LIMIT :limit::bigint;

-- name: bucket_classes
-- Every class the bucket's boxes carry after relabels.
SELECT class_name FROM workflow_class_counts
WHERE bucket_id = $1 AND detections > 0
GROUP BY class_name ORDER BY class_name;

-- name: summary_buckets
SELECT b.bucket_id, b.name,
       coalesce(sum(c.images), 0)::bigint AS images,
       coalesce(sum(c.accepted), 0)::bigint AS accepted,
       coalesce(sum(c.rejected), 0)::bigint AS rejected,
       coalesce(sum(c.pending), 0)::bigint AS pending,
       coalesce(sum(c.images) FILTER (
           WHERE rec.generation = c.recording_generation AND rec.deleted_at IS NULL), 0)::bigint
           AS saved,
       max(c.last_added_at) AS last_added_at
FROM buckets_live_v1() b
LEFT JOIN bucket_counts c ON c.bucket_id = b.bucket_id AND c.images > 0
LEFT JOIN LATERAL recording_state_v1(c.recording_id) rec ON true
GROUP BY b.bucket_id, b.name
ORDER BY b.bucket_id;

-- name: summary_workflows
-- Workflows with their run count and newest run (photos are not workflow runs).
SELECT w.workflow_id, w.name, s.runs, s.last_run_id
FROM workflows_live_v1() w
CROSS JOIN LATERAL workflow_run_stats_v1(w.workflow_id) s
ORDER BY w.workflow_id;

-- name: summary_classes
SELECT c.workflow_id, c.class_name, sum(c.detections)::bigint AS detections,
       sum(c.confirmations)::bigint AS confirmations
FROM workflow_class_counts c
JOIN buckets_live_v1() b ON b.bucket_id = c.bucket_id
GROUP BY c.workflow_id, c.class_name
HAVING sum(c.detections) > 0
ORDER BY c.workflow_id, c.class_name;

-- name: summary_days
-- Items saved per local day: $1 are the instants the local days start at (the last one
-- ends the range), so bucket n counts the day starting at $1[n].
SELECT c.workflow_id, width_bucket(c.quarter_start, $1::timestamptz[]) AS day,
       sum(c.images)::bigint AS images
FROM workflow_day_counts c
JOIN buckets_live_v1() b ON b.bucket_id = c.bucket_id
WHERE c.quarter_start >= $1[1] AND c.quarter_start < $1[cardinality($1)]
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: run_review_counts
SELECT run_id, pending, accepted, rejected FROM run_review_counts WHERE run_id = ANY ($1::text[]);

-- name: runs_by_ids
SELECT * FROM run_status WHERE run_id = ANY ($1::text[]);
