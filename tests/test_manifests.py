"""cluster_configs/ manifests validate clean, and each validator rule catches its broken copy.

A broken copy mutates the parsed YAML of a real, passing manifest in exactly one way. CRDs are the
packaged KubeRay v1.7.0 copies (`ray_resilience/deploy/crds/`), parsed once by the validator's cache.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ray_resilience import cli
from ray_resilience.deploy import ManifestProblem, Rule, main, validate_dir, validate_manifest_file
from ray_resilience.deploy.command import (
    CRD_DIR_ENV_VAR,
    JOBS_DIR_ENV_VAR,
    PACKAGED_CRD_DIR,
    default_crd_dir,
)
from ray_resilience.deploy.entrypoint import parse_entrypoint
from ray_resilience.deploy.schemas import load_crd_schemas, strict_schema
from ray_resilience.deploy.validate import validate_resources

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "cluster_configs"
CRD_DIR = Path(PACKAGED_CRD_DIR)
MANIFESTS = sorted(p.name for p in CONFIGS.glob("*.yaml"))
WORKER = ["spec", "rayClusterSpec", "workerGroupSpecs", 0]
HEAD = ["spec", "rayClusterSpec", "headGroupSpec"]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="session")
def crd_dir() -> str:
    """The packaged CRD folder, parsed once (the validator caches it)."""
    load_crd_schemas(str(CRD_DIR.resolve()))
    return str(CRD_DIR)


@pytest.fixture(scope="session")
def stub_jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A jobs/ folder with the training script, so rule tests do not depend on its contents."""
    path = tmp_path_factory.mktemp("jobs")
    (path / "train_llama_fsdp.py").write_text("raise SystemExit('stub')\n")
    return str(path)


def load(name: str) -> list[dict[str, Any]]:  # a fresh copy on every call
    with open(CONFIGS / name, encoding="utf-8") as f:
        return [d for d in yaml.load_all(f, Loader=yaml.CSafeLoader) if d is not None]


def at(doc: Any, path: list[Any]) -> Any:
    return functools.reduce(lambda node, key: node[key], path, doc)


def check(docs: list[dict[str, Any]], jobs_dir: str, crd_dir: str) -> list[ManifestProblem]:
    return validate_resources(docs, source="broken.yaml", jobs_dir=jobs_dir, crd_dir=crd_dir)


def show(problems: list[ManifestProblem]) -> str:
    return "\n".join(str(p) for p in problems) or "no problems"


