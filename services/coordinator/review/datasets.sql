-- Dataset versions: a bucket's reviewed items frozen (docs/datasets.md).

-- name: dataset_version_freeze
-- Freezes the items of bucket :bucket_id that match the filter (as review's
-- bucket_items_page filters them, every camera) into the version whose id is "dv_" and the
-- SHA-256 of its canonical content, unless that version exists: one statement, set-based
-- (the items are one INSERT ... SELECT). The content, UTF-8, lines joined by "\n": the
-- header "workshop-dataset-version 1", "bucket <id>", "filter <:filter, canonical JSON>",
-- "classes <JSON array>", "seed <n>", "val_fraction <shortest decimal>", then one line per
-- item in order (frame time, item id): "<item id> <image sha256> <split> <boxes JSON>".
-- An item's boxes are those after review (bucket_item_reviewed_boxes), rejected ones left
-- out; its split is "val" when the first 13 hex digits of SHA-256("<seed>:<item id>"), as
-- a fraction of 16^13, are below val_fraction. The classes are the bucket's (as exports
-- list them) and the version's boxes', sorted. Answers the version id and whether this
-- call made it (false: a version with this content existed; nothing was written).
-- nullable: review_states, class_name, camera_id, run_id, frame_time_from, frame_time_to, min_score, max_score
WITH picked AS MATERIALIZED (
    SELECT bi.item_id, bi.object_key, bi.sha256, bi.camera_id, bi.frame_time,
           coalesce(b.boxes, '[]'::jsonb) AS boxes,
           (row_number() OVER (ORDER BY bi.frame_time, bi.item_id))::integer AS ordinal,
           CASE WHEN ('x' || substr(encode(sha256(convert_to(
                          :seed::bigint::text || ':' || bi.item_id, 'UTF8')), 'hex'), 1, 13)
                     )::bit(52)::bigint
                     < :val_fraction::double precision * 4503599627370496
                THEN 'val' ELSE 'train' END AS split
    FROM bucket_items bi
    CROSS JOIN LATERAL (
        SELECT jsonb_agg(jsonb_build_object('class_name', r.class_name, 'score', r.score,
                                            'x', r.x, 'y', r.y, 'w', r.w, 'h', r.h)
                         ORDER BY r.box_index) AS boxes
        FROM bucket_item_reviewed_boxes_v1(bi.boxes, bi.corrected_boxes, bi.box_states,
                                           bi.box_relabels, bi.item_state, bi.item_relabel) r
        WHERE r.review_state <> 'rejected'
    ) b
    WHERE bi.bucket_id = :bucket_id::text
      AND (:review_states::text[] IS NULL OR bi.review_state = ANY (:review_states))
      AND (:class_name::text IS NULL OR EXISTS (
              SELECT 1
              FROM bucket_item_reviewed_boxes_v1(bi.boxes, bi.corrected_boxes, bi.box_states,
                                                 bi.box_relabels, bi.item_state,
                                                 bi.item_relabel) r
              WHERE r.class_name = :class_name))
      AND (:camera_id::text IS NULL OR bi.camera_id = :camera_id)
      AND (:run_id::text IS NULL OR bi.run_id = :run_id)
      AND (:frame_time_from::timestamptz IS NULL OR bi.frame_time >= :frame_time_from)
      AND (:frame_time_to::timestamptz IS NULL OR bi.frame_time < :frame_time_to)
      AND (:min_score::real IS NULL OR bucket_item_score_v1(bi.boxes) >= :min_score)
      AND (:max_score::real IS NULL OR bucket_item_score_v1(bi.boxes) <= :max_score)
), classes AS (
    SELECT coalesce(array_agg(u.class_name ORDER BY u.class_name), '{}') AS classes
    FROM (
        SELECT c.class_name FROM workflow_class_counts c
        WHERE c.bucket_id = :bucket_id AND c.detections > 0
        UNION
        SELECT e ->> 'class_name' FROM picked p CROSS JOIN LATERAL jsonb_array_elements(p.boxes) e
    ) u
), content AS (
    SELECT 'dv_' || encode(sha256(convert_to(
               'workshop-dataset-version 1' || E'\n' || 'bucket ' || :bucket_id || E'\n'
               || 'filter ' || :filter::text || E'\n'
               || 'classes ' || to_jsonb(c.classes)::text || E'\n'
               || 'seed ' || :seed::text || E'\n'
               || 'val_fraction ' || :val_fraction::text
               || coalesce(E'\n' || string_agg(
                      p.item_id || ' ' || p.sha256 || ' ' || p.split || ' ' || p.boxes::text,
                      E'\n' ORDER BY p.ordinal), ''),
               'UTF8')), 'hex') AS version_id,
           c.classes,
           count(p.item_id)::integer AS item_count,
           (count(p.item_id) FILTER (WHERE p.split = 'val'))::integer AS val_count,
           coalesce(sum(jsonb_array_length(p.boxes)), 0)::integer AS box_count,
           coalesce(array_agg(DISTINCT p.camera_id) FILTER (WHERE p.camera_id IS NOT NULL),
                    '{}') AS camera_ids
    FROM classes c
    LEFT JOIN picked p ON true
    GROUP BY c.classes
), made AS (
    INSERT INTO dataset_versions (version_id, bucket_id, name, filter, classes, seed,
                                  val_fraction, camera_ids, item_count, val_count, box_count,
                                  created_by, created_at)
    SELECT c.version_id, :bucket_id, :name::text, :filter::jsonb, c.classes, :seed,
           :val_fraction, c.camera_ids, c.item_count, c.val_count, c.box_count,
           :created_by::jsonb, :created_at::timestamptz
    FROM content c
    ON CONFLICT (version_id) DO NOTHING
    RETURNING version_id
), stored AS (
    INSERT INTO dataset_version_items (version_id, ordinal, item_id, object_key, sha256,
                                       camera_id, frame_time, boxes, split)
    SELECT m.version_id, p.ordinal, p.item_id, p.object_key, p.sha256, p.camera_id,
           p.frame_time, p.boxes, p.split
    FROM made m CROSS JOIN picked p
)
SELECT c.version_id, EXISTS (SELECT 1 FROM made) AS created FROM content c;

