"""Validate KubeRay and Kubernetes manifests before they reach a cluster: per document the strict
schema, then the operator, job, storage and security rules. Files given together are one set.

    python -m ray_resilience validate-manifests cluster_configs/
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ray_resilience.deploy.job_rules import job_problems
from ray_resilience.deploy.network_rules import (
    Policy,
    cluster_network_problems,
    policies_in,
    policy_problems,
)
from ray_resilience.deploy.problems import (
    DocContext,
    ManifestProblem,
    ManifestValidationError,
    Rule,
)
from ray_resilience.deploy.rules import NAME_LIMITS, operator_problems
from ray_resilience.deploy.schemas import (
    DEFAULT_KUBERNETES_VERSION,
    YAML_LOADER,
    CrdSchemas,
    builtin_problems,
    crd_problems,
    load_crd_schemas,
    metadata_problems,
)
from ray_resilience.deploy.security_rules import security_problems
from ray_resilience.deploy.storage_rules import claim_problems

MANIFEST_PATTERNS = ("*.yaml", "*.yml")


class _StrictLoader(YAML_LOADER):  # type: ignore[misc, valid-type]
    """YAML loader that rejects duplicate keys (PyYAML keeps the last one without a word)."""


def _mapping_without_duplicates(loader: Any, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}; only the last value would be used",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _mapping_without_duplicates)


def load_documents(path: str) -> tuple[list[Any], list[ManifestProblem]]:
    """The YAML documents of one file (None for empty ones), or a YAML problem if unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return list(yaml.load_all(f, Loader=_StrictLoader)), []
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "the file"
        ctx = DocContext(path, 0, "file")
        return [], [
            ctx.problem(
                [],
                Rule.YAML,
                where,
                f"cannot read YAML: {err}".replace("\n", " "),
                f"fix the YAML at {where}",
            )
        ]


def validate_resources(
    docs: Sequence[Any],
    *,
    source: str,
    jobs_dir: str,
    crd_dir: str,
    kubernetes_version: str = DEFAULT_KUBERNETES_VERSION,
    alongside: Sequence[Any] | None = None,
) -> list[ManifestProblem]:
    """Validate parsed YAML documents as if read from `source`; `alongside` (default: `docs`)
    is the set whose claims and NetworkPolicies count."""
    _check_dir(jobs_dir, "jobs_dir", "--jobs-dir: the folder holding the job scripts")
    crds = load_crd_schemas(os.path.realpath(crd_dir))
    related = _Related.of(docs if alongside is None else alongside)
    problems: list[ManifestProblem] = []
    for index, doc in enumerate(docs):
        if doc is not None:
            ctx = DocContext(source, index, _label(doc, index))
            problems += _validate_document(ctx, doc, crds, jobs_dir, kubernetes_version, related)
    return problems


def validate_files(
    paths: Sequence[str],
    *,
    jobs_dir: str,
    crd_dir: str,
    kubernetes_version: str = DEFAULT_KUBERNETES_VERSION,
) -> list[ManifestProblem]:
    """Every problem in these files, validated as one set (empty: all valid)."""
    loaded = [(path, *load_documents(path)) for path in paths]
    alongside = [d for _, docs, _ in loaded for d in docs]
    problems: list[ManifestProblem] = []
    for path, docs, load_problems in loaded:
        problems += load_problems + validate_resources(
            docs,
            source=path,
            jobs_dir=jobs_dir,
            crd_dir=crd_dir,
            kubernetes_version=kubernetes_version,
            alongside=alongside,
        )
    return problems


def validate_manifest_file(
    path: str, *, jobs_dir: str, crd_dir: str, kubernetes_version: str = DEFAULT_KUBERNETES_VERSION
) -> list[ManifestProblem]:
    """Every problem in one manifest file, on its own (an empty list means it is valid)."""
    return validate_files(
        [path], jobs_dir=jobs_dir, crd_dir=crd_dir, kubernetes_version=kubernetes_version
    )