def test_packaged_crds_are_the_recorded_kuberay_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte-identical to KubeRay v1.7.0: every CRD file matches the sha256 in crds/SOURCE.md."""
    source = (CRD_DIR / "SOURCE.md").read_text()
    recorded = dict(re.findall(r"^\| `([^`]+\.yaml)` \| [\d,]+ \| ([0-9a-f]{64}) \|$", source, re.M))
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in CRD_DIR.glob("*.yaml")}
    assert files == recorded and len(files) == 3, (files, recorded)
    assert CRD_DIR.is_relative_to(REPO / "ray_resilience")  # package data, not a sibling folder
    monkeypatch.delenv(CRD_DIR_ENV_VAR, raising=False)
    assert default_crd_dir() == PACKAGED_CRD_DIR
    monkeypatch.setenv(CRD_DIR_ENV_VAR, "/elsewhere")
    assert default_crd_dir() == "/elsewhere"


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_validates_clean(name: str, crd_dir: str) -> None:
    path, jobs_dir = str(CONFIGS / name), str(REPO / "jobs")
    problems = validate_manifest_file(path, jobs_dir=jobs_dir, crd_dir=crd_dir)
    assert problems == [], show(problems)


def test_directory_validates_clean_and_cli_exits_zero(crd_dir: str, capsys: Any) -> None:
    assert validate_dir(str(CONFIGS), jobs_dir=str(REPO / "jobs"), crd_dir=crd_dir) == []
    argv = [str(CONFIGS), "--jobs-dir", str(REPO / "jobs"), "--crd-dir", crd_dir]
    assert main(argv) == 0
    assert "all manifests valid" in capsys.readouterr().out


def _set(path: list[Any], value: Any) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        at(docs[0], path[:-1])[path[-1]] = value

    return mutate


def _entry(old: str, new: str) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        assert old in docs[0]["spec"]["entrypoint"]
        docs[0]["spec"]["entrypoint"] = docs[0]["spec"]["entrypoint"].replace(old, new)

    return mutate


W_POD = [*WORKER, "template", "spec"]
W_RES = [*W_POD, "containers", 0, "resources"]
H_RES = [*HEAD, "template", "spec", "containers", 0, "resources"]
EKS, CPU, ENTRY = "rayjob-eks-p5.yaml", "rayjob-cpu-small.yaml", "spec.entrypoint"
BROKEN = [
    # (id, manifest, mutation, rule, a substring of the problem's yaml_path)
    ("deep-unknown-field", EKS, _set([*W_POD, "containers", 0, "resourcez"], {}),
     Rule.CRD_SCHEMA, "containers[0].resourcez"),
    ("misspelt-spec-field", EKS, _set(["spec", "shutdownAfterJobFinshes"], True),
     Rule.CRD_SCHEMA, "spec.shutdownAfterJobFinshes"),
    ("unquoted-start-param", CPU, _set([*WORKER, "rayStartParams", "num-cpus"], 2),
     Rule.CRD_SCHEMA, "rayStartParams.num-cpus"),
    ("unknown-metadata-field", EKS, _set(["metadata", "lables"], {}), Rule.K8S_SCHEMA, "lables"),
    ("unknown-kind", EKS, _set(["kind"], "RayJobs"), Rule.UNKNOWN_KIND, "kind"),
    ("unknown-group", EKS, _set(["apiVersion"], "example.com/v1"), Rule.UNKNOWN_KIND, "kind"),
    ("pvc-unknown-field", "fsx-storage.yaml", lambda d: d[1]["spec"].update(storageClass="x"),
     Rule.K8S_SCHEMA, "spec"),
    ("name-too-long", EKS, _set(["metadata", "name"], "l" * 48), Rule.NAME, "metadata.name"),
    ("name-not-dns1035", EKS, _set(["metadata", "name"], "Llama3_8B"), Rule.NAME, "metadata.name"),
    ("ttl-without-shutdown", EKS, _set(["spec", "shutdownAfterJobFinishes"], False),
     Rule.JOB_LIFECYCLE, "spec.ttlSecondsAfterFinished"),
    ("zero-deadline", EKS, _set(["spec", "activeDeadlineSeconds"], 0),
     Rule.JOB_LIFECYCLE, "spec.activeDeadlineSeconds"),
    ("script-missing", EKS, _entry("train_llama", "train_lama"), Rule.ENTRYPOINT_FILE, ENTRY),
    ("script-outside-jobs", EKS, _entry("jobs/", "scripts/"), Rule.ENTRYPOINT_FILE, ENTRY),
    ("gpus-more-pods", EKS, lambda d: at(d[0], WORKER).update(replicas=3, minReplicas=3,
     maxReplicas=3), Rule.GPU_COUNT, ENTRY),
    ("gpus-fewer-ranks", EKS, _entry("workers 16", "workers 12"), Rule.GPU_COUNT, ENTRY),
    ("gpus-without-use-gpu", EKS, _entry("--use_gpu", ""), Rule.GPU_COUNT, ENTRY),
    ("gpus-on-head", EKS, _set([*H_RES, "limits", "nvidia.com/gpu"], 1),
     Rule.GPU_COUNT, "headGroupSpec"),
    ("storage-not-mounted", EKS, _entry("/fsx/check", "/scratch/check"),
     Rule.STORAGE_PATH, "volumeMounts"),
    ("storage-relative", EKS, _entry("/fsx/check", "check"), Rule.STORAGE_PATH, ENTRY),
    ("storage-on-emptydir", EKS, _set([*W_POD, "volumes", 1], {"name": "fsx", "emptyDir": {}}),
     Rule.STORAGE_PATH, "volumeMounts[1]"),
    ("storage-other-claim", EKS, _set([*W_POD, "volumes", 1, "persistentVolumeClaim",
     "claimName"], "other"), Rule.STORAGE_PATH, ENTRY),
    ("storage-read-only", EKS, _set([*W_POD, "containers", 0, "volumeMounts", 1, "readOnly"], True),
     Rule.STORAGE_PATH, "readOnly"),
    ("efa-request-differs", EKS, _set([*W_RES, "requests", "vpc.amazonaws.com/efa"], 16),
     Rule.REQUESTS_EQUAL_LIMITS, "vpc.amazonaws.com/efa"),
    ("memory-request-without-limit", EKS, lambda d: at(d[0], [*H_RES, "limits"]).pop("memory"),
     Rule.REQUESTS_EQUAL_LIMITS, "requests.memory"),
    ("rerun-without-run-name", EKS, _entry("--run_name llama3-8b-p5-run1", ""), Rule.RESUME, ENTRY),
    ("rerun-with-changing-name", EKS, _entry("8b-p5-run1", "$(date +%s)"), Rule.RESUME, ENTRY),
    ("dashboard-node-port", EKS, _set([*HEAD, "serviceType"], "NodePort"),
     Rule.DASHBOARD, "serviceType"),
    ("dashboard-ingress", EKS, _set([*HEAD, "enableIngress"], True), Rule.DASHBOARD, "Ingress"),
]  # fmt: skip


@pytest.mark.parametrize(("manifest", "mutate", "rule", "where"), [b[1:] for b in BROKEN],
                         ids=[b[0] for b in BROKEN])  # fmt: skip
def test_broken_copy_fails_its_rule(manifest: str, mutate: Callable[[list[Any]], None], rule: Rule,
                                    where: str, crd_dir: str, stub_jobs_dir: str) -> None:
    docs = load(manifest)
    assert check(docs, stub_jobs_dir, crd_dir) == []
    mutate(docs)
    problems = check(docs, stub_jobs_dir, crd_dir)
    assert {p.rule for p in problems} == {rule}, show(problems)
    assert any(where in p.yaml_path for p in problems), show(problems)
    for p in problems:  # every problem is actionable: names file, place, value and fix
        assert p.file == "broken.yaml" and p.message and p.fix and p.value
        assert p.rule.value in str(p) and p.yaml_path in str(p)


def test_unknown_field_fix_suggests_the_real_name(crd_dir: str, stub_jobs_dir: str) -> None:
    docs = load(EKS)
    at(docs[0], W_POD)["nodeSelecter"] = at(docs[0], W_POD).pop("nodeSelector")
    (problem,) = check(docs, stub_jobs_dir, crd_dir)
    assert problem.yaml_path == "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.nodeSelecter"
    assert "nodeSelector" in problem.fix


def test_int_or_string_quantities_accept_both(crd_dir: str, stub_jobs_dir: str) -> None:
    docs = load(EKS)
    at(docs[0], W_RES)["limits"]["cpu"] = 176  # int; requests keep the string "176"
    at(docs[0], W_RES)["limits"]["memory"] = "1600Gi"
    assert check(docs, stub_jobs_dir, crd_dir) == []
    at(docs[0], W_RES)["limits"]["cpu"] = [176]
    assert {p.rule for p in check(docs, stub_jobs_dir, crd_dir)} == {Rule.CRD_SCHEMA}


def test_claim_must_be_declared_alongside(crd_dir: str, stub_jobs_dir: str) -> None:
    storage, job = load("fsx-storage.yaml"), load(EKS)
    for pod in (["spec", "rayClusterSpec", "headGroupSpec", "template", "spec"], W_POD):
        for volume in at(job[0], [*pod, "volumes"]):
            if "persistentVolumeClaim" in volume:
                volume["persistentVolumeClaim"]["claimName"] = "fsx-clam"
    problems = check(storage + job, stub_jobs_dir, crd_dir)
    assert [p.rule for p in problems] == [Rule.CLAIM_DECLARED] * 2, show(problems)


def test_yaml_and_shape_errors(tmp_path: Path, crd_dir: str, stub_jobs_dir: str) -> None:
    duplicate = tmp_path / "dup.yaml"
    duplicate.write_text("apiVersion: v1\nkind: ConfigMap\nkind: Secret\nmetadata: {name: a}\n")
    broken = tmp_path / "broken.yml"
    broken.write_text("apiVersion: v1\nkind: [ConfigMap\n")
    for path in (duplicate, broken):
        (problem,) = validate_manifest_file(str(path), jobs_dir=stub_jobs_dir, crd_dir=crd_dir)
        assert problem.rule is Rule.YAML and "line" in problem.value
    assert main([str(tmp_path), "--jobs-dir", stub_jobs_dir, "--crd-dir", crd_dir]) == 1
    (problem,) = check([{"apiVersion": "v1", "metadata": {"name": "a"}}], stub_jobs_dir, crd_dir)
    assert problem.rule is Rule.RESOURCE_SHAPE and problem.yaml_path == "kind"


def test_cli_usage_errors_exit_two(tmp_path: Path, capsys: Any) -> None:
    """Exit 2 when the validator cannot run: no CRDs, no jobs folder, no arguments."""
    assert main([str(CONFIGS), "--crd-dir", str(tmp_path)]) == 2
    assert "no CustomResourceDefinition" in capsys.readouterr().err
    assert main([str(CONFIGS), "--crd-dir", str(CRD_DIR), "--jobs-dir", str(tmp_path / "x")]) == 2
    assert main([]) == 2


def test_cli_finds_the_jobs_folder_beside_the_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """From any working directory: <repo>/cluster_configs is checked against <repo>/jobs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(JOBS_DIR_ENV_VAR, raising=False)
    assert main([str(CONFIGS)]) == 0, capsys.readouterr()
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / EKS).write_text((CONFIGS / EKS).read_text())
    assert main([str(tmp_path / "manifests")]) == 2  # no jobs/ anywhere: cannot check scripts
    assert "--jobs-dir" in capsys.readouterr().err


