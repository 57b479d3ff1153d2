"""Session-wide fixtures: real Postgres, real S3 (SeaweedFS), real Triton, started on demand."""

pytest_plugins = [
    "tests.harness.postgres",
    "tests.harness.s3",
    "tests.harness.triton",
    "tests.harness.coordinator",
    "tests.harness.preview",
]
