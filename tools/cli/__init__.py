"""The `workshop` command line: every operator task over gRPC with an admin key (docs/cli.md)."""