-- name: dataset_version_get
SELECT version_id, bucket_id, name, filter, classes, seed, val_fraction, camera_ids, item_count,
       val_count, box_count, created_by, created_at
FROM dataset_versions WHERE version_id = $1;

-- name: dataset_versions_page
-- A bucket's versions, newest first, before the key (before_created_at, before_version_id;
-- NULL: from the newest), those whose cameras all lie in :cameras (NULL: every version).
-- nullable: before_created_at, before_version_id, cameras
SELECT version_id, bucket_id, name, filter, classes, seed, val_fraction, camera_ids, item_count,
       val_count, box_count, created_by, created_at
FROM dataset_versions
WHERE bucket_id = :bucket_id::text
  AND (:before_created_at::timestamptz IS NULL
       OR (created_at, version_id) < (:before_created_at, :before_version_id::text))
  AND (:cameras::text[] IS NULL OR camera_ids <@ :cameras)
ORDER BY created_at DESC, version_id DESC
LIMIT :limit::bigint;

-- name: item_versions_page
-- The versions that hold item :item_id, newest first, before the key (as
-- dataset_versions_page).
-- nullable: before_created_at, before_version_id
SELECT v.version_id, v.bucket_id, v.name, v.filter, v.classes, v.seed, v.val_fraction,
       v.camera_ids, v.item_count, v.val_count, v.box_count, v.created_by, v.created_at
FROM dataset_version_items i
JOIN dataset_versions v ON v.version_id = i.version_id
WHERE i.item_id = :item_id::text
  AND (:before_created_at::timestamptz IS NULL
       OR (v.created_at, v.version_id) < (:before_created_at, :before_version_id::text))
ORDER BY v.created_at DESC, v.version_id DESC
LIMIT :limit::bigint;

-- name: item_camera
-- The camera of a bucket item (no row: no such item).
SELECT camera_id FROM bucket_items WHERE item_id = $1;

-- name: dataset_version_items_page
-- A version's items in its order, after ordinal $2.
SELECT ordinal, item_id, object_key, sha256, camera_id, frame_time, boxes, split
FROM dataset_version_items
WHERE version_id = $1 AND ordinal > $2
ORDER BY ordinal
LIMIT $3;

-- name: dataset_versions_diff_page
-- The items that differ between versions $1 (from) and $2 (to), by item id after $3:
-- added, removed, relabelled (the same boxes but for their classes) or boxes_changed.
SELECT d.item_id, d.before, d.after,
       CASE WHEN d.before IS NULL THEN 'added'
            WHEN d.after IS NULL THEN 'removed'
            WHEN (SELECT jsonb_agg(e - 'class_name' ORDER BY o)
                  FROM jsonb_array_elements(d.before) WITH ORDINALITY AS t (e, o))
                 IS NOT DISTINCT FROM
                 (SELECT jsonb_agg(e - 'class_name' ORDER BY o)
                  FROM jsonb_array_elements(d.after) WITH ORDINALITY AS t (e, o))
            THEN 'relabelled'
            ELSE 'boxes_changed' END AS kind
FROM (
    SELECT coalesce(a.item_id, b.item_id) AS item_id, a.boxes AS before, b.boxes AS after
    FROM (SELECT item_id, boxes FROM dataset_version_items WHERE version_id = $1) a
    FULL JOIN (SELECT item_id, boxes FROM dataset_version_items WHERE version_id = $2) b
        ON a.item_id = b.item_id
    WHERE a.boxes IS DISTINCT FROM b.boxes
) d
WHERE d.item_id > $3
ORDER BY d.item_id
LIMIT $4;

-- name: dataset_versions_diff_counts
-- How many items of the diff of versions $1 and $2 are of each kind, and unchanged.
SELECT count(*) FILTER (WHERE d.before IS NULL) AS added,
       count(*) FILTER (WHERE d.after IS NULL) AS removed,
       count(*) FILTER (WHERE d.before IS NOT NULL AND d.after IS NOT NULL
                          AND d.before <> d.after AND d.geometry_same) AS relabelled,
       count(*) FILTER (WHERE d.before IS NOT NULL AND d.after IS NOT NULL
                          AND d.before <> d.after AND NOT d.geometry_same) AS boxes_changed,
       count(*) FILTER (WHERE d.before = d.after) AS unchanged
FROM (
    SELECT a.boxes AS before, b.boxes AS after,
           (SELECT jsonb_agg(e - 'class_name' ORDER BY o)
            FROM jsonb_array_elements(a.boxes) WITH ORDINALITY AS t (e, o))
           IS NOT DISTINCT FROM
           (SELECT jsonb_agg(e - 'class_name' ORDER BY o)
            FROM jsonb_array_elements(b.boxes) WITH ORDINALITY AS t (e, o)) AS geometry_same
    FROM (SELECT item_id, boxes FROM dataset_version_items WHERE version_id = $1) a
    FULL JOIN (SELECT item_id, boxes FROM dataset_version_items WHERE version_id = $2) b
        ON a.item_id = b.item_id
) d;
