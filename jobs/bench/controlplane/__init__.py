"""The control-plane benchmark's parts: simulated ranks on rank hosts, the worker group the real
supervisor drives them through, the event probe, save rounds, and the report."""
