"""cluster_configs/eks/: the eksctl ClusterConfig and the FSx steps agree with the RayJob.

Offline: eksctl and the AWS APIs are not reachable here, so the ClusterConfig is checked against
cluster.schema.json (eksctl's field names, strict) and against what rayjob-eks-p5.yaml asks of
the nodes: instance type, taint, GPUs/EFA per node, node count, zone and region of FSx.
"""

from __future__ import annotations

import copy
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ray_resilience.deploy.cluster import quantity

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "cluster_configs"
EKS = CONFIGS / "eks"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GIB = Decimal(2) ** 30
# What EC2 publishes for the instance types the config uses (vCPU, memory, GPUs, EFA interfaces).
CAPACITY = {
    "p5.48xlarge": {"cpu": 192, "memory": 2048 * GIB, "nvidia.com/gpu": 8,
                    "vpc.amazonaws.com/efa": 32},
    "m6i.4xlarge": {"cpu": 16, "memory": 64 * GIB},
}
# Per node, what a pod cannot have: the EKS AMI's kubelet reservation (under 1 CPU; 255Mi + 11Mi
# per possible pod, about 3 GiB on these sizes) and the DaemonSets (CNI, kube-proxy, device
# plugins, FSx CSI node, monitoring agent). Generous, so a fit here is a fit there.
HEADROOM = {"cpu": Decimal(2), "memory": 8 * GIB}

pytestmark = pytest.mark.timeout(60)


def cluster() -> dict[str, Any]:
    return yaml.safe_load((EKS / "cluster.yaml").read_text())


def schema() -> dict[str, Any]:
    return json.loads((EKS / "cluster.schema.json").read_text())


def rayjob() -> dict[str, Any]:
    docs = yaml.safe_load_all((CONFIGS / "rayjob-eks-p5.yaml").read_text())
    return next(d for d in docs if d and d["kind"] == "RayJob")


def worker_group() -> dict[str, Any]:
    return rayjob()["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]


def head_pod() -> dict[str, Any]:
    return rayjob()["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]


def group_for(instance_type: str) -> dict[str, Any]:
    groups = [g for g in cluster()["managedNodeGroups"] if g["instanceType"] == instance_type]
    assert len(groups) == 1, f"expected one node group of {instance_type}, got {len(groups)}"
    return groups[0]


def gpu_group() -> dict[str, Any]:
    return group_for(worker_group()["template"]["spec"]["nodeSelector"][INSTANCE_TYPE_LABEL])


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """Kubernetes' rule: same key (or none with Exists), same effect (or none), value if Equal."""
    for tol in tolerations:
        key_ok = tol.get("key") == taint["key"] or (tol.get("operator") == "Exists"
                                                    and not tol.get("key"))
        effect_ok = tol.get("effect") in (None, "", taint["effect"])
        value_ok = tol.get("operator") == "Exists" or tol.get("value", "") == taint.get("value", "")
        if key_ok and effect_ok and value_ok:
            return True
    return False


def shell_vars(text: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_]+)=([\w.-]+)$", text, flags=re.MULTILINE))


def test_cluster_config_matches_its_strict_schema() -> None:
    jsonschema.Draft7Validator.check_schema(schema())
    jsonschema.Draft7Validator(schema()).validate(cluster())


@pytest.mark.parametrize(("path", "value"), [
    (("managedNodeGroups", 1, "efaEnable"), True),          # misspelt field
    (("metadata", "version"), 1.3),                          # unquoted "1.30" parses as 1.3
    (("managedNodeGroups", 1, "taints", 0, "effect"), "NoScheduled"),
    (("availabilityZones",), ["us-west-2a"]),                # control plane needs two zones
    (("addons", 0, "nmae"), "vpc-cni"),
])
def test_schema_rejects_a_broken_copy(path: tuple[Any, ...], value: Any) -> None:
    broken = copy.deepcopy(cluster())
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema()).validate(broken)


def test_kubernetes_version_is_at_least_1_28() -> None:
    major, minor = (int(x) for x in cluster()["metadata"]["version"].split("."))
    assert (major, minor) >= (1, 28)


def test_gpu_group_is_what_the_rayjob_selects() -> None:
    group, workers = gpu_group(), worker_group()
    assert group.get("efaEnabled") is True
    assert len(group["availabilityZones"]) == 1, "EFA groups must stay in one zone"
    assert group["availabilityZones"][0] in cluster()["availabilityZones"]
    assert group["minSize"] <= group["desiredCapacity"] <= group["maxSize"]
    # One worker pod per node (it takes every GPU): the group must hold all replicas at once.
    assert group["minSize"] >= workers["replicas"] == workers["minReplicas"], group
    assert group.get("taints"), "untainted GPU nodes would also take the head and the operators"


def test_taints_are_tolerated_by_workers_and_keep_the_head_off() -> None:
    taints = gpu_group()["taints"]
    worker_tolerations = worker_group()["template"]["spec"].get("tolerations", [])
    head_tolerations = head_pod().get("tolerations", [])
    for taint in taints:
        assert tolerates(worker_tolerations, taint), taint
        assert not tolerates(head_tolerations, taint), taint
    untainted = [g for g in cluster()["managedNodeGroups"] if not g.get("taints")]
    assert untainted, "the head needs a node group without the GPU taint"


