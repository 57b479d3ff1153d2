"""Session-wide fixtures: real Postgres, real S3 (SeaweedFS), real Triton, started on demand."""

pytest_plugins = [
    "testbed.harness.sigterm",
    "testbed.harness.postgres",
    "testbed.harness.s3",
    "testbed.harness.triton",
    "testbed.harness.coordinator",
    "testbed.harness.preview",
    "testbed.harness.gateway",
    "testbed.harness.browser",
    "tests.sweep.report",
    "tests.durations",
]
