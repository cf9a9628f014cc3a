"""What the manifest validator reports: one `ManifestProblem` per broken rule (data, so every
problem is listed in one pass), and `ManifestValidationError` when it cannot run at all.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "CrdSchemaError",
    "DocContext",
    "KubernetesVersionError",
    "ManifestProblem",
    "ManifestValidationError",
    "Rule",
    "format_path",
]

_MAX_VALUE_CHARS = 160


class Rule(enum.StrEnum):
    """The rule a problem breaks; the value is the stable id shown in reports and used in tests."""

    YAML = "yaml"  # file is not parseable YAML, or has duplicate keys
    RESOURCE_SHAPE = "resource-shape"  # a document lacks apiVersion / kind / metadata.name
    UNKNOWN_KIND = "unknown-kind"  # neither a KubeRay CRD nor a built-in Kubernetes kind
    CRD_SCHEMA = "crd-schema"  # KubeRay CRD schema, strict (unknown fields are errors)
    K8S_SCHEMA = "k8s-schema"  # built-in Kubernetes kind schema, strict
    NAME = "name"  # operator rule: length and DNS-1035 label format of Ray resource names
    JOB_LIFECYCLE = "job-lifecycle"  # operator rules on RayJob TTL / deadline / retry fields
    ENTRYPOINT_FILE = "entrypoint-file"  # entrypoint runs a jobs/<file>.py that exists
    GPU_COUNT = "gpu-count"  # one training process per worker GPU
    STORAGE_PATH = "storage-path"  # storage path on a shared volume mounted in every pod
    CLAIM_DECLARED = "claim-declared"  # PVC used by Ray pods is declared in the validated set
    REQUESTS_EQUAL_LIMITS = "requests-equal-limits"  # Guaranteed QoS; extended resources match
    RESUME = "resume"  # retried RayJob must resume: fixed --run_name and --storage_path
    LOCAL_TIER = "local-tier"  # the ranks' local-tier files fit the pod's memory-backed /dev/shm
    DASHBOARD = "dashboard"  # Ray dashboard (job submission API) stays inside the cluster
    TOKEN_AUTH = "token-auth"  # Ray token authentication on: authOptions.mode token
    NETWORK_POLICY = "network-policy"  # a NetworkPolicy admits only the cluster's pods to the head
    NON_ROOT = "non-root"  # containers run as a non-root user (init containers may chown as root)
    PRIVILEGE = "privilege"  # no privileged containers, allowPrivilegeEscalation: false
    CAPABILITIES = "capabilities"  # drop ALL; add only what the container can actually use
    SECCOMP = "seccomp"  # RuntimeDefault (or Localhost) seccomp profile
    WORLD_WRITABLE = "world-writable"  # no chmod 0777 / o+w on shared folders
    CREDENTIALS = "credentials"  # no AWS keys or Ray tokens written into manifests


class ManifestValidationError(Exception):
    """Base class for errors that stop validation itself (as opposed to problems in a manifest)."""


class CrdSchemaError(ManifestValidationError):
    """The CRD directory is missing, empty, or holds a CRD without a usable openAPIV3Schema."""

    def __init__(self, crd_dir: str, detail: str) -> None:
        self.crd_dir = crd_dir
        super().__init__(
            f"cannot load KubeRay CRD schemas from {crd_dir!r}: {detail}. Point crd_dir "
            "(--crd-dir) at the operator's CRD folder, e.g. helm-chart/kuberay-operator/crds "
            "of KubeRay v1.7.0."
        )


class KubernetesVersionError(ManifestValidationError):
    """The requested Kubernetes version has no schemas in the installed kubernetes-validate."""

    def __init__(self, version: str, supported: str) -> None:
        self.version = version
        super().__init__(
            f"kubernetes-validate has no schemas for Kubernetes {version}; supported: "
            f"{supported}. Pass another kubernetes_version (--kubernetes-version) or upgrade "
            "kubernetes-validate."
        )


def format_path(parts: Iterable[str | int]) -> str:
    """`['spec', 'workerGroupSpecs', 0, 'replicas']` -> `spec.workerGroupSpecs[0].replicas`."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}" if _plain(part) else f"[{part!r}]"
        else:
            out = part if _plain(part) else f"[{part!r}]"
    return out or "<document>"


def _plain(key: str) -> bool:
    return key.replace("_", "a").replace("-", "a").isalnum()


def _render(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


@dataclass(frozen=True, kw_only=True)
class ManifestProblem:
    """One broken rule in one document of one manifest file."""

    file: str
    """Path of the manifest file as given to the validator."""
    document: int
    """0-based index of the YAML document inside the file (`---` separated)."""
    resource: str
    """`Kind/name` of the document, or `document N` when it has no kind or name."""
    yaml_path: str
    """Where in the document, e.g. `spec.rayClusterSpec.workerGroupSpecs[0].replicas`."""
    rule: Rule
    """Which rule is broken."""
    value: str
    """The offending value, rendered with repr() and truncated."""
    message: str
    """What is wrong and why it matters."""
    fix: str
    """What to change."""

    def __str__(self) -> str:
        return (
            f"{self.file} [{self.resource}] {self.yaml_path}: {self.message} "
            f"(rule {self.rule.value}; value {self.value})\n    fix: {self.fix}"
        )


@dataclass(frozen=True)
class DocContext:
    """Where a document came from; builds problems so rule code only says what is wrong."""

    file: str
    document: int
    resource: str

    def problem(
        self, path: Iterable[str | int], rule: Rule, value: object, message: str, fix: str
    ) -> ManifestProblem:
        """A `ManifestProblem` for this document at `path`."""
        return ManifestProblem(
            file=self.file,
            document=self.document,
            resource=self.resource,
            yaml_path=format_path(path),
            rule=rule,
            value=_render(value),
            message=message,
            fix=fix,
        )
