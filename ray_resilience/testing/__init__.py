"""Fault injection for tests and benchmarks: pass a `FaultPlan` as
`ResilienceConfig(fault_plan=...)`; each fault fires once, on the rank's training thread.
"""

from ray_resilience.testing.faults import Fault, FaultKind, FaultPlan, InjectedFault

__all__ = ["Fault", "FaultKind", "FaultPlan", "InjectedFault"]
