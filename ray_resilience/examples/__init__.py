"""Example workload for `jobs/train_llama_fsdp.py`, the tests and the benchmarks: a LLaMA-style
decoder and a deterministic token dataset in Parquet shards.
"""
