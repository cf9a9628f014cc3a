"""cluster_configs/ manifests validate clean, and each validator rule catches its broken copy.

A broken copy mutates the parsed YAML of a real, passing manifest in exactly one way. CRDs are
the packaged KubeRay v1.7.0 copies (`ray_resilience/deploy/crds/`), parsed once by the validator's
cache.
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
from ray_resilience.deploy import (
    ManifestProblem,
    Rule,
    main,
    validate_dir,
    validate_files,
    validate_manifest_file,
)
from ray_resilience.deploy.command import (
    CRD_DIR_ENV_VAR,
    JOBS_DIR_ENV_VAR,
    PACKAGED_CRD_DIR,
    default_crd_dir,
)
from ray_resilience.deploy.entrypoint import parse_entrypoint
from ray_resilience.deploy.job_rules import MODEL_PARAMS, local_file_bytes
from ray_resilience.deploy.schemas import load_crd_schemas, strict_schema
from ray_resilience.deploy.security_rules import secret_uris, world_writable_commands
from ray_resilience.deploy.validate import validate_resources

REPO = Path(__file__).resolve().parents[2]
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


def job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The RayJob of a manifest (its ServiceAccount and NetworkPolicy come first)."""
    return next(d for d in docs if d["kind"] == "RayJob")


def policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "NetworkPolicy")


def check(docs: list[dict[str, Any]], jobs_dir: str, crd_dir: str) -> list[ManifestProblem]:
    return validate_resources(docs, source="broken.yaml", jobs_dir=jobs_dir, crd_dir=crd_dir)


def show(problems: list[ManifestProblem]) -> str:
    return "\n".join(str(p) for p in problems) or "no problems"


def test_packaged_crds_are_the_recorded_kuberay_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte-identical to KubeRay v1.7.0: every CRD file matches the sha256 in crds/SOURCE.md."""
    source = (CRD_DIR / "SOURCE.md").read_text()
    row = r"^\| `([^`]+\.yaml)` \| [\d,]+ \| ([0-9a-f]{64}) \|$"
    recorded = dict(re.findall(row, source, re.M))
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
        at(job(docs), path[:-1])[path[-1]] = value

    return mutate


def _rename(name: str) -> Callable[[list[dict[str, Any]]], None]:
    """Rename the RayJob, and its name in the NetworkPolicy's submitter rule with it."""

    def mutate(docs: list[dict[str, Any]]) -> None:
        old = job(docs)["metadata"]["name"]
        job(docs)["metadata"]["name"] = name
        for rule in policy(docs)["spec"]["ingress"]:
            for peer in rule["from"]:
                labels = peer.get("podSelector", {}).get("matchLabels", {})
                if labels.get("ray.io/originated-from-cr-name") == old:
                    labels["ray.io/originated-from-cr-name"] = name

    return mutate


def _entry(old: str, new: str) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        assert old in job(docs)["spec"]["entrypoint"]
        job(docs)["spec"]["entrypoint"] = job(docs)["spec"]["entrypoint"].replace(old, new)

    return mutate


W_POD = [*WORKER, "template", "spec"]
W_RES = [*W_POD, "containers", 0, "resources"]
H_RES = [*HEAD, "template", "spec", "containers", 0, "resources"]
H_POD = [*HEAD, "template", "spec"]
H_CONT, W_CONT = [*H_POD, "containers", 0], [*W_POD, "containers", 0]
H_INIT = [*H_POD, "initContainers", 0]
SUBMITTER_POD = ["spec", "submitterPodTemplate", "spec"]
EKS, CPU, ENTRY = "rayjob-eks-p5.yaml", "rayjob-cpu-small.yaml", "spec.entrypoint"
LABELS = "headGroupSpec.template.metadata.labels"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documentation example


def _add(path: list[Any], item: Any) -> Callable[[list[dict[str, Any]]], None]:
    """Append to the list at `path` in the RayJob (creating it)."""
    return lambda docs: at(job(docs), path[:-1]).setdefault(path[-1], []).append(item)


