"""Benchmarks: what a Relay step, batch and waiting run cost, beside bare Celery and LangGraph.

`python -m bench.run [--quick]` starts a private Redis, a loopback model server
and worker processes, measures everything side by side in one run, prints a
table of ratios and writes `bench/out/results.json`. It is not a test.
"""