def manifest_files(path: str) -> list[str]:
    """The `*.yaml` / `*.yml` files of a directory (not recursive), sorted."""
    _check_dir(path, "manifest directory", "a folder of .yaml manifests")
    files = sorted(
        f for pattern in MANIFEST_PATTERNS for f in glob.glob(os.path.join(path, pattern))
    )
    if not files:
        raise ManifestValidationError(f"no *.yaml or *.yml files in {path!r}")
    return files


def validate_dir(
    path: str, *, jobs_dir: str, crd_dir: str, kubernetes_version: str = DEFAULT_KUBERNETES_VERSION
) -> list[ManifestProblem]:
    """Every problem in the `*.yaml` / `*.yml` files of a directory, validated as one set."""
    return validate_files(
        manifest_files(path),
        jobs_dir=jobs_dir,
        crd_dir=crd_dir,
        kubernetes_version=kubernetes_version,
    )


@dataclass(frozen=True)
class _Related:
    """What the rules look up across the documents validated together."""

    claims: set[str]
    policies: list[Policy]
    ray_docs: list[dict[str, Any]]

    @classmethod
    def of(cls, docs: Sequence[Any]) -> _Related:
        shaped = [d for d in docs if isinstance(d, dict) and isinstance(d.get("metadata"), dict)]
        return cls(
            claims={
                str(d["metadata"]["name"])
                for d in shaped
                if d.get("kind") == "PersistentVolumeClaim" and "name" in d["metadata"]
            },
            policies=policies_in(shaped),
            ray_docs=[d for d in shaped if d.get("kind") in NAME_LIMITS],
        )


def _validate_document(
    ctx: DocContext, doc: Any, crds: CrdSchemas, jobs_dir: str, version: str, related: _Related
) -> list[ManifestProblem]:
    shape = _shape_problem(ctx, doc)
    if shape:
        return [shape]
    validator = crds.validator(doc["apiVersion"], doc["kind"])
    if validator is None:
        problems = builtin_problems(ctx, doc, version)
    else:
        problems = crd_problems(ctx, doc, validator)
        problems += metadata_problems(ctx, doc["metadata"], version)
    try:
        if validator is None:
            problems += _builtin_rules(ctx, doc, related)
        else:
            problems += _ray_rules(ctx, doc, jobs_dir, related)
    except (AttributeError, TypeError, ValueError, KeyError):
        # A broken structure is already reported by the schema check; otherwise it is our bug.
        if not problems:
            raise
    return problems


def _ray_rules(
    ctx: DocContext, doc: dict[str, Any], jobs_dir: str, related: _Related
) -> list[ManifestProblem]:
    if doc["kind"] not in NAME_LIMITS:
        return []
    problems = operator_problems(ctx, doc) + claim_problems(ctx, doc, related.claims)
    problems += security_problems(ctx, doc)
    problems += cluster_network_problems(ctx, doc, related.policies)
    if doc["kind"] == "RayJob":
        problems += job_problems(ctx, doc, jobs_dir)
    return problems


def _builtin_rules(
    ctx: DocContext, doc: dict[str, Any], related: _Related
) -> list[ManifestProblem]:
    problems = security_problems(ctx, doc)
    if doc["kind"] == "NetworkPolicy":
        problems += policy_problems(ctx, doc, related.ray_docs)
    return problems


def _shape_problem(ctx: DocContext, doc: Any) -> ManifestProblem | None:
    if not isinstance(doc, dict):
        return ctx.problem(
            [],
            Rule.RESOURCE_SHAPE,
            doc,
            "document is not a mapping",
            "make it a Kubernetes object with apiVersion, kind and metadata",
        )
    missing = [k for k in ("apiVersion", "kind") if not isinstance(doc.get(k), str)]
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        missing.append("metadata.name")
    if not missing:
        return None
    return ctx.problem(
        missing[:1],
        Rule.RESOURCE_SHAPE,
        None,
        f"missing or not a string: {', '.join(missing)}",
        f"add {', '.join(missing)}",
    )


def _label(doc: Any, index: int) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
        return f"{doc.get('kind', '?')}/{doc['metadata'].get('name', '?')}"
    return f"document {index}"


def _check_dir(path: str, what: str, hint: str) -> None:
    if not os.path.isdir(path):
        raise ManifestValidationError(f"{what} {path!r} is not a directory; pass {hint}")
