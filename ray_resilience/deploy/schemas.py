"""Schema checks: KubeRay CRDs made strict (`additionalProperties: false`, since the API server
silently prunes unknown fields of a structural schema), built-in kinds via `kubernetes-validate`.
CEL rules are not evaluated; the operator rules that matter are in `rules.py`.
"""

from __future__ import annotations

import difflib
import functools
import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from ray_resilience.deploy.problems import (
    CrdSchemaError,
    DocContext,
    KubernetesVersionError,
    ManifestProblem,
    ManifestValidationError,
    Rule,
)

# EKS 1.28 is the oldest version the manifests support: a field valid there is valid on newer ones.
DEFAULT_KUBERNETES_VERSION = "1.28"
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~5x faster on 1.3 MB CRDs
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf")
_SUBSCHEMAS = ("items", "additionalProperties", "not")
_MAX_LISTED_FIELDS = 25


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAPI v3 structural schema as strict JSON Schema; `x-kubernetes-int-or-string`
    and `nullable` are translated."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: strict_schema(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMAS and isinstance(value, dict):
            out[key] = strict_schema(value)
        elif key in _SUBSCHEMA_LISTS:
            out[key] = [strict_schema(sub) for sub in value]
        else:
            out[key] = value
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@dataclass
class CrdSchemas:
    """The served versions of every CRD in one folder by (apiVersion, kind), converted on first
    use."""

    crd_dir: str
    raw: dict[tuple[str, str], dict[str, Any]]
    _validators: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)

    def validator(self, api_version: str, kind: str) -> Any | None:
        """A strict Draft 4 validator (OpenAPI 3.0 semantics) for the kind, or None if unknown."""
        key = (api_version, kind)
        if key not in self.raw:
            return None
        if key not in self._validators:
            self._validators[key] = jsonschema.Draft4Validator(strict_schema(self.raw[key]))
        return self._validators[key]


@functools.lru_cache(maxsize=4)
def load_crd_schemas(crd_dir: str) -> CrdSchemas:
    """Parse every CRD in `crd_dir` once per process (CRD files are treated as immutable)."""
    if not os.path.isdir(crd_dir):
        raise CrdSchemaError(crd_dir, "not a directory")
    raw: dict[tuple[str, str], dict[str, Any]] = {}
    paths = sorted(
        glob.glob(os.path.join(crd_dir, "*.yaml")) + glob.glob(os.path.join(crd_dir, "*.yml"))
    )
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for doc in yaml.load_all(f, Loader=YAML_LOADER):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    raw.update(_served_schemas(crd_dir, doc))
    if not raw:
        raise CrdSchemaError(crd_dir, "no CustomResourceDefinition documents found")
    return CrdSchemas(crd_dir=crd_dir, raw=raw)


def _served_schemas(crd_dir: str, crd: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    spec = crd.get("spec", {})
    group, kind = spec.get("group"), spec.get("names", {}).get("kind")
    out = {}
    for version in spec.get("versions", []):
        schema = version.get("schema", {}).get("openAPIV3Schema")
        if not schema:
            raise CrdSchemaError(crd_dir, f"CRD {kind} version {version.get('name')} has no schema")
        if version.get("served", True):
            out[(f"{group}/{version['name']}", kind)] = schema
    return out


def crd_problems(ctx: DocContext, doc: dict[str, Any], validator: Any) -> list[ManifestProblem]:
    """Every strict-schema violation in a custom resource, sorted by YAML path."""
    errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return [p for err in errors for p in describe_error(ctx, err, Rule.CRD_SCHEMA)]


def builtin_problems(
    ctx: DocContext, doc: dict[str, Any], kubernetes_version: str
) -> list[ManifestProblem]:
    """A built-in kind against the strict Kubernetes schema (kubernetes-validate reports only the
    best-matching error per document)."""
    try:
        kubernetes_validate.validate(doc, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as err:
        return list(describe_error(ctx, err, Rule.K8S_SCHEMA))
    except kubernetes_validate.SchemaNotFoundError:
        return [_unknown_kind(ctx, doc, kubernetes_version)]
    except kubernetes_validate.VersionNotSupportedError:
        supported = ", ".join(sorted(set(kubernetes_validate.utils.all_versions())))
        raise KubernetesVersionError(kubernetes_version, supported) from None
    except kubernetes_validate.InvalidSchemaError as err:
        raise ManifestValidationError(f"kubernetes-validate is broken: {err.message}") from err
    return []


def metadata_problems(
    ctx: DocContext, metadata: Any, kubernetes_version: str
) -> list[ManifestProblem]:
    """Strict ObjectMeta check for custom resources (validated as a ConfigMap's metadata)."""
    wrapper = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}
    return builtin_problems(ctx, wrapper, kubernetes_version)


def _unknown_kind(ctx: DocContext, doc: dict[str, Any], version: str) -> ManifestProblem:
    return ctx.problem(
        ["kind"],
        Rule.UNKNOWN_KIND,
        f"{doc.get('apiVersion')}, kind {doc.get('kind')}",
        f"no schema for this apiVersion and kind: not a built-in kind of Kubernetes {version} "
        "and not a CRD in the CRD directory, so nothing about this document can be checked",
        "fix the spelling of apiVersion/kind, or add the CRD that defines it to the CRD directory",
    )


def describe_error(ctx: DocContext, err: Any, rule: Rule) -> Iterator[ManifestProblem]:
    """Turn one jsonschema error into problems whose fix names the exact change to make."""
    path = list(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties", {}))
        for key in sorted(set(err.instance) - set(allowed)):
            yield ctx.problem(
                [*path, key],
                rule,
                err.instance[key],
                f"unknown field {key!r}: the schema has no such field here, and the API server "
                "would silently drop it, so the setting would have no effect",
                _unknown_field_fix(key, allowed),
            )
        return
    yield ctx.problem(path, rule, err.instance, err.message, _fix_for(err))


def _unknown_field_fix(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return f"rename it to {close[0]!r}"
    listed = ", ".join(allowed[:_MAX_LISTED_FIELDS]) + (
        " ..." if len(allowed) > _MAX_LISTED_FIELDS else ""
    )
    return f"remove it, or move it to where it belongs; fields allowed here: {listed}"


def _fix_for(err: Any) -> str:
    if err.validator == "required" and isinstance(err.instance, dict):
        missing = [name for name in err.validator_value if name not in err.instance]
        return f"add {', '.join(missing)} here"
    if err.validator == "type":
        expected = err.validator_value
        hint = (
            ' (quote it, e.g. "8")'
            if "string" in str(expected) and not isinstance(err.instance, str)
            else ""
        )
        return f"use a value of type {expected}{hint}"
    if err.validator == "enum":
        return f"use one of {err.validator_value}"
    if err.validator == "anyOf":
        return "use an integer or a string (Kubernetes quantity such as 8, 500m, 64Gi)"
    if err.validator == "pattern":
        return f"write a value matching {err.validator_value!r} (quantities: 8, 500m, 64Gi)"
    return f"see the {err.validator!r} constraint of this field in the schema"
