-- Model families (issue 35, docs/bring-your-own-model.md): what a published version's served
-- graph decodes and with which settings, recorded with its pin.
--
-- Pre-migration: columns with defaults only. A release-0.1 coordinator inserts versions
-- without them (they take the defaults: "not recorded") and reads rows by column name, so it
-- keeps serving unchanged; nothing to post-migrate.
ALTER TABLE model_versions
    ADD COLUMN family text NOT NULL DEFAULT '',
    ADD COLUMN confidence_threshold double precision NOT NULL DEFAULT 0,
    ADD COLUMN iou_threshold double precision NOT NULL DEFAULT 0,
    ADD COLUMN max_detections integer NOT NULL DEFAULT 0,
    ADD COLUMN source_sha256 text NOT NULL DEFAULT '';
