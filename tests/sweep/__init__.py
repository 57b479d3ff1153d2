"""The generated bad-input sweep's strategies and servers (tests/test_sweep.py)."""
