"""Synthetic footage for tests and the demo: solid-coloured objects moving on a dark background."""
