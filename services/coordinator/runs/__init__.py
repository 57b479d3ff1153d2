"""The runs room: admission of a run (`admission`, planning its jobs from recordings in
`planning`, the immutable snapshot), the `Runs` service (create, read, list, cancel,
page the snapshot), the snapshot cache (`snapshots`), a run's status from its jobs
(`status`), run events over LISTEN/NOTIFY that WatchRun and Claim wait on (`events`),
photos (a photo is a one-frame test run: `photos`) and the scheduler's daily runs
(`scheduler`). It owns `runs.sql` and calls identity, resources and workflows; review,
leases and previews read its rows and snapshots."""
