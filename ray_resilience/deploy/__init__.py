"""Validate KubeRay / Kubernetes manifests before applying them (`validate_dir`, `validate_files`,
`validate_resources`, the `ManifestProblem`s they return, and the CLI hook `main`).
"""

from ray_resilience.deploy.command import main
from ray_resilience.deploy.problems import (
    CrdSchemaError,
    KubernetesVersionError,
    ManifestProblem,
    ManifestValidationError,
    Rule,
)
from ray_resilience.deploy.validate import (
    validate_dir,
    validate_files,
    validate_manifest_file,
    validate_resources,
)

__all__ = [
    "CrdSchemaError",
    "KubernetesVersionError",
    "ManifestProblem",
    "ManifestValidationError",
    "Rule",
    "main",
    "validate_dir",
    "validate_files",
    "validate_manifest_file",
    "validate_resources",
]