def test_pods_fit_their_nodes() -> None:
    worker = worker_group()["template"]["spec"]["containers"][0]["resources"]["requests"]
    head = head_pod()["containers"][0]["resources"]["requests"]
    gpu_type = gpu_group()["instanceType"]
    for key in ("nvidia.com/gpu", "vpc.amazonaws.com/efa"):
        assert quantity(worker[key]) == CAPACITY[gpu_type][key], (key, worker[key])
    placements = [(worker, gpu_type)]
    placements += [(head, g["instanceType"]) for g in cluster()["managedNodeGroups"]
                   if not g.get("taints")]
    for requests, instance_type in placements:
        assert instance_type in CAPACITY, f"add {instance_type}'s vCPUs and memory to CAPACITY"
        # Huge pages are carved out of the node's memory before the kubelet hands any out.
        wanted = {"cpu": quantity(requests["cpu"]),
                  "memory": (quantity(requests["memory"])
                             + quantity(requests.get("hugepages-2Mi", 0)))}
        for key, amount in wanted.items():
            free = CAPACITY[instance_type][key] - HEADROOM[key]
            assert amount <= free, (instance_type, key, amount, free)


def test_head_nodes_share_the_gpu_zone() -> None:
    """The head mounts FSx too (it commits checkpoints): same zone as the file system."""
    zone = gpu_group()["availabilityZones"]
    for group in cluster()["managedNodeGroups"]:
        assert group["availabilityZones"] == zone, group["name"]


def test_fsx_steps_use_the_cluster_zone_region_and_name() -> None:
    doc = (EKS / "fsx-filesystem.md").read_text()
    env = shell_vars(doc)
    meta = cluster()["metadata"]
    assert env == {"CLUSTER": meta["name"], "REGION": meta["region"],
                   "AZ": gpu_group()["availabilityZones"][0]}
    assert '"Name=availability-zone,Values=$AZ"' in doc, "the subnet must be looked up by $AZ"
    create = doc[doc.index("aws fsx create-file-system"):doc.index("--query FileSystem.")]
    for flag in ("--storage-capacity 1200", "DeploymentType=SCRATCH_2",
                 '--subnet-ids "$SUBNET_ID"'):
        assert flag in create, flag


def test_fsx_doc_placeholders_exist_in_the_manifests_it_edits() -> None:
    """A `sed s/placeholder/` whose placeholder is gone would silently leave the manifest as is."""
    doc = (EKS / "fsx-filesystem.md").read_text()
    edits = re.findall(r"sed -i ((?:-e )?\"s/.*?)\s+cluster_configs/(\S+\.yaml)", doc,
                       flags=re.DOTALL)
    assert len(edits) == 2, edits
    for script, manifest in edits:
        text = (CONFIGS / manifest).read_text()
        for placeholder in re.findall(r'"s/([^/$]+)/', script):
            assert placeholder in text, (manifest, placeholder)


def test_region_is_the_same_everywhere() -> None:
    region = cluster()["metadata"]["region"]
    images = {c["image"] for g in [rayjob()["spec"]["rayClusterSpec"]["headGroupSpec"],
                                   worker_group()] for c in g["template"]["spec"]["containers"]}
    for image in images:
        assert f".dkr.ecr.{region}.amazonaws.com/" in image, image
    static = list(yaml.safe_load_all((CONFIGS / "fsx-storage-static.yaml").read_text()))
    dns = static[0]["spec"]["csi"]["volumeAttributes"]["dnsname"]
    assert dns.endswith(f".fsx.{region}.amazonaws.com"), dns


def test_fsx_csi_addon_can_provision_the_storage_class() -> None:
    addons = {a["name"]: a for a in cluster()["addons"]}
    assert "eks-pod-identity-agent" in addons, "the FSx CSI add-on authenticates via Pod Identity"
    grants = addons["aws-fsx-csi-driver"]["podIdentityAssociations"]
    assert any(g["serviceAccountName"] == "fsx-csi-controller-sa"
               and g["namespace"] == "kube-system"
               and any(p.endswith(":policy/AmazonFSxFullAccess") for p in g["permissionPolicyARNs"])
               for g in grants), grants
    storage = list(yaml.safe_load_all((CONFIGS / "fsx-storage.yaml").read_text()))
    storage_class = next(d for d in storage if d["kind"] == "StorageClass")
    assert storage_class["provisioner"] == "fsx.csi.aws.com"
    assert storage_class["parameters"]["deploymentType"] == "SCRATCH_2"


def test_cluster_enforces_the_rayjob_network_policy() -> None:
    """EKS accepts NetworkPolicies without enforcing them unless the VPC CNI add-on is told to."""
    rayjob_docs = yaml.safe_load_all((CONFIGS / "rayjob-eks-p5.yaml").read_text())
    assert any(d and d["kind"] == "NetworkPolicy" for d in rayjob_docs)
    cni = next(a for a in cluster()["addons"] if a["name"] == "vpc-cni")
    assert json.loads(cni.get("configurationValues", "{}")).get("enableNetworkPolicy") == "true"


def test_readme_walks_up_in_order_and_cleans_up_in_reverse() -> None:
    readme = (CONFIGS / "README.md").read_text()
    up = ["eksctl create cluster -f cluster_configs/eks/cluster.yaml",
          "cluster_configs/eks/fsx-filesystem.md",
          "kubectl apply -f cluster_configs/fsx-storage.yaml",
          "helm install kuberay-operator",
          "kubectl apply -f cluster_configs/rayjob-eks-p5.yaml"]
    down = ["kubectl delete -f cluster_configs/rayjob-eks-p5.yaml",
            "kubectl delete -f cluster_configs/fsx-storage.yaml",
            "aws ec2 delete-security-group",
            "helm uninstall kuberay-operator",
            "eksctl delete cluster -f cluster_configs/eks/cluster.yaml"]
    for steps in (up, down):
        positions = [readme.find(step) for step in steps]
        assert -1 not in positions, [s for s, p in zip(steps, positions, strict=True) if p < 0]
        assert positions == sorted(positions), steps
    assert readme.find(down[0]) > readme.find(up[-1])
