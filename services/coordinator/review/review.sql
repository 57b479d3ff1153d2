-- Review, sightings, the summary and bucket datasets (docs/review.md).

-- name: timelines_lock
-- Takes the lock rows of the timelines (run $1, camera $2, buckets $3) in key order, made
-- if new: what a commit does before it reads and groups them (docs/review.md).
INSERT INTO sighting_timelines AS t (run_id, bucket_id, camera_id)
SELECT DISTINCT $1::text, u.bucket_id, $2::text FROM unnest($3::text[]) AS u (bucket_id)
ORDER BY 1, 2, 3
ON CONFLICT ON CONSTRAINT sighting_timelines_pkey DO UPDATE SET run_id = t.run_id;

-- name: timeline_lock
SELECT 1 FROM sighting_timelines
WHERE run_id = $1 AND bucket_id = $2 AND camera_id = $3
FOR UPDATE;

-- name: timeline_context
-- The boxes a regroup of the timelines (run :run_id, camera :camera_id, each bucket of
-- :buckets) reads, read after their locks: from 5 s before the first frame time that is
-- grouped again on, which is the bucket's :first_new (the first frame time of the items
-- being added; NULL: none) or its first ungrouped item, whichever is earlier (no rows:
-- nothing to group). Boxes before that are fixed (they say which sightings are open),
-- with their sighting's first frame time and item count; box_index -1: an item without
-- boxes. (MATERIALIZED: each start is found once, not once per row.)
-- nullable: first_new[]
WITH wanted AS MATERIALIZED (
    SELECT w.bucket_id,
           least(w.first_new, (SELECT min(u.frame_time) FROM bucket_items u
                               WHERE u.run_id = :run_id::text AND u.bucket_id = w.bucket_id
                                 AND u.camera_id = :camera_id::text
                                 AND u.box_sightings IS NULL)) AS start
    FROM unnest(:buckets::text[], :first_new::timestamptz[]) AS w (bucket_id, first_new)
)
SELECT w.bucket_id, bi.item_id, b.box_index, bi.frame_time, b.class_name, b.x, b.y, b.w, b.h,
       coalesce(bi.box_sightings[b.box_position], '') AS sighting_id,
       bi.frame_time < w.start AS fixed, s.first_frame_time AS sighting_first,
       s.item_count AS sighting_items
FROM wanted w
JOIN bucket_items bi
    ON bi.run_id = :run_id AND bi.frame_time >= w.start - interval '5 seconds'
   AND bi.bucket_id = w.bucket_id AND bi.camera_id = :camera_id
CROSS JOIN LATERAL bucket_item_boxes_of_v1(bi.boxes) b
LEFT JOIN sightings s
    ON bi.frame_time < w.start AND s.run_id = :run_id
   AND s.sighting_id = bi.box_sightings[b.box_position]
WHERE w.start IS NOT NULL;

-- name: sightings_apply
-- What a grouping changed, under the timelines' locks (sightings_apply_v1 says what): the
-- items already written whose box_sightings changed (:item_ids, each one's new array as a
-- text array literal), the sightings of run :run_id and camera :camera_id that lost every
-- item (:gone), and the sightings made or changed, with their item range and count. (A
-- commit does the same inside job_complete_v4, by job_complete_v3.)
SELECT sightings_apply_v1(
    p_run => :run_id::text, p_camera => :camera_id::text, p_item_ids => :item_ids::text[],
    p_item_sightings => :item_sightings::text[], p_gone => :gone::text[],
    p_sighting_ids => :sighting_ids::text[], p_sighting_buckets => :sighting_buckets::text[],
    p_sighting_classes => :sighting_classes::text[],
    p_sighting_firsts => :sighting_firsts::timestamptz[],
    p_sighting_lasts => :sighting_lasts::timestamptz[],
    p_sighting_counts => :sighting_counts::integer[]);

-- name: timelines_ungrouped
SELECT DISTINCT run_id, bucket_id, camera_id FROM bucket_items
WHERE box_sightings IS NULL LIMIT $1;

-- name: sighting_lock
SELECT bucket_id, camera_id, sighting_id, ungrouped FROM sighting_lock_v2($1, $2, $3);

