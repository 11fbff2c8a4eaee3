"""Benchmarks (run with ``python run.py bench ...``)."""
