"""A read-only view of the Ray cluster inside a RayJob / RayCluster / RayService document: pod
groups, pod counts, mounts and requests, read defensively (the schema check reports malformed
documents).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

CLUSTER_SPEC_PATH = {
    "RayCluster": ("spec",),
    "RayJob": ("spec", "rayClusterSpec"),
    "RayService": ("spec", "rayClusterConfig"),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity (`8`, `500m`, `64Gi`, `1e3`) as a Decimal; None if invalid."""
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return None
    number, suffix = match.groups()
    try:
        if suffix and suffix[0] in "eE":
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIXES.get(suffix or "", Decimal(1))
    except InvalidOperation:
        return None


@dataclass(frozen=True)
class PodGroup:
    """The head group or one worker group of a Ray cluster spec, with its YAML path."""

    name: str
    path: tuple[str | int, ...]
    spec: dict[str, Any]
    is_head: bool

    @property
    def pod_path(self) -> tuple[str | int, ...]:
        return (*self.path, "template", "spec")

    @property
    def pod_spec(self) -> dict[str, Any]:
        template = self.spec.get("template") or {}
        return template.get("spec") or {}

    def ray_container(self) -> dict[str, Any]:
        """KubeRay runs Ray in the pod's first container (RayContainerIndex = 0)."""
        containers = self.pod_spec.get("containers") or [{}]
        return containers[0] or {}

    def pods(self) -> int:
        """Pods this group runs without autoscaling: replicas clamped to [min, max] x hosts."""
        if self.is_head:
            return 1
        if self.spec.get("suspend"):
            return 0
        replicas = int(self.spec.get("replicas") or 0)
        low, high = int(self.spec.get("minReplicas") or 0), self.spec.get("maxReplicas")
        replicas = max(replicas, low) if high is None else min(max(replicas, low), int(high))
        return replicas * int(self.spec.get("numOfHosts") or 1)


def cluster_spec(doc: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """(path, RayCluster spec) of a RayJob / RayCluster / RayService, or None if it has none."""
    path = CLUSTER_SPEC_PATH.get(doc.get("kind", ""))
    node: Any = doc
    for key in path or ():
        node = node.get(key) if isinstance(node, dict) else None
    return (path, node) if path and isinstance(node, dict) else None


def pod_groups(doc: dict[str, Any]) -> list[PodGroup]:
    """Head group first, then every worker group, for any Ray kind with a cluster spec."""
    found = cluster_spec(doc)
    if found is None:
        return []
    path, spec = found
    groups = [PodGroup("head", (*path, "headGroupSpec"), spec.get("headGroupSpec") or {}, True)]
    for i, worker in enumerate(spec.get("workerGroupSpecs") or []):
        name = str(worker.get("groupName", f"worker group {i}"))
        groups.append(PodGroup(name, (*path, "workerGroupSpecs", i), worker, False))
    return groups


# Where built-in workload kinds keep the spec of the pods they run.
WORKLOAD_POD_SPEC_PATH = {
    "Pod": ("spec",),
    **dict.fromkeys(
        ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController", "Job"),
        ("spec", "template", "spec"),
    ),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


@dataclass(frozen=True)
class PodSpecAt:
    """One pod spec a document makes Kubernetes run, with its YAML path."""

    name: str
    """What runs it, for messages: `head pod`, `gpu-p5 pod`, `submitter pod`, `Deployment pod`."""
    path: tuple[str | int, ...]
    spec: dict[str, Any]


def pod_specs(doc: dict[str, Any]) -> list[PodSpecAt]:
    """Every pod spec in a document: Ray groups, a RayJob's submitter template, workload kinds."""
    found = [PodSpecAt(f"{g.name} pod", g.pod_path, g.pod_spec) for g in pod_groups(doc)]
    kind = doc.get("kind", "")
    if kind == "RayJob":
        template = (doc.get("spec") or {}).get("submitterPodTemplate")
        if isinstance(template, dict) and isinstance(template.get("spec"), dict):
            path = ("spec", "submitterPodTemplate", "spec")
            found.append(PodSpecAt("submitter pod", path, template["spec"]))
    elif kind in WORKLOAD_POD_SPEC_PATH:
        node: Any = doc
        for key in WORKLOAD_POD_SPEC_PATH[kind]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            found.append(PodSpecAt(f"{kind} pod", WORKLOAD_POD_SPEC_PATH[kind], node))
    return found