-- name: sighting_decide
-- nullable: relabel_class
SELECT sighting_decide_v3(p_run => :run_id::text, p_sighting => :sighting_id::text,
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
-- Their boxes come from review_page_boxes (boxes NULL here).
SELECT bi.item_id, bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index, bi.camera_id,
       bi.recording_id, bi.recording_generation, bi.output_current, bi.frame_time,
       NULL::jsonb AS boxes, bi.review_state, bi.relabel_class, bi.saved_at, bi.reviewed_at,
       bi.revision, bi.corrected_boxes, bi.corrected_by, bi.corrected_at, bi.item_state,
       bi.item_relabel, bi.item_decided_by, bi.item_decided_at
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
       so.published_at AS saved_at, NULL::timestamptz AS reviewed_at, 0 AS revision,
       NULL::jsonb AS corrected_boxes, NULL::jsonb AS corrected_by,
       NULL::timestamptz AS corrected_at, NULL::text AS item_state, NULL::text AS item_relabel,
       NULL::jsonb AS item_decided_by, NULL::timestamptz AS item_decided_at
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
SELECT bi.item_id, b.box_index, b.class_name, b.score, b.x, b.y, b.w, b.h, b.track_id,
       coalesce(bi.box_sightings[b.box_position], '') AS sighting_id,
       coalesce(bi.box_states[b.box_position], 'pending') AS review_state,
       bi.box_relabels[b.box_position] AS relabel_class
FROM bucket_items bi
CROSS JOIN LATERAL bucket_item_boxes_of_v1(bi.boxes) b
WHERE bi.item_id = ANY ($1::text[])
ORDER BY bi.item_id, b.box_index;

-- name: review_page_boxes
-- The boxes of a review page, whose items are the run's range [(first_frame_time,
-- first_item_id), (last_frame_time, last_item_id)] in (frame_time, item_id) order, with
-- their reviews (box_index -1: an item without boxes), in page order and box order; one
-- scan of bucket_items_by_run_frame. Cameras as in review_items_page.
-- nullable: cameras
SELECT bi.item_id, b.box_index, b.class_name, b.score, b.x, b.y, b.w, b.h, b.track_id,
       coalesce(bi.box_sightings[b.box_position], '') AS sighting_id,
       coalesce(bi.box_states[b.box_position], 'pending') AS review_state,
       bi.box_relabels[b.box_position] AS relabel_class
FROM bucket_items bi
CROSS JOIN LATERAL bucket_item_boxes_of_v1(bi.boxes) b
WHERE bi.run_id = :run_id::text
  AND (bi.frame_time, bi.item_id) >= (:first_frame_time::timestamptz, :first_item_id::text)
  AND (bi.frame_time, bi.item_id) <= (:last_frame_time::timestamptz, :last_item_id::text)
  AND (:cameras::text[] IS NULL OR bi.camera_id = ANY (:cameras))
ORDER BY bi.frame_time, bi.item_id, b.box_index;

-- name: sightings_get
-- Sightings of run $1 with their items in frame order and the counts their shared state
-- is read from: each sighting's items are those of its timeline in its frame range whose
-- box_sightings hold it (one box each), aggregated per sighting so that each is one range
-- scan of bucket_items_by_timeline.
SELECT s.sighting_id, s.bucket_id, s.camera_id, s.class_name, m.item_ids,
       s.first_frame_time, s.last_frame_time, m.pending, m.accepted, m.rejected,
       m.relabel_variants, m.relabel_class, m.decided_at, m.decided_by
FROM sightings s
CROSS JOIN LATERAL (
    SELECT array_agg(bi.item_id ORDER BY bi.frame_time, bi.item_id) AS item_ids,
           count(*) FILTER (WHERE b.review_state = 'pending') AS pending,
           count(*) FILTER (WHERE b.review_state = 'accepted') AS accepted,
           count(*) FILTER (WHERE b.review_state = 'rejected') AS rejected,
           count(DISTINCT coalesce(b.relabel_class, '')) AS relabel_variants,
           max(b.relabel_class) AS relabel_class,
           max(b.decided_at) AS decided_at,
           (array_agg(b.decided_by ORDER BY b.decided_at DESC NULLS LAST))[1] AS decided_by
    FROM bucket_items bi
    CROSS JOIN LATERAL (SELECT array_position(bi.box_sightings, s.sighting_id) AS position) p
    CROSS JOIN LATERAL (
        SELECT coalesce(bi.box_states[p.position], 'pending') AS review_state,
               bi.box_relabels[p.position] AS relabel_class,
               bi.box_decided_at[p.position] AS decided_at,
               bi.box_decided_by[p.position] AS decided_by
    ) b
    WHERE bi.run_id = s.run_id AND bi.bucket_id = s.bucket_id AND bi.camera_id = s.camera_id
      AND bi.frame_time >= s.first_frame_time AND bi.frame_time <= s.last_frame_time
      AND p.position IS NOT NULL
) m
WHERE s.run_id = $1 AND s.sighting_id = ANY ($2::text[])
ORDER BY s.first_frame_time, s.sighting_id;

