"""The control plane's message path: ranks' heartbeats folded into one batch per node and
interval (`batch.py`), the per-node agent that sends them (`node_agent.py`), and the run's
per-step record streamed to the run folder (`metrics_log.py`)."""
