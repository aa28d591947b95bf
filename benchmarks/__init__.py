"""Benchmarks: scripts that print figures. Run as modules: `python -m benchmarks.NAME`."""