-- name: bucket_exists
SELECT bucket_id FROM buckets_live_v1() WHERE bucket_id = $1;

-- name: bucket_items_page
-- A page of a bucket's items, oldest frame first, after the key (after_frame_time,
-- after_item_id), that pass the filter: bucket_item_listed_v1 (review states, camera
-- (camera_id, or the cameras the reader may see), run, frame time [frame_time_from,
-- frame_time_to), score in [min_score, max_score]) and the class after corrections and
-- relabels. Three statements find them, each reading about the items it returns where
-- it is chosen (services/coordinator/review/listing.py): this one reads the bucket in
-- frame order until the page is full (for no filter, or one most items pass; the caller
-- starts the key at frame_time_from, so a time range is an index range);
-- bucket_items_page_timelines and bucket_items_page_sparse below.
-- nullable: review_states, class_name, camera_id, cameras, run_id, frame_time_from, frame_time_to, min_score, max_score
SELECT bi.item_id, bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index, bi.camera_id,
       bi.recording_id, bi.recording_generation, bi.output_current, bi.frame_time,
       NULL::jsonb AS boxes, bi.review_state, bi.relabel_class, bi.saved_at, bi.reviewed_at,
       bi.object_key, bi.sha256,
       bi.revision, bi.corrected_boxes, bi.corrected_by, bi.corrected_at, bi.item_state,
       bi.item_relabel, bi.item_decided_by, bi.item_decided_at
FROM bucket_items_current bi
WHERE bi.bucket_id = :bucket_id::text
  AND (bi.frame_time, bi.item_id) > (:after_frame_time::timestamptz, :after_item_id::text)
  AND bi.frame_time < coalesce(:frame_time_to::timestamptz, 'infinity')
  AND bucket_item_listed_v1(
          :review_states::text[], :camera_id::text, :cameras::text[], :run_id::text,
          :frame_time_from::timestamptz, :frame_time_to::timestamptz, :min_score::real,
          :max_score::real, bi.review_state, bi.camera_id, bi.run_id, bi.frame_time, bi.boxes)
  AND (:class_name::text IS NULL OR EXISTS (
          SELECT 1
          FROM bucket_item_reviewed_boxes_v1(bi.boxes, bi.corrected_boxes, bi.box_states,
                                             bi.box_relabels, bi.item_state, bi.item_relabel) r
          WHERE r.class_name = :class_name))
ORDER BY bi.frame_time, bi.item_id
LIMIT :limit::bigint;

-- name: bucket_items_page_timelines
-- bucket_items_page (the same filter and key) for a camera or run filter: a page from each
-- timeline (run, camera) of the bucket the filter keeps, in frame order
-- (bucket_items_by_timeline), merged.
-- nullable: review_states, class_name, camera_id, cameras, run_id, frame_time_from, frame_time_to, min_score, max_score
SELECT bi.item_id, bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index, bi.camera_id,
       bi.recording_id, bi.recording_generation, bi.output_current, bi.frame_time,
       NULL::jsonb AS boxes, bi.review_state, bi.relabel_class, bi.saved_at, bi.reviewed_at,
       bi.object_key, bi.sha256,
       bi.revision, bi.corrected_boxes, bi.corrected_by, bi.corrected_at, bi.item_state,
       bi.item_relabel, bi.item_decided_by, bi.item_decided_at
