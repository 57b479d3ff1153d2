"""The shared kit: settings, gRPC server bootstrap, error mapping, channels, credentials, hashing.

Nothing in here knows about any one service; services import what they need.
"""