def test_missing_deploy_extra_is_a_one_line_install_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Without kubernetes-validate the command says which extra to install (exit 2), no traceback."""
    for name in [m for m in sys.modules if m.split(".")[:2] == ["ray_resilience", "deploy"]]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "kubernetes_validate", None)  # import raises ModuleNotFound
    assert cli.main(["validate-manifests", str(CONFIGS)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'kubernetes_validate'" in err, err
    assert "pip install 'ray_resilience[deploy]'" in err, err


def test_strict_schema_closes_objects_but_keeps_open_ones_open() -> None:
    schema = strict_schema({
        "type": "object",
        "properties": {
            "port": {"x-kubernetes-int-or-string": True, "type": "string"},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                     "properties": {}},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
            "opt": {"type": "string", "nullable": True},
        },
    })  # fmt: skip
    assert schema["additionalProperties"] is False
    assert "type" not in schema["properties"]["port"]
    assert schema["properties"]["port"]["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert "additionalProperties" not in schema["properties"]["free"]
    assert schema["properties"]["map"]["additionalProperties"] == {"type": "string"}
    assert schema["properties"]["opt"]["type"] == ["string", "null"]


def test_parse_entrypoint_handles_shell_and_flag_forms() -> None:
    entry = parse_entrypoint("cd /app && python3 -u jobs/x.py --a=1 --b-c 2 --flag; echo done")
    assert entry.script == "jobs/x.py"
    assert entry.args == {"a": "1", "b_c": "2", "flag": True}
    assert parse_entrypoint("python -m jobs.train --n 3").script == "jobs/train.py"
    assert parse_entrypoint("bash run.sh").script is None


def test_raycluster_and_rayservice_get_cluster_rules(crd_dir: str, stub_jobs_dir: str) -> None:
    spec = load(EKS)[0]["spec"]["rayClusterSpec"]
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c" * 53},
               "spec": copy.deepcopy(spec)}  # fmt: skip
    service = {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "svc"},
               "spec": {"rayClusterConfig": copy.deepcopy(spec)}}  # fmt: skip
    assert check([cluster, service], stub_jobs_dir, crd_dir) == []
    cluster["metadata"]["name"] += "c"  # 54 > 53
    service["spec"]["rayClusterConfig"]["headGroupSpec"]["serviceType"] = "LoadBalancer"
    problems = check([cluster, service], stub_jobs_dir, crd_dir)
    assert [(p.resource.split("/")[0], p.rule) for p in problems] == [
        ("RayCluster", Rule.NAME), ("RayService", Rule.DASHBOARD)
    ], show(problems)