def _pop(path: list[Any]) -> Callable[[list[dict[str, Any]]], None]:
    return lambda docs: at(job(docs), path[:-1]).pop(path[-1])


def _command(old: str, new: str) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        command = at(job(docs), [*H_INIT, "command"])
        assert old in command[-1]
        command[-1] = command[-1].replace(old, new)

    return mutate


def _on_policy(change: Callable[[dict[str, Any]], Any]) -> Callable[[list[dict[str, Any]]], None]:
    return lambda docs: change(policy(docs)["spec"])


def _without_policy(docs: list[dict[str, Any]]) -> None:
    docs.remove(policy(docs))


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
    ("name-too-long", EKS, _rename("l" * 48), Rule.NAME, "metadata.name"),
    ("name-not-dns1035", EKS, _rename("Llama3_8B"), Rule.NAME, "metadata.name"),
    ("ttl-without-shutdown", EKS, _set(["spec", "shutdownAfterJobFinishes"], False),
     Rule.JOB_LIFECYCLE, "spec.ttlSecondsAfterFinished"),
    ("zero-deadline", EKS, _set(["spec", "activeDeadlineSeconds"], 0),
     Rule.JOB_LIFECYCLE, "spec.activeDeadlineSeconds"),
    ("script-missing", EKS, _entry("train_llama", "train_lama"), Rule.ENTRYPOINT_FILE, ENTRY),
    ("script-outside-jobs", EKS, _entry("jobs/", "scripts/"), Rule.ENTRYPOINT_FILE, ENTRY),
    ("gpus-more-pods", EKS, lambda d: at(job(d), WORKER).update(replicas=3, minReplicas=3,
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
    ("memory-request-without-limit", EKS, lambda d: at(job(d), [*H_RES, "limits"]).pop("memory"),
     Rule.REQUESTS_EQUAL_LIMITS, "requests.memory"),
    ("local-tier-shm-too-small", EKS, _set([*W_POD, "volumes", 0, "emptyDir", "sizeLimit"],
     "64Gi"), Rule.LOCAL_TIER, "volumes[0].emptyDir.sizeLimit"),
    ("local-tier-no-shm-volume", EKS, lambda d: at(job(d), [*W_CONT, "volumeMounts"]).pop(0),
     Rule.LOCAL_TIER, "volumes"),
    ("local-tier-bigger-model", CPU, _entry("--model tiny", "--model llama3-8b"),
     Rule.LOCAL_TIER, "volumes"),
    ("rerun-without-run-name", EKS, _entry("--run_name llama3-8b-p5-run1", ""), Rule.RESUME, ENTRY),
    ("rerun-with-changing-name", EKS, _entry("8b-p5-run1", "$(date +%s)"), Rule.RESUME, ENTRY),
    ("dashboard-node-port", EKS, _set([*HEAD, "serviceType"], "NodePort"),
     Rule.DASHBOARD, "serviceType"),
    ("dashboard-ingress", EKS, _set([*HEAD, "enableIngress"], True), Rule.DASHBOARD, "Ingress"),
    # Ray token authentication
    ("token-auth-missing", EKS, _pop(["spec", "rayClusterSpec", "authOptions"]),
     Rule.TOKEN_AUTH, "rayClusterSpec.authOptions"),
    ("token-auth-disabled", CPU, _set(["spec", "rayClusterSpec", "authOptions", "mode"],
     "disabled"), Rule.TOKEN_AUTH, "authOptions.mode"),
    ("token-auth-old-ray", EKS, _set(["spec", "rayClusterSpec", "rayVersion"], "2.51.0"),
     Rule.TOKEN_AUTH, "rayVersion"),
    ("token-auth-env-override", EKS, _add([*W_CONT, "env"], {"name": "RAY_AUTH_MODE",
     "value": "disabled"}), Rule.TOKEN_AUTH, "containers[0].env[6].value"),
    # NetworkPolicy
    ("network-policy-missing", EKS, _without_policy, Rule.NETWORK_POLICY, LABELS),
    ("network-policy-by-cluster-name", EKS, _on_policy(lambda p: p.update(podSelector={
     "matchLabels": {"ray.io/cluster": "llama3-8b-fsdp-p5"}})), Rule.NETWORK_POLICY, LABELS),
    ("network-policy-egress-only", CPU, _on_policy(lambda p: p.update(policyTypes=["Egress"])),
     Rule.NETWORK_POLICY, LABELS),
    ("network-policy-any-namespace", EKS, _on_policy(lambda p: p["ingress"].append({
     "from": [{"namespaceSelector": {}}], "ports": [{"port": 8265}]})), Rule.NETWORK_POLICY,
     "spec.ingress[4].from[0]"),
    ("network-policy-allow-all", CPU, _on_policy(lambda p: p["ingress"].append({})),
     Rule.NETWORK_POLICY, "spec.ingress[3]"),
    ("network-policy-ip-block", EKS, _on_policy(lambda p: p["ingress"].append({"from": [{
     "ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": "client"}]})),
     Rule.NETWORK_POLICY, "spec.ingress[4].from[0].ipBlock"),
    ("network-policy-shuts-out-workers", EKS, _on_policy(lambda p: p["ingress"][0].update(
     {"from": [{"podSelector": {"matchLabels": {"ray.io/node-type": "head"}}}]})),
     Rule.NETWORK_POLICY, LABELS),
    ("network-policy-shuts-out-submitter", CPU, _on_policy(lambda p: p["ingress"].pop(1)),
     Rule.NETWORK_POLICY, LABELS),
    # containers
    ("runs-as-root", EKS, _set([*W_POD, "securityContext", "runAsUser"], 0), Rule.NON_ROOT,
     "containers[0].securityContext.runAsUser"),
    ("run-as-non-root-unset", CPU, _pop([*H_POD, "securityContext", "runAsNonRoot"]),
     Rule.NON_ROOT, "headGroupSpec.template.spec.containers[0].securityContext.runAsNonRoot"),
    ("submitter-default-pod", CPU, _pop(["spec", "submitterPodTemplate"]), Rule.NON_ROOT,
     "spec.submitterPodTemplate"),
    ("submitter-may-run-as-root", EKS, _set([*SUBMITTER_POD, "securityContext", "runAsNonRoot"],
     False), Rule.NON_ROOT, "submitterPodTemplate.spec.containers[0]"),
    ("privilege-escalation", EKS, _set([*W_CONT, "securityContext", "allowPrivilegeEscalation"],
     True), Rule.PRIVILEGE, "allowPrivilegeEscalation"),
    ("privileged", CPU, _set([*W_CONT, "securityContext", "privileged"], True), Rule.PRIVILEGE,
     "securityContext.privileged"),
    ("capabilities-kept", EKS, _pop([*H_CONT, "securityContext", "capabilities"]),
     Rule.CAPABILITIES, "containers[0].securityContext.capabilities.drop"),
    ("ipc-lock-added", EKS, _set([*W_CONT, "securityContext", "capabilities", "add"],
     ["IPC_LOCK"]), Rule.CAPABILITIES, "capabilities.add"),
    ("init-container-extra-capability", EKS, _add([*H_INIT, "securityContext", "capabilities",
     "add"], "DAC_OVERRIDE"), Rule.CAPABILITIES, "initContainers[0].securityContext"),
    ("seccomp-unconfined", CPU, _set([*W_POD, "securityContext", "seccompProfile", "type"],
     "Unconfined"), Rule.SECCOMP, "securityContext.seccompProfile"),
    # world-writable folders
    ("chmod-0777", EKS, _command("chmod 0750", "chmod 0777"), Rule.WORLD_WRITABLE,
     "initContainers[0].command"),
    ("chmod-a+rwx", CPU, _command("chmod 0750", "chmod -R a+rwx"), Rule.WORLD_WRITABLE,
     "initContainers[0].command"),
    ("mkdir-mode-1777", EKS, _command("mkdir -p", "mkdir -m 1777 -p"), Rule.WORLD_WRITABLE,
     "initContainers[0].command"),
    # credentials
    ("aws-secret-in-env", EKS, _add([*W_CONT, "env"], {"name": "AWS_SECRET_ACCESS_KEY",
     "value": AWS_SECRET}), Rule.CREDENTIALS, "containers[0].env[6].value"),
    ("aws-key-id-in-env", CPU, _add([*H_CONT, "env"], {"name": "AWS_ACCESS_KEY_ID",
     "value": "AKIAIOSFODNN7EXAMPLE"}), Rule.CREDENTIALS, "containers[0].env[0].value"),
    ("ray-token-in-env", EKS, _add([*H_CONT, "env"], {"name": "RAY_AUTH_TOKEN",
     "value": "c2VjcmV0"}), Rule.CREDENTIALS, "containers[0].env[0].value"),
    ("s3-keys-in-entrypoint", EKS, _entry("/fsx/checkpoints", "'s3://bucket/ckpt?access_key="
     f"AKIAIOSFODNN7EXAMPLE&secret_key={AWS_SECRET}&region=us-west-2'"), Rule.CREDENTIALS, ENTRY),
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
        assert AWS_SECRET not in str(p) and "AKIAIOSFODNN7EXAMPLE" not in str(p)  # not echoed


def test_unknown_field_fix_suggests_the_real_name(crd_dir: str, stub_jobs_dir: str) -> None:
    docs = load(EKS)
    at(job(docs), W_POD)["nodeSelecter"] = at(job(docs), W_POD).pop("nodeSelector")
    (problem,) = check(docs, stub_jobs_dir, crd_dir)
    assert problem.yaml_path == "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.nodeSelecter"
    assert "nodeSelector" in problem.fix


def test_int_or_string_quantities_accept_both(crd_dir: str, stub_jobs_dir: str) -> None:
    docs = load(EKS)
    at(job(docs), W_RES)["limits"]["cpu"] = 176  # int; requests keep the string "176"
    at(job(docs), W_RES)["limits"]["memory"] = "1600Gi"
    assert check(docs, stub_jobs_dir, crd_dir) == []
    at(job(docs), W_RES)["limits"]["cpu"] = [176]
    assert {p.rule for p in check(docs, stub_jobs_dir, crd_dir)} == {Rule.CRD_SCHEMA}


def test_claim_must_be_declared_alongside(crd_dir: str, stub_jobs_dir: str) -> None:
    storage, eks = load("fsx-storage.yaml"), load(EKS)
    for pod in (["spec", "rayClusterSpec", "headGroupSpec", "template", "spec"], W_POD):
        for volume in at(job(eks), [*pod, "volumes"]):
            if "persistentVolumeClaim" in volume:
                volume["persistentVolumeClaim"]["claimName"] = "fsx-clam"
    problems = check(storage + eks, stub_jobs_dir, crd_dir)
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


def test_missing_manifest_checker_is_a_one_line_install_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Without kubernetes-validate (a --no-deps install): what to install, exit 2, no
    traceback."""
    for name in [m for m in sys.modules if m.split(".")[:2] == ["ray_resilience", "deploy"]]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "kubernetes_validate", None)  # import raises ModuleNotFound
    assert cli.main(["validate-manifests", str(CONFIGS)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'kubernetes_validate'" in err, err
    assert cli.INSTALL_HINT in err, err


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
    spec = job(load(EKS))["spec"]["rayClusterSpec"]
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c" * 53},
               "spec": copy.deepcopy(spec)}  # fmt: skip
    service = {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "svc"},
               "spec": {"rayClusterConfig": copy.deepcopy(spec)}}  # fmt: skip
    # The EKS job's NetworkPolicy selects their pods too: same pod template labels.
    network_policy = policy(load(EKS))
    assert check([cluster, service, network_policy], stub_jobs_dir, crd_dir) == []
    cluster["metadata"]["name"] += "c"  # 54 > 53
    service["spec"]["rayClusterConfig"]["headGroupSpec"]["serviceType"] = "LoadBalancer"
    problems = check([cluster, service, network_policy], stub_jobs_dir, crd_dir)
    assert [(p.resource.split("/")[0], p.rule) for p in problems] == [
        ("RayCluster", Rule.NAME), ("RayService", Rule.DASHBOARD)
    ], show(problems)


def test_network_policy_selects_a_raycluster_by_name_but_not_a_rayjob(
    crd_dir: str, stub_jobs_dir: str
) -> None:
    """ray.io/cluster is the name of a RayCluster, but a random one for a RayJob's cluster."""
    spec = copy.deepcopy(job(load(EKS))["spec"]["rayClusterSpec"])
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "train"},
               "spec": spec}  # fmt: skip
    by_name = {"matchLabels": {"ray.io/cluster": "train"}}
    netpol = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "train-head"},
              "spec": {"podSelector": {"matchExpressions": [
                           {"key": "ray.io/cluster", "operator": "In", "values": ["train"]},
                           {"key": "ray.io/node-type", "operator": "NotIn", "values": ["worker"]}]},
                       "policyTypes": ["Ingress"],
                       "ingress": [{"from": [{"podSelector": by_name}]}]}}  # fmt: skip
    assert check([cluster, netpol], stub_jobs_dir, crd_dir) == []
    rayjob = load(EKS)
    rayjob.remove(policy(rayjob))
    (problem,) = check([*rayjob, netpol], stub_jobs_dir, crd_dir)
    assert problem.rule is Rule.NETWORK_POLICY and problem.resource.startswith("RayJob/")
    assert "generated by KubeRay for a RayJob" in problem.message, show([problem])
    netpol["spec"]["podSelector"]["matchExpressions"][1]["values"] = ["head"]  # NotIn head
    (problem,) = check([cluster, netpol], stub_jobs_dir, crd_dir)
    assert "ray.io/node-type is 'head' on the head pod" in problem.message, show([problem])


