"""The generated bad-input sweep's strategies and servers (tests/service/test_sweep.py)."""
