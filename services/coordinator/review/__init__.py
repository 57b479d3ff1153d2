"""The review room (docs/review.md): what people decide about a run's boxes.

Owns sightings (which boxes of a timeline show the same object: `sightings`, pure),
grouping committed items into sightings, review pages and decisions, the summary and
bucket datasets (`reviews.ReviewApi` and its rows), and their SQL (`review.sql`). It calls
identity and reads runs' rows; leases call `reviews.group_items` inside the committing
transaction, before they write the items, and maintenance `reviews.group_backlog`
(docs/architecture.md; the storage: docs/review.md, "Storage").
"""
