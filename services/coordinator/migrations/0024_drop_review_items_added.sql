-- phase: post
-- Workshop coordinator: drops review_items_added (docs/upgrading.md, 0024).
--
-- Only the statement trigger on bucket_items called it, and since 0023 that trigger reads
-- the inserted rows itself. A post-migration, as every drop is: it applies once no
-- coordinator older than 0023 is connected.
DROP FUNCTION review_items_added(text[]);
