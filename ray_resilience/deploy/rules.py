"""Operator rules KubeRay v1.7.0 enforces only at reconcile time (`validation.go`), plus
resource rules for training pods.
"""

from __future__ import annotations

import re
from typing import Any

from ray_resilience.deploy.cluster import PodGroup, pod_groups, quantity
from ray_resilience.deploy.problems import DocContext, ManifestProblem, Rule

# 63 minus the longest Service suffix ("-serve-svc"); generated RayClusters add 6 more.
NAME_LIMITS = {"RayCluster": 53, "RayJob": 47, "RayService": 47}
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_INTERNAL_SERVICE_TYPES = (None, "ClusterIP")
_LIFECYCLE_INTS = ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit")


def operator_problems(ctx: DocContext, doc: dict[str, Any]) -> list[ManifestProblem]:
    """Name, RayJob lifecycle, dashboard exposure and requests == limits for one Ray resource."""
    problems = _name_problems(ctx, doc)
    if doc.get("kind") == "RayJob":
        problems += _lifecycle_problems(ctx, doc.get("spec") or {})
    groups = pod_groups(doc)
    if groups:
        problems += _dashboard_problems(ctx, groups[0])
    for group in groups:
        problems += _requests_limits_problems(ctx, group)
    return problems


def _name_problems(ctx: DocContext, doc: dict[str, Any]) -> list[ManifestProblem]:
    """Operator rule: names fit the generated resources' 63-character limit and are DNS-1035."""
    kind, name = doc.get("kind", ""), str((doc.get("metadata") or {}).get("name", ""))
    limit, path, problems = NAME_LIMITS[kind], ["metadata", "name"], []
    if len(name) > limit:
        message = (
            f"{kind} name is {len(name)} characters; the operator rejects names over {limit} "
            "because the generated RayCluster and Service names must stay within 63"
        )
        fix = f"shorten it to at most {limit} characters"
        problems.append(ctx.problem(path, Rule.NAME, name, message, fix))
    if not _DNS1035.match(name):
        message = f"{kind} name is not a DNS-1035 label; the operator rejects it"
        fix = "use lower-case letters, digits and '-'; start with a letter; do not end with '-'"
        problems.append(ctx.problem(path, Rule.NAME, name, message, fix))
    return problems


def _lifecycle_problems(ctx: DocContext, spec: dict[str, Any]) -> list[ManifestProblem]:
    """Operator rules on the RayJob fields that decide when its cluster goes away."""
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    ttl, deadline, retries = (spec.get(k) for k in _LIFECYCLE_INTS)
    checks = [
        (not shutdown and _int(ttl) > 0, "ttlSecondsAfterFinished", ttl,
         "ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true; the operator rejects it",
         "set shutdownAfterJobFinishes: true, or drop the TTL"),
        (deadline is not None and _int(deadline) <= 0, "activeDeadlineSeconds", deadline,
         "activeDeadlineSeconds must be positive", "set a positive deadline in seconds"),
        (_int(retries) < 0, "backoffLimit", retries, "backoffLimit must not be negative",
         "set 0 (no rerun) or the number of reruns"),
        (bool(spec.get("suspend")) and not shutdown, "suspend", spec.get("suspend"),
         "a RayJob with shutdownAfterJobFinishes false cannot be suspended",
         "set shutdownAfterJobFinishes: true"),
        (not spec.get("rayClusterSpec") and not spec.get("clusterSelector"), "rayClusterSpec",
         None, "one of rayClusterSpec or clusterSelector must be set",
         "add a rayClusterSpec (or a clusterSelector naming an existing RayCluster)"),
    ]  # fmt: skip
    return [
        ctx.problem(["spec", field], Rule.JOB_LIFECYCLE, value, message, fix)
        for broken, field, value, message, fix in checks
        if broken
    ]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _dashboard_problems(ctx: DocContext, head: PodGroup) -> list[ManifestProblem]:
    """The dashboard port is also the unauthenticated job-submission API: keep it in-cluster."""
    message = (
        "this would expose the Ray dashboard and its job-submission API (which runs arbitrary "
        "code, unauthenticated) outside the cluster"
    )
    fix = "use ClusterIP (the default) and no ingress; reach it with `kubectl port-forward`"
    service = (head.spec.get("headService") or {}).get("spec") or {}
    exposed = [
        (["serviceType"], head.spec.get("serviceType") not in _INTERNAL_SERVICE_TYPES),
        (["headService", "spec", "type"], service.get("type") not in _INTERNAL_SERVICE_TYPES),
        (["enableIngress"], bool(head.spec.get("enableIngress"))),
    ]
    return [
        ctx.problem([*head.path, *field], Rule.DASHBOARD, _get(head.spec, field), message, fix)
        for field, broken in exposed
        if broken
    ]


def _differ(request: Any, limit: Any) -> bool:
    """Unparseable quantities are the schema check's to report, not a mismatch."""
    wanted, allowed = quantity(request), quantity(limit)
    return wanted is not None and allowed is not None and wanted != allowed


def _get(node: Any, path: list[str]) -> Any:
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _requests_limits_problems(ctx: DocContext, group: PodGroup) -> list[ManifestProblem]:
    """Requests == limits: Guaranteed QoS pods are evicted last, and extended resources
    (GPU, EFA) must have equal requests and limits."""
    problems = []
    for i, container in enumerate(group.pod_spec.get("containers") or []):
        resources = (container or {}).get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in sorted(set(requests) | set(limits)):
            if name not in limits:
                what, fix = "is requested without a limit", f"add limits.{name}: {requests[name]}"
            elif name in requests and _differ(requests[name], limits[name]):
                what = f"request {requests[name]} differs from limit {limits[name]}"
                fix = f"set requests.{name} equal to limits.{name}"
            else:
                continue
            message = (
                f"{group.name} pod, resource {name!r}: {what}; requests must equal limits for "
                "Guaranteed QoS (last to be evicted) and for GPU/EFA to be accepted"
            )
            side = "limits" if name in limits else "requests"
            path = [*group.pod_path, "containers", i, "resources", side, name]
            value = requests.get(name, limits.get(name))
            problems.append(ctx.problem(path, Rule.REQUESTS_EQUAL_LIMITS, value, message, fix))
    return problems
