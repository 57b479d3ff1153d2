-- phase: post
-- Workshop coordinator: processors may leave recorded boxes out of Complete from here on
-- (docs/upgrading.md, 0021 and 0022).
--
-- A coordinator answers ClaimedJob.takes_recorded_boxes only once this migration is
-- applied. Being a post-migration, it applies only when no coordinator older than 0021
-- serves, and after it there is no rolling back to one: a coordinator of the previous
-- version, which ignores RoutedOutput.boxes_recorded and would save such items without
-- boxes, can never receive a Complete for a job claimed with the flag. It changes nothing
-- else (a comment, so the function says what it takes).
COMMENT ON FUNCTION job_complete(text, integer, bigint, uuid, text, text, text, text, integer, timestamptz, integer, integer, integer, integer, text[], text[], integer[], text[], text[], integer[], text[], timestamptz[], text[], text[], text[], timestamptz) IS
    'Takes an item''s boxes from its preview''s record when they are NULL (0021); coordinators answer ClaimedJob.takes_recorded_boxes once 0022 is applied.';
