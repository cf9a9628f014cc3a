"""Rendering docs/benchmarks.md (and the README's summary table) from the result files."""
