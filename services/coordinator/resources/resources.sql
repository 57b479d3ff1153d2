-- Devices, runtimes, cameras, recordings, model versions and buckets (docs/concepts.md).

-- name: device_register
INSERT INTO devices (device_id, description, registered_at) VALUES ($1, $2, $3)
ON CONFLICT (device_id) DO NOTHING
RETURNING *;

-- name: device_get
SELECT * FROM devices WHERE device_id = $1;

-- name: device_list
SELECT * FROM devices WHERE $1::text IS NULL OR device_id > $1 ORDER BY device_id LIMIT $2;

-- name: runtime_register
-- Same manifest again: the union of old and new capabilities.
INSERT INTO runtimes (runtime_id, device_id, engine, code_sha256, capabilities, registered_at)
VALUES (:runtime_id::text, :device_id::text, :engine::text, :code_sha256::text,
        :capabilities::text[], :registered_at::timestamptz)
ON CONFLICT (runtime_id) DO UPDATE
    SET capabilities = ARRAY(
        SELECT DISTINCT c FROM unnest(runtimes.capabilities || EXCLUDED.capabilities) AS c ORDER BY c)
RETURNING *, (xmax = 0) AS created;

-- name: runtime_get
SELECT * FROM runtimes WHERE runtime_id = $1;

-- name: runtime_list
-- Newest registration first; the page token is the (registered_at, runtime_id) of the last row.
SELECT * FROM runtimes
WHERE ($1::text IS NULL OR device_id = $1)
  AND ($2::timestamptz IS NULL OR (registered_at, runtime_id) < ($2, $3::text))
ORDER BY registered_at DESC, runtime_id DESC
LIMIT $4;

-- name: runtime_newest_seen
-- The newest runtime that ever checked in (schedules and agents, docs/runs-and-jobs.md).
SELECT * FROM runtimes WHERE last_seen_at IS NOT NULL
ORDER BY last_seen_at DESC, registered_at DESC, runtime_id LIMIT 1;

-- name: runtime_newest_capable
-- The newest runtime seen since $1 holding every capability in $2 (the website, docs/runs-and-jobs.md).
SELECT * FROM runtimes WHERE last_seen_at >= $1 AND capabilities @> $2::text[]
ORDER BY last_seen_at DESC, registered_at DESC, runtime_id LIMIT 1;

-- name: runtime_gauges
-- The runtimes the metrics endpoint reports (docs/metrics.md): those seen since $1, and
-- each device's newest registration (newest: the runtime a pool of that device's processors
-- runs, as the KEDA trigger and register-runtime's rollout assume), with when each was last
-- seen (NULL: never). The runtimes table holds one row per processor version: a scan.
WITH newest AS (
    SELECT DISTINCT ON (device_id) runtime_id FROM runtimes
    ORDER BY device_id, registered_at DESC, runtime_id DESC
)
SELECT rt.runtime_id, rt.device_id, rt.last_seen_at,
       rt.runtime_id IN (SELECT runtime_id FROM newest) AS newest
FROM runtimes rt
WHERE rt.last_seen_at >= $1 OR rt.runtime_id IN (SELECT runtime_id FROM newest)
ORDER BY rt.device_id, rt.runtime_id;

-- name: camera_put
INSERT INTO cameras (camera_id, name, created_at, updated_at) VALUES ($1, $2, $3, $3)
ON CONFLICT (camera_id) DO UPDATE SET name = EXCLUDED.name, updated_at = EXCLUDED.updated_at
RETURNING *;

-- name: camera_list
SELECT * FROM cameras WHERE $1::text IS NULL OR camera_id > $1 ORDER BY camera_id LIMIT $2;

-- name: camera_ids_all
SELECT camera_id FROM cameras;

-- name: recording_put
-- Every put is a new generation, even of identical bytes; a recording keeps its camera.
INSERT INTO recordings (recording_id, camera_id, generation, start_at, end_at, fps, object_key,
                        sha256, byte_size, put_at, expires_at)
VALUES (:recording_id::text, :camera_id::text, 1, :start_at::timestamptz, :end_at::timestamptz,
        :fps::double precision, :object_key::text, :sha256::text, :byte_size::bigint,
        :put_at::timestamptz, :expires_at::timestamptz)
