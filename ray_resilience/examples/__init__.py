"""Example workload used by `jobs/train_llama_fsdp.py`, the tests and the benchmarks.

A LLaMA-style decoder and a deterministic token dataset stored as Parquet shards.
"""
