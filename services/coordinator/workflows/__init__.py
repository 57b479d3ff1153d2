"""The workflows room: workflow documents and their revisions (save, get, list, delete),
the validation of a document against the catalog, and which scheduled workflows are due
(docs/workflows.md). It owns `workflows.sql` and calls identity and resources; runs read
a workflow through its public functions (`live_workflow`, `lock_revision`, `load_catalog`,
`scheduled_workflows`) and never its SQL."""
