"""Benchmarks: `python -m bench [frontend|worker|operator|all]` prints tables, writes JSON."""
