"""Machinery every mechanism of the recovery benchmark shares: the workload contract, the
training loop, the event log and its conversion into a `RunTimeline`, launchers, the private
Ray, checkpoint I/O, and the isolated runner that charges each run's processes."""
