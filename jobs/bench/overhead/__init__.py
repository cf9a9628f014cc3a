"""Fault-free cost of ours against plain torchrun: interleaved A/B runs of the same loop
(`bench_overhead.py`), per-step wall and CPU time from every rank's step events."""
