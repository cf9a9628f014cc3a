"""The checkpoint benchmark's parts: savers (one per method), the rank actor, the driver."""
