"""Benchmarks: ``python -m ferrylink.benchmarks.send_recv``."""
