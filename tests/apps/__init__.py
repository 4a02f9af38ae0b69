"""Relay apps the runtime tests run in real worker processes."""
