-- Dataset versions (issue 36; docs/datasets.md). Pre-migration: two new tables and
-- their indexes; nothing existing changes, so a coordinator of the release before keeps
-- serving unchanged (it never reads or writes them). Nothing to post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- A bucket's reviewed items frozen: immutable once written (no statement updates a
-- version or its items; a bucket's deletion leaves its versions, which name items by id).
-- version_id: "dv_" and the SHA-256 of the canonical content (review/datasets.sql,
-- dataset_version_freeze), so the same content is the same row. filter: the filter as
-- applied (canonical JSON); classes: the class list in index order; seed, val_fraction:
-- the train/val split (an item is in val when its split_point is below val_fraction);
-- camera_ids: its items' cameras, sorted (what a camera-bound reader must reach).
CREATE TABLE dataset_versions (
    version_id   text PRIMARY KEY,
    bucket_id    text NOT NULL,
    name         text NOT NULL,
    filter       jsonb NOT NULL,
    classes      text[] NOT NULL,
    seed         bigint NOT NULL,
    val_fraction double precision NOT NULL,
    camera_ids   text[] NOT NULL,
    item_count   integer NOT NULL,
    val_count    integer NOT NULL,
    box_count    integer NOT NULL,
    created_by   jsonb NOT NULL,
    created_at   timestamptz NOT NULL
);

CREATE INDEX dataset_versions_by_bucket
    ON dataset_versions (bucket_id, created_at, version_id);

-- One frozen item of a version, in the version's order (ordinal: 1.. by frame time, item
-- id): its image (key and digest), where and when, and its boxes after review as a JSON
-- array of {"class_name", "score", "x", "y", "w", "h"} (rejected boxes left out).
CREATE TABLE dataset_version_items (
    version_id text NOT NULL REFERENCES dataset_versions (version_id) ON DELETE CASCADE,
    ordinal    integer NOT NULL,
    item_id    text NOT NULL,
    object_key text NOT NULL,
    sha256     text NOT NULL,
    camera_id  text NOT NULL,
    frame_time timestamptz NOT NULL,
    boxes      jsonb NOT NULL,
    split      text NOT NULL CHECK (split IN ('train', 'val')),
    PRIMARY KEY (version_id, ordinal)
);

-- The versions that hold an item (ListItemVersions), and a diff's join by item id.
CREATE INDEX dataset_version_items_by_item ON dataset_version_items (item_id, version_id);
