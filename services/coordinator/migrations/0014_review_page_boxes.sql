-- Workshop coordinator: a review page's boxes by one index range (docs/review.md).
--
-- A GetReview page is a range of a run's items in (frame_time, item_id) order; with this
-- index its boxes are the same range of sighting_boxes, one index scan, where looking
-- up its 1,000 items one by one in the primary key cost about three times the Postgres
-- CPU (bench.review). Additive: coordinators of the previous version do not use it and
-- keep working. On a large sighting_boxes table it is built under a write lock held for
-- the build (seconds per million boxes); docs/upgrading.md says so.
CREATE INDEX sighting_boxes_by_run_frame ON sighting_boxes (run_id, frame_time, item_id);
