"""Builders shared by the tests and the benchmarks: real-component harnesses and worlds.

The tests import from here, never the other way round; tests/ is a leaf.
"""