FROM sighting_timelines t
CROSS JOIN LATERAL (
    SELECT bi.* FROM bucket_items_current bi
    WHERE bi.run_id = t.run_id AND bi.bucket_id = t.bucket_id AND bi.camera_id = t.camera_id
      AND bi.frame_time >= :after_frame_time::timestamptz
      AND (bi.frame_time, bi.item_id) > (:after_frame_time, :after_item_id::text)
      AND bi.frame_time < coalesce(:frame_time_to::timestamptz, 'infinity')
      AND bucket_item_listed_v1(
              :review_states::text[], :camera_id::text, :cameras::text[], :run_id::text,
              :frame_time_from::timestamptz, :frame_time_to::timestamptz, :min_score::real,
              :max_score::real, bi.review_state, bi.camera_id, bi.run_id, bi.frame_time, bi.boxes)
      AND (:class_name::text IS NULL OR EXISTS (
              SELECT 1
              FROM bucket_item_reviewed_boxes_v1(bi.boxes, bi.corrected_boxes, bi.box_states,
                                                 bi.box_relabels, bi.item_state, bi.item_relabel) r
              WHERE r.class_name = :class_name))
    -- (frame time alone: the index's order, read in order, not sorted; the ties at the
    -- end come too, so the merge below orders by item id right)
    ORDER BY bi.frame_time
    FETCH FIRST (:limit::bigint) ROWS WITH TIES
) bi
WHERE t.bucket_id = :bucket_id::text
  AND (:camera_id IS NULL OR t.camera_id = :camera_id)
  AND (:cameras IS NULL OR t.camera_id = ANY (:cameras))
  AND (:run_id IS NULL OR t.run_id = :run_id)
ORDER BY bi.frame_time, bi.item_id
LIMIT :limit;

-- name: bucket_items_page_sparse
-- bucket_items_page (the same filter and key) for a class, a score floor above 0
-- (sighting_min_score), decided states only or PENDING alone that few items pass: the
-- items that may pass, read and filtered: those of the sightings that may hold one by the
-- condition `driver` names (bucket_sightings_wanted_v1), those with an item decision or a
-- correction (bucket_items_item_reviewed) and those not grouped yet
-- (bucket_items_ungrouped).
-- nullable: review_states, class_name, camera_id, cameras, run_id, frame_time_from, frame_time_to, min_score, max_score, sighting_min_score
WITH candidates AS (
    SELECT bi.item_id
    FROM bucket_sightings_wanted_v1(:bucket_id::text, :driver::text, :class_name::text,
                                    :sighting_min_score::real,
                                    :after_frame_time::timestamptz) s
    JOIN bucket_items bi
        ON bi.run_id = s.run_id AND bi.bucket_id = s.bucket_id AND bi.camera_id = s.camera_id
       AND bi.frame_time >= greatest(s.first_frame_time, :after_frame_time)
       AND bi.frame_time <= s.last_frame_time AND s.sighting_id = ANY (bi.box_sightings)
    UNION
    SELECT bi.item_id FROM bucket_items bi
    WHERE bi.bucket_id = :bucket_id
      AND (bi.item_state IS NOT NULL OR bi.corrected_boxes IS NOT NULL)
      AND bi.frame_time >= :after_frame_time
    UNION
    SELECT bi.item_id FROM bucket_items bi
    WHERE bi.box_sightings IS NULL AND bi.bucket_id = :bucket_id
      AND bi.frame_time >= :after_frame_time
)
SELECT bi.item_id, bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index, bi.camera_id,
       bi.recording_id, bi.recording_generation, bi.output_current, bi.frame_time,
       NULL::jsonb AS boxes, bi.review_state, bi.relabel_class, bi.saved_at, bi.reviewed_at,
       bi.object_key, bi.sha256,
       bi.revision, bi.corrected_boxes, bi.corrected_by, bi.corrected_at, bi.item_state,
       bi.item_relabel, bi.item_decided_by, bi.item_decided_at
FROM bucket_items_current bi
WHERE bi.item_id IN (SELECT item_id FROM candidates)
  AND (bi.frame_time, bi.item_id) > (:after_frame_time, :after_item_id::text)
  AND bucket_item_listed_v1(
          :review_states::text[], :camera_id::text, :cameras::text[], :run_id::text,
          :frame_time_from::timestamptz, :frame_time_to::timestamptz, :min_score::real,
          :max_score::real, bi.review_state, bi.camera_id, bi.run_id, bi.frame_time, bi.boxes)
  AND (:class_name IS NULL OR EXISTS (
          SELECT 1
          FROM bucket_item_reviewed_boxes_v1(bi.boxes, bi.corrected_boxes, bi.box_states,
                                             bi.box_relabels, bi.item_state, bi.item_relabel) r
          WHERE r.class_name = :class_name))