def test_network_policy_in_another_file_counts(tmp_path: Path, crd_dir: str, capsys: Any) -> None:
    """Files given together are one set; a RayJob file alone lacks its policy."""
    docs = load(CPU)
    (tmp_path / "netpol.yaml").write_text(yaml.safe_dump(policy(docs)))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job(docs)))
    files = [str(tmp_path / "job.yaml"), str(tmp_path / "netpol.yaml")]
    jobs_dir = str(REPO / "jobs")
    assert validate_files(files, jobs_dir=jobs_dir, crd_dir=crd_dir) == []
    assert validate_dir(str(tmp_path), jobs_dir=jobs_dir, crd_dir=crd_dir) == []
    assert main([*files, "--jobs-dir", jobs_dir]) == 0
    (problem,) = validate_manifest_file(files[0], jobs_dir=jobs_dir, crd_dir=crd_dir)
    assert problem.rule is Rule.NETWORK_POLICY
    assert main([files[0], "--jobs-dir", jobs_dir]) == 1
    assert "rule network-policy" in capsys.readouterr().out


def test_workload_kinds_get_the_container_rules(crd_dir: str, stub_jobs_dir: str) -> None:
    """Any manifest that runs pods: a Deployment as written by hand, then hardened."""
    container = {"name": "sync", "image": "amazon/aws-cli:2.17.0",
                 "command": ["sh", "-c", "mkdir -p /out && chmod 777 /out && aws s3 sync ..."],
                 "env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": AWS_SECRET}]}  # fmt: skip
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sync"},
                  "spec": {"selector": {"matchLabels": {"app": "sync"}},
                           "template": {"metadata": {"labels": {"app": "sync"}},
                                        "spec": {"containers": [container]}}}}  # fmt: skip
    problems = check([deployment], stub_jobs_dir, crd_dir)
    assert {p.rule: p.yaml_path for p in problems} == {
        Rule.NON_ROOT: "spec.template.spec.containers[0].securityContext.runAsNonRoot",
        Rule.PRIVILEGE: "spec.template.spec.containers[0].securityContext.allowPrivilegeEscalation",
        Rule.CAPABILITIES: "spec.template.spec.containers[0].securityContext.capabilities.drop",
        Rule.SECCOMP: "spec.template.spec.containers[0].securityContext.seccompProfile",
        Rule.WORLD_WRITABLE: "spec.template.spec.containers[0].command",
        Rule.CREDENTIALS: "spec.template.spec.containers[0].env[0].value",
    }, show(problems)
    assert all(AWS_SECRET not in str(p) for p in problems)
    pod = deployment["spec"]["template"]["spec"]
    pod["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000,
                              "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    container["securityContext"] = {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    container["command"][-1] = container["command"][-1].replace("chmod 777", "chmod 0750")
    del container["env"]
    assert check([deployment], stub_jobs_dir, crd_dir) == []


@pytest.mark.parametrize(("command", "found"), [
    ("chmod 0777 /x", ["chmod 0777"]),
    ("chmod -R 777 /x", ["chmod 777"]),
    ("chmod 1777 /tmp/x", ["chmod 1777"]),            # sticky, still writable by anyone
    ("chmod o+w /x", ["chmod o+w"]),
    ("chmod u=rwx,g=rx,o=rwx /x", ["chmod u=rwx,g=rx,o=rwx"]),
    ("mkdir -m 0777 -p /x", ["mkdir 0777"]),
    ("install -d --mode=a+w /x", ["install a+w"]),
    ("mkdir -p /x&&chmod 0777 /x", ["chmod 0777"]),   # no spaces around the operator
    ("chmod 0750 /x", []),
    ("chmod -R u+w,g-w /x", []),
    ("chmod 0777", ["chmod 0777"]),
    ("echo chmod; chown 1000:100 /x; chmod 755 /x", []),
    ("mkdir -p /x", []),
])  # fmt: skip
def test_world_writable_commands(command: str, found: list[str]) -> None:
    assert world_writable_commands(["sh", "-c", command]) == found


def test_secret_uris_mask_the_values() -> None:
    text = f"python x.py --storage_path 's3://b/p?region=us-east-1&secret_key={AWS_SECRET}' --x 1"
    assert secret_uris(text) == [("s3://b/p?region=us-east-1&secret_key=***", ["secret_key"])]
    assert secret_uris("python x.py --storage_path s3://b/p?region=us-east-1") == []


def test_local_tier_sizes_match_the_example_models() -> None:
    """The validator's model table and file size are the models' and the local tier's own."""
    torch = pytest.importorskip("torch")
    # After the skip: tests/deploy run without torch.
    from ray_resilience._internal.checkpoint.rank.local.tier import (  # noqa: PLC0415
        slot_bytes,
    )
    from ray_resilience.examples import hf_llama  # noqa: PLC0415
    from ray_resilience.examples.llama import PRESETS, Llama  # noqa: PLC0415

    for name, params in MODEL_PARAMS.items():
        if name in hf_llama.PRESETS:
            assert hf_llama.num_parameters(hf_llama.llama_config(name)) == params, name
            continue
        with torch.device("meta"):
            model = Llama(PRESETS[name])
        assert sum(p.numel() for p in model.parameters()) == params, name
    assert local_file_bytes(6 * 10**9) == slot_bytes(6 * 10**9)


def test_local_tier_problem_names_the_numbers(crd_dir: str, stub_jobs_dir: str) -> None:
    docs = load(EKS)
    at(job(docs), [*W_POD, "volumes", 0, "emptyDir"])["sizeLimit"] = "64Gi"
    problem, = check(docs, stub_jobs_dir, crd_dir)
    text = str(problem)
    assert "6.02 GB of parameters and AdamW state per rank" in text and "8 rank(s)" in text
    assert "111Gi" in text and "sizeLimit >= 112Gi" in text and "64Gi" in text
