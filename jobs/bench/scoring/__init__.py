"""Pure scoring for the benchmarks (no training, unit-tested): the shared yardstick, checkpoint
intervals from measured costs, checkpoint staleness, and statistics over repetitions."""