ORDER BY bi.frame_time, bi.item_id
LIMIT :limit::bigint;

-- name: bucket_items_path_sizes
-- What the statements of a page would read (their arguments; review/listing.py picks one):
-- sparse_items, the items bucket_items_page_sparse reads (those of the sightings that may
-- hold a match, and the bucket's items with an item decision or a correction or not
-- grouped yet, after the key; 0 without a driver), and timelines, the timelines
-- bucket_items_page_timelines reads.
-- nullable: driver, class_name, sighting_min_score, camera_id, cameras, run_id
SELECT CASE WHEN :driver::text IS NULL THEN 0 ELSE
           (SELECT coalesce(sum(s.item_count), 0)
            FROM bucket_sightings_wanted_v1(:bucket_id::text, :driver, :class_name::text,
                                            :sighting_min_score::real,
                                            :after_frame_time::timestamptz) s)
           + (SELECT count(*) FROM bucket_items bi
              WHERE bi.bucket_id = :bucket_id
                AND (bi.item_state IS NOT NULL OR bi.corrected_boxes IS NOT NULL)
                AND bi.frame_time >= :after_frame_time)
           + (SELECT count(*) FROM bucket_items bi
              WHERE bi.box_sightings IS NULL AND bi.bucket_id = :bucket_id
                AND bi.frame_time >= :after_frame_time) END AS sparse_items,
       (SELECT count(*) FROM sighting_timelines t
        WHERE t.bucket_id = :bucket_id
          AND (:camera_id::text IS NULL OR t.camera_id = :camera_id)
          AND (:cameras::text[] IS NULL OR t.camera_id = ANY (:cameras))
          AND (:run_id::text IS NULL OR t.run_id = :run_id)) AS timelines;

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

-- name: items_reviewed_boxes
-- The boxes of bucket items after review (corrections, relabels, item decisions:
-- bucket_item_reviewed_boxes), in item and box order.
SELECT bi.item_id, r.box_index, r.source_index, r.class_name, r.score, r.x, r.y, r.w, r.h,
       r.track_id, r.review_state, r.relabel_class
FROM bucket_items bi
CROSS JOIN LATERAL bucket_item_reviewed_boxes_v1(bi.boxes, bi.corrected_boxes, bi.box_states,
                                                 bi.box_relabels, bi.item_state,
                                                 bi.item_relabel) r
WHERE bi.item_id = ANY ($1::text[])
ORDER BY bi.item_id, r.box_index;

-- name: item_timeline
-- The timeline of a bucket item (no row: no such item).
SELECT run_id, bucket_id, camera_id FROM bucket_items WHERE item_id = $1;

