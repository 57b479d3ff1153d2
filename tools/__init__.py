"""Applications built on the services.

The demo, launchers of a local stack, and the Triton model repository tool.
"""
