"""Benchmark scripts (run by hand; results recorded in docs/benchmarks.md)."""