-- name: item_locked
-- A bucket item about to be corrected or decided, locked (after its timeline's lock).
SELECT bi.item_id, bi.run_id, bi.revision, bi.boxes, bi.corrected_boxes, bi.item_state
FROM bucket_items bi WHERE bi.item_id = $1
FOR UPDATE;

-- name: item_get
-- A bucket item as review shows it.
SELECT bi.item_id, bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index, bi.camera_id,
       bi.recording_id, bi.recording_generation, bi.output_current, bi.frame_time,
       NULL::jsonb AS boxes, bi.review_state, bi.relabel_class, bi.saved_at, bi.reviewed_at,
       bi.revision, bi.corrected_boxes, bi.corrected_by, bi.corrected_at, bi.item_state,
       bi.item_relabel, bi.item_decided_by, bi.item_decided_at
FROM bucket_items_current bi WHERE bi.item_id = $1;

-- name: item_revise
-- nullable: corrected_boxes, corrected_by, corrected_at, review_state, relabel_class
SELECT bucket_item_revise_v1(
    p_item => :item_id::text, p_correct => :correct::boolean,
    p_corrected => :corrected_boxes::jsonb, p_corrected_by => :corrected_by::jsonb,
    p_corrected_at => :corrected_at::timestamptz, p_decide => :decide::boolean,
    p_state => :review_state::text, p_relabel => :relabel_class::text,
    p_by => :decided_by::jsonb, p_now => :now::timestamptz);

-- name: item_correction_logged
-- nullable: previous
INSERT INTO box_corrections (item_id, revision, previous, boxes, corrected_by, corrected_at)
VALUES (:item_id::text, :revision::integer, :previous::jsonb, :boxes::jsonb,
        :corrected_by::jsonb, :corrected_at::timestamptz);

-- name: item_corrections_in_force
-- The item's two newest corrections not undone, newest first: undo marks the first undone
-- and brings back the second's boxes (none: as detected).
SELECT revision, boxes, corrected_by, corrected_at FROM box_corrections
WHERE item_id = $1 AND undone_at IS NULL
ORDER BY revision DESC LIMIT 2;

-- name: item_correction_log
-- Every correction of the item and its undo, oldest first (GetBucketItem's history).
SELECT revision, boxes, corrected_by, corrected_at, undone_by, undone_at FROM box_corrections
WHERE item_id = $1 ORDER BY revision;

-- name: item_decision_log
-- Every decision on the item alone, oldest first (review_state NULL: a clear).
SELECT revision, review_state, relabel_class, decided_by, decided_at FROM item_decisions
WHERE item_id = $1 ORDER BY revision;

-- name: item_correction_undone
UPDATE box_corrections SET undone_by = $3::jsonb, undone_at = $4
WHERE item_id = $1 AND revision = $2;

-- name: item_decision_logged
-- nullable: review_state, relabel_class
INSERT INTO item_decisions (item_id, revision, review_state, relabel_class, decided_by,
                            decided_at)
VALUES (:item_id::text, :revision::integer, :review_state::text, :relabel_class::text,
        :decided_by::jsonb, :decided_at::timestamptz);

-- name: sightings_refresh
-- The review columns of run $1's sightings $2 from all their items, and of its sightings $3
-- from their columns and the boxes the just written items $4 hold in them (after a change
-- to their items or decisions, under their timelines' locks; sightings_refresh_v2).
SELECT sightings_refresh_v2($1::text, $2::text[], $3::text[], $4::text[]);

-- name: timelines_lock_many
-- Takes the lock rows of the timelines ($1[n], $2[n], $3[n]) (run, bucket, camera) in key
-- order, made if new: what a bulk decision or its undo does first.
INSERT INTO sighting_timelines AS t (run_id, bucket_id, camera_id)
SELECT DISTINCT u.run_id, u.bucket_id, u.camera_id
FROM unnest($1::text[], $2::text[], $3::text[]) AS u (run_id, bucket_id, camera_id)
ORDER BY 1, 2, 3
ON CONFLICT ON CONSTRAINT sighting_timelines_pkey DO UPDATE SET run_id = t.run_id;

-- name: queue_page_keys
-- The keys of a page of a bucket's review queue in the order asked (order_by), after the
-- key of the page before: per review state asked for, a range of the order's index, merged.
--   oldest: first frame time, then run and sighting id; after (after_time, after_run,
--           after_sighting); sightings_queue_oldest.
--   score:  lowest score first, then as oldest; after (after_score, after_time, ...);
--           sightings_queue_score.
--   camera: by camera, then as oldest; after (after_camera, after_time, ...);
--           sightings_queue_camera.
-- Filters (`matching`, written once): class as detected, camera (camera_id, or the cameras
-- the reader may see), run, first frame time in [frame_time_from, frame_time_to), score in
-- [min_score, max_score]. NOT MATERIALIZED inlines them into each order's range, so that
-- the bucket, the state and the key stay an index range of that order's index (EXPLAIN:
-- its Index Scan, at most `limit` rows a state); only the order asked is read (each
-- range's order_by test is a one-time filter: the others are never started). The merge
-- sorts at most `limit` rows a state.
-- nullable: class_name, camera_id, cameras, run_id, frame_time_from, frame_time_to, min_score, max_score
WITH matching AS NOT MATERIALIZED (
    SELECT s.run_id, s.sighting_id, s.camera_id, s.first_frame_time, s.score, s.review_state
    FROM sightings s
    WHERE s.bucket_id = :bucket_id::text
      AND (:class_name::text IS NULL OR s.class_name = :class_name)
      AND (:camera_id::text IS NULL OR s.camera_id = :camera_id)
      AND (:cameras::text[] IS NULL OR s.camera_id = ANY (:cameras))
      AND (:run_id::text IS NULL OR s.run_id = :run_id)
      AND (:frame_time_from::timestamptz IS NULL OR s.first_frame_time >= :frame_time_from)
      AND (:frame_time_to::timestamptz IS NULL OR s.first_frame_time < :frame_time_to)
      AND (:min_score::real IS NULL OR s.score >= :min_score)
      AND (:max_score::real IS NULL OR s.score <= :max_score)
)
SELECT q.run_id, q.sighting_id, q.camera_id, q.first_frame_time, q.score
FROM unnest(:review_states::text[]) AS st (review_state)
CROSS JOIN LATERAL (
    (SELECT m.* FROM matching m
     WHERE :order_by::text = 'oldest' AND m.review_state = st.review_state
       AND (m.first_frame_time, m.run_id, m.sighting_id)
           > (:after_time::timestamptz, :after_run::text, :after_sighting::text)
     ORDER BY m.first_frame_time, m.run_id, m.sighting_id
     LIMIT :limit::bigint)
    UNION ALL
    (SELECT m.* FROM matching m
     WHERE :order_by = 'score' AND m.review_state = st.review_state
       AND (m.score, m.first_frame_time, m.run_id, m.sighting_id)
           > (:after_score::real, :after_time, :after_run, :after_sighting)
     ORDER BY m.score, m.first_frame_time, m.run_id, m.sighting_id
     LIMIT :limit)
    UNION ALL
    (SELECT m.* FROM matching m
     WHERE :order_by = 'camera' AND m.review_state = st.review_state
       AND (m.camera_id, m.first_frame_time, m.run_id, m.sighting_id)
           > (:after_camera::text, :after_time, :after_run, :after_sighting)
     ORDER BY m.camera_id, m.first_frame_time, m.run_id, m.sighting_id
     LIMIT :limit)
) q
ORDER BY CASE WHEN :order_by = 'score' THEN q.score END,
         CASE WHEN :order_by = 'camera' THEN q.camera_id END,
         q.first_frame_time, q.run_id, q.sighting_id
LIMIT :limit;

-- name: queue_sightings
-- The sightings ($1[n], $2[n]) (run, sighting id) as GetReview shows them (sightings_get,
-- across runs), with their run and score, in the order asked.
SELECT s.run_id, s.score, s.sighting_id, s.bucket_id, s.camera_id, s.class_name, m.item_ids,
       s.first_frame_time, s.last_frame_time, m.pending, m.accepted, m.rejected,
       m.relabel_variants, m.relabel_class, m.decided_at, m.decided_by
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u (run_id, sighting_id, ordinal)
JOIN sightings s ON s.run_id = u.run_id AND s.sighting_id = u.sighting_id
CROSS JOIN LATERAL (
    SELECT array_agg(bi.item_id ORDER BY bi.frame_time, bi.item_id) AS item_ids,
           count(*) FILTER (WHERE b.review_state = 'pending') AS pending,
           count(*) FILTER (WHERE b.review_state = 'accepted') AS accepted,
           count(*) FILTER (WHERE b.review_state = 'rejected') AS rejected,
           count(DISTINCT coalesce(b.relabel_class, '')) AS relabel_variants,
           max(b.relabel_class) AS relabel_class,
           max(b.decided_at) AS decided_at,
           (array_agg(b.decided_by ORDER BY b.decided_at DESC NULLS LAST))[1] AS decided_by
    FROM bucket_items bi
    CROSS JOIN LATERAL (SELECT array_position(bi.box_sightings, s.sighting_id) AS position) p
    CROSS JOIN LATERAL (
        SELECT coalesce(bi.box_states[p.position], 'pending') AS review_state,
               bi.box_relabels[p.position] AS relabel_class,
               bi.box_decided_at[p.position] AS decided_at,
               bi.box_decided_by[p.position] AS decided_by
    ) b
    WHERE bi.run_id = s.run_id AND bi.bucket_id = s.bucket_id AND bi.camera_id = s.camera_id
      AND bi.frame_time >= s.first_frame_time AND bi.frame_time <= s.last_frame_time
      AND p.position IS NOT NULL
) m
ORDER BY u.ordinal;

-- name: bulk_selection
-- The sightings a bulk decision selects in a bucket (filters as in queue_page_keys), at most
-- :limit, in key order, with what its selection revision digests.
-- nullable: class_name, camera_id, cameras, run_id, frame_time_from, frame_time_to, min_score, max_score
SELECT s.run_id, s.sighting_id, s.bucket_id, s.camera_id, s.item_count, s.first_frame_time,
       s.last_frame_time, s.review_state, s.pending_items, s.relabel_class, s.decided_at
FROM sightings s
WHERE s.bucket_id = :bucket_id::text AND s.review_state = ANY (:review_states::text[])
  AND (:class_name::text IS NULL OR s.class_name = :class_name)
  AND (:camera_id::text IS NULL OR s.camera_id = :camera_id)
  AND (:cameras::text[] IS NULL OR s.camera_id = ANY (:cameras))
  AND (:run_id::text IS NULL OR s.run_id = :run_id)
  AND (:frame_time_from::timestamptz IS NULL OR s.first_frame_time >= :frame_time_from)
  AND (:frame_time_to::timestamptz IS NULL OR s.first_frame_time < :frame_time_to)
  AND (:min_score::real IS NULL OR s.score >= :min_score)
  AND (:max_score::real IS NULL OR s.score <= :max_score)
ORDER BY s.run_id, s.sighting_id
LIMIT :limit::bigint;

-- name: bulk_changes
-- Of the sightings ($1[n], $2[n]), how many hold a box whose review is not already
-- ($3, $4), and how many items hold such a box: what a bulk decision would change.
SELECT count(DISTINCT (b.run_id, b.sighting_id))::integer AS sightings,
       count(DISTINCT b.item_id)::integer AS items
FROM sightings_boxes_v1($1::text[], $2::text[]) b
WHERE (coalesce(b.review_state, 'pending'), b.relabel_class) IS DISTINCT FROM ($3::text, $4::text);

-- name: bulk_decision_insert
-- nullable: relabel_class
INSERT INTO bulk_decisions (action_id, bucket_id, filter, review_state, relabel_class,
                            decided_by, decided_at)
VALUES (:action_id::text, :bucket_id::text, :filter::jsonb, :review_state::text,
        :relabel_class::text, :decided_by::jsonb, :decided_at::timestamptz);

-- name: bulk_decide
-- nullable: relabel_class
SELECT changed_sightings, changed_items
FROM sightings_bulk_decide_v1(p_action => :action_id::text, p_runs => :run_ids::text[],
                              p_sightings => :sighting_ids::text[],
                              p_state => :review_state::text, p_relabel => :relabel_class::text,
                              p_by => :decided_by::jsonb, p_now => :now::timestamptz);

-- name: bulk_decision_get
SELECT action_id, bucket_id, filter, review_state, relabel_class, decided_by, decided_at,
       sightings_selected, sightings_changed, items_changed, undone_by, undone_at
FROM bulk_decisions WHERE action_id = $1;

-- name: bulk_decision_timelines
-- The timelines of the items a bulk decision changed that still exist (their locks come
-- before the action's row and the items).
SELECT DISTINCT bi.run_id, bi.bucket_id, bi.camera_id
FROM bulk_decision_boxes l JOIN bucket_items bi ON bi.item_id = l.item_id
WHERE l.action_id = $1
ORDER BY 1, 2, 3;

-- name: bulk_decision_locked
SELECT action_id, bucket_id, filter, review_state, relabel_class, decided_by, decided_at,
       sightings_selected, sightings_changed, items_changed, undone_by, undone_at
FROM bulk_decisions WHERE action_id = $1
FOR UPDATE;

-- name: bulk_decision_changed_since
-- How many boxes a bulk decision changed were decided again since (their review is no
-- longer the action's, or another decision's time), of items that still exist.
SELECT count(*)::integer
FROM bulk_decision_boxes l
JOIN bulk_decisions a ON a.action_id = l.action_id
JOIN bucket_items bi ON bi.item_id = l.item_id
WHERE l.action_id = $1
  AND (bi.box_states[l.box_position], bi.box_relabels[l.box_position],
       bi.box_decided_at[l.box_position])
      IS DISTINCT FROM (a.review_state, a.relabel_class, a.decided_at);

-- name: bulk_decision_undo
SELECT bulk_decision_undo_v1($1::text, $2::jsonb, $3::timestamptz);