ON CONFLICT (recording_id) DO UPDATE
    SET generation = recordings.generation + 1, start_at = EXCLUDED.start_at,
        end_at = EXCLUDED.end_at, fps = EXCLUDED.fps, object_key = EXCLUDED.object_key,
        sha256 = EXCLUDED.sha256, byte_size = EXCLUDED.byte_size, put_at = EXCLUDED.put_at,
        expires_at = EXCLUDED.expires_at, deleted_at = NULL
    WHERE recordings.camera_id = EXCLUDED.camera_id
RETURNING *;

-- name: recording_get
SELECT * FROM recordings WHERE recording_id = $1;

-- name: recording_delete
UPDATE recordings SET deleted_at = $2
WHERE recording_id = $1 AND deleted_at IS NULL
RETURNING *;

-- name: recording_list
-- nullable: camera_id, overlaps_from, overlaps_until, after_start, after_id
SELECT * FROM recordings
WHERE deleted_at IS NULL AND expires_at > :now::timestamptz
  AND (:camera_id::text IS NULL OR camera_id = :camera_id)
  AND (:overlaps_from::timestamptz IS NULL OR end_at > :overlaps_from)
  AND (:overlaps_until::timestamptz IS NULL OR start_at < :overlaps_until)
  AND (:after_start::timestamptz IS NULL
       OR (start_at, recording_id) > (:after_start, :after_id::text))
ORDER BY start_at, recording_id
LIMIT :limit::bigint;

-- name: recording_list_for_input
-- Current recordings of the cameras $2 that overlap the window [$3, $4).
SELECT recording_id, camera_id, generation, start_at, end_at, fps, object_key, sha256, byte_size,
       expires_at
FROM recordings
WHERE camera_id = ANY($2::text[]) AND deleted_at IS NULL AND expires_at > $1
  AND end_at > $3 AND start_at < $4;

-- name: recording_covering
-- The newest current recording of a camera that covers the instant $2 (photos).
SELECT recording_id, camera_id, generation, start_at, end_at, fps, object_key, sha256, byte_size,
       expires_at
FROM recordings
WHERE camera_id = $1 AND start_at <= $2 AND end_at > $2 AND deleted_at IS NULL AND expires_at > $3
ORDER BY put_at DESC, recording_id
LIMIT 1;

-- name: model_version_publish
INSERT INTO model_versions (name, version, weights_sha256, classes, input_shape, published_at,
                            family, confidence_threshold, iou_threshold, max_detections,
                            source_sha256)
VALUES (:name::text, :version::bigint, :weights_sha256::text, :classes::text[],
        :input_shape::bigint[], :published_at::timestamptz, :family::text,
        :confidence_threshold::double precision, :iou_threshold::double precision,
        :max_detections::integer, :source_sha256::text)
ON CONFLICT (name, version) DO NOTHING
RETURNING *;

-- name: model_version_get
SELECT * FROM model_versions WHERE name = $1 AND version = $2;

-- name: model_version_list
SELECT * FROM model_versions
WHERE ($1::text IS NULL OR name = $1)
  AND ($2::text IS NULL OR (name, version) > ($2, $3::bigint))
ORDER BY name, version
LIMIT $4;

-- name: model_version_all
SELECT name, version, weights_sha256, classes, input_shape, published_at, family,
       confidence_threshold, iou_threshold, max_detections, source_sha256
FROM model_versions;

-- name: bucket_create
INSERT INTO buckets (bucket_id, name, created_at) VALUES ($1, $2, $3)
ON CONFLICT (bucket_id) DO NOTHING
RETURNING *;

-- name: bucket_get
SELECT * FROM buckets WHERE bucket_id = $1;

-- name: bucket_delete
UPDATE buckets SET deleted_at = $2 WHERE bucket_id = $1 AND deleted_at IS NULL RETURNING *;

-- name: bucket_list
SELECT * FROM buckets
WHERE deleted_at IS NULL AND ($1::text IS NULL OR bucket_id > $1)
ORDER BY bucket_id LIMIT $2;

-- name: bucket_ids_live
SELECT bucket_id FROM buckets WHERE deleted_at IS NULL;

-- name: bucket_items_delete
SELECT bucket_items_delete_v1($1, $2);

-- name: camera_get
SELECT * FROM cameras WHERE camera_id = $1;
