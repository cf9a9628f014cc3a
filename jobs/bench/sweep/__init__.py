"""Orchestration of the benchmark sweeps: plans, phases of runs, summaries, result files."""
