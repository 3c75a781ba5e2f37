"""The benchmark suite: `python -m benchmarks.run [--quick]` (see benchmarks/run.py and RESULTS.md)."""
