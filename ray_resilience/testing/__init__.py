"""Fault injection for tests and benchmarks: plans of faults, fired on the ranks' training threads.

Pass a `FaultPlan` as `ResilienceConfig(fault_plan=...)`; each fault fires once at its step.
"""

from ray_resilience.testing.faults import Fault, FaultKind, FaultPlan, InjectedFault

__all__ = ["Fault", "FaultKind", "FaultPlan", "InjectedFault"]
