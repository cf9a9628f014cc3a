"""The recovery-tier benchmark's parts: the train loop, the runs per size, their summary."""
