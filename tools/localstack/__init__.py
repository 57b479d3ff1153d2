"""Launchers for a local stack on this machine: a throwaway Postgres cluster, SeaweedFS
(`weed mini`), the Triton server that nvidia-pytriton bundles, and Workshop services as
processes. The demo (`python -m tools.demo`) and the test harness (`testbed/harness`) both
start their components through these modules; each stops exactly what it started, by PID.

They need the coordinator, preview and triton extras (asyncpg, minio, nvidia-pytriton).
"""
