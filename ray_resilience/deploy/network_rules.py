"""NetworkPolicy rules: the Ray head admits its own cluster's pods and the job submitter, no others.

Kubernetes lets every pod reach every other pod unless a NetworkPolicy selects it; the head's job
API, GCS and client ports run code for whoever reaches them. These rules read the NetworkPolicies
among the validated documents and the labels KubeRay v1.7.0 puts on Ray pods (`labelPod` in
ray-operator/controllers/ray/common/pod.go: template labels, then ray.io/node-type, ray.io/group
and ray.io/cluster, which templates cannot override), and check that a policy selects the head;
that none of its rules opens a head port to every pod or to an address range; that the workers
still reach the GCS; and that a K8sJobMode submitter still reaches the job API.

A RayJob's or RayService's RayCluster is named `<name>-<random>` (a new one on every RayJob
rerun), so `ray.io/cluster` cannot select their pods; a label of the pod template can. Namespaces:
a document without metadata.namespace shares the others'; a namespaceSelector is matched on
`kubernetes.io/metadata.name` alone, with `default` for a document that names no namespace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ray_resilience.deploy.cluster import PodGroup, pod_groups
from ray_resilience.deploy.problems import DocContext, ManifestProblem, Rule

DEFAULT_HEAD_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001}
_START_PARAM_PORTS = {"port": "gcs-server", "dashboard-port": "dashboard",
                      "ray-client-server-port": "client"}  # fmt: skip
_FIXED_LABELS = frozenset({"ray.io/node-type", "ray.io/group", "ray.io/cluster"})
_NAMESPACE_LABEL = "kubernetes.io/metadata.name"
_EXAMPLE = "see cluster_configs/rayjob-eks-p5.yaml"


@dataclass(frozen=True)
class Pod:
    """A pod's labels as KubeRay creates it; `generated` labels have values no manifest knows."""

    what: str
    labels: dict[str, str]
    namespace: str | None
    generated: frozenset[str] = field(default_factory=frozenset)
    owner: str = ""


def ray_pod(doc: dict[str, Any], group: PodGroup) -> Pod:
    """The labels of the pods of one head or worker group."""
    kind, name = doc.get("kind", ""), str((doc.get("metadata") or {}).get("name", ""))
    node_type = "head" if group.is_head else "worker"
    template = ((group.spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    labels = {"ray.io/is-ray-node": "yes", "app.kubernetes.io/name": "kuberay",
              "app.kubernetes.io/created-by": "kuberay-operator"}  # fmt: skip
    for source in (template, group.spec.get("labels") or {}):
        labels.update({str(k): str(v) for k, v in source.items() if k not in _FIXED_LABELS})
    labels["ray.io/node-type"] = node_type
    labels["ray.io/group"] = "headgroup" if group.is_head else group.name
    generated = set() if "ray.io/identifier" in labels else {"ray.io/identifier"}
    if kind == "RayCluster":
        labels["ray.io/cluster"] = name
    else:
        generated.add("ray.io/cluster")
    what = "head pod" if group.is_head else f"{group.name} worker pod"
    return Pod(what, labels, _namespace(doc), frozenset(generated), kind)


def submitter_pod(doc: dict[str, Any]) -> Pod | None:
    """The pod a K8sJobMode RayJob runs `ray job submit` from (KubeRay's getSubmitterTemplate and
    the Job controller's labels); None for other kinds and submission modes."""
    spec = doc.get("spec") or {}
    if doc.get("kind") != "RayJob" or (spec.get("submissionMode") or "K8sJobMode") != "K8sJobMode":
        return None
    name = str((doc.get("metadata") or {}).get("name", ""))
    template = spec.get("submitterPodTemplate") or {}
    own = (template.get("metadata") or {}).get("labels") or {}
    labels = {str(k): str(v) for k, v in own.items()}
    labels.update({"ray.io/originated-from-cr-name": name, "ray.io/originated-from-crd": "RayJob",
                   "app.kubernetes.io/created-by": "kuberay-operator",
                   "batch.kubernetes.io/job-name": name, "job-name": name})  # fmt: skip
    generated = frozenset({"batch.kubernetes.io/controller-uid", "controller-uid"})
    return Pod("job submitter pod", labels, _namespace(doc), generated, "Job")


def selector_mismatch(selector: Any, pod: Pod) -> str | None:
    """None when a label selector matches the pod, else why it does not (for messages)."""
    if not isinstance(selector, dict):
        return "the selector is not a mapping"
    terms = [(k, "In", [v]) for k, v in (selector.get("matchLabels") or {}).items()]
    terms += [(e.get("key"), e.get("operator"), e.get("values") or [])
              for e in selector.get("matchExpressions") or [] if isinstance(e, dict)]  # fmt: skip
    for key, operator, values in terms:
        why = _term_mismatch(pod, str(key), str(operator), [str(v) for v in values])
        if why:
            return why
    return None


def _term_mismatch(pod: Pod, key: str, operator: str, values: list[str]) -> str | None:
    present = key in pod.labels or key in pod.generated
    if operator == "Exists":
        return None if present else f"the {pod.what} has no label {key}"
    if operator == "DoesNotExist":
        return f"the {pod.what} has label {key}" if present else None
    if key in pod.generated:
        return (
            f"{key} on the {pod.what} is generated by KubeRay for a {pod.owner} (its RayCluster "
            "is <name>-<random suffix>, a new one on every rerun), so no selector can name it"
        )
    value = pod.labels.get(key)
    if operator == "In":
        if value in values:
            return None
        if value is None:
            return f"the {pod.what} has no label {key}"
        return f"{key} is {value!r} on the {pod.what}, not {' or '.join(map(repr, values))}"
    if operator == "NotIn":
        return f"{key} is {value!r} on the {pod.what}" if value in values else None
    return f"unknown selector operator {operator!r}"


@dataclass(frozen=True)
class Policy:
    """A NetworkPolicy document, read defensively (the schema check reports malformed ones)."""

    name: str
    namespace: str | None
    spec: dict[str, Any]

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Policy:
        return cls(str(doc["metadata"].get("name")), _namespace(doc), doc.get("spec") or {})

    def why_not_selected(self, pod: Pod) -> str | None:
        """None when this policy restricts the pod's ingress, else why it does not."""
        if self.namespace and pod.namespace and self.namespace != pod.namespace:
            return f"it is in namespace {self.namespace}, the pod in {pod.namespace}"
        types = self.spec.get("policyTypes")
        if types is not None and "Ingress" not in types:
            return f"its policyTypes {types} do not restrict ingress"
        return selector_mismatch(self.spec.get("podSelector") or {}, pod)

    def ingress(self) -> list[dict[str, Any]]:
        return [r if isinstance(r, dict) else {} for r in self.spec.get("ingress") or []]

    def admits(self, pod: Pod, port: tuple[frozenset[str], int]) -> bool:
        """Whether some ingress rule lets `pod` connect to `port` (names, number)."""
        for rule in self.ingress():
            if not _covers(rule, port):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_admits(p, pod) for p in peers if isinstance(p, dict)):
                return True
        return False


def policies_in(docs: list[Any]) -> list[Policy]:
    """The well-formed NetworkPolicy documents among `docs`."""
    return [
        Policy.of(d)
        for d in docs
        if isinstance(d, dict)
        and d.get("kind") == "NetworkPolicy"
        and str(d.get("apiVersion", "")).startswith("networking.k8s.io/")
        and isinstance(d.get("metadata"), dict)
    ]


def head_ports(head: PodGroup) -> list[tuple[frozenset[str], int]]:
    """(names a policy may use, number) of the head's GCS, dashboard and client ports."""
    numbers = dict(DEFAULT_HEAD_PORTS)
    params = head.spec.get("rayStartParams") or {}
    for param, name in _START_PARAM_PORTS.items():
        if str(params.get(param, "")).isdigit():
            numbers[name] = int(params[param])
    declared = [p for p in head.ray_container().get("ports") or [] if isinstance(p, dict)]
    return [
        (frozenset({name} | {str(p["name"]) for p in declared
                             if p.get("containerPort") == number and p.get("name")}), number)
        for name, number in numbers.items()
    ]  # fmt: skip


def cluster_network_problems(
    ctx: DocContext, doc: dict[str, Any], policies: list[Policy]
) -> list[ManifestProblem]:
    """For a Ray resource: a policy restricts its head, and still admits workers and submitter."""
    groups = pod_groups(doc)
    if not groups:
        return []
    head, ports = groups[0], head_ports(groups[0])
    head_pod = ray_pod(doc, head)
    where = [*head.path, "template", "metadata", "labels"]
    selecting = [p for p in policies if p.why_not_selected(head_pod) is None]
    if not selecting:
        misses = [f"NetworkPolicy/{p.name}: {p.why_not_selected(head_pod)}" for p in policies]
        listed = ", ".join(f"{min(names)} {number}" for names, number in ports)
        message = (
            f"no NetworkPolicy among the validated manifests selects the head pod, so its ports "
            f"({listed}) accept connections from every pod in the cluster"
            + (f" ({'; '.join(misses[:3])})" if misses else "")
        )
        label = "app.kubernetes.io/instance"
        value = head_pod.labels.get(label) or (doc.get("metadata") or {}).get("name")
        fix = (
            f"add a NetworkPolicy (policyTypes [Ingress]) whose podSelector is ray.io/is-ray-node: "
            f'"yes" plus {label}: {value} (set that label in the head and worker pod templates), '
            f"admitting only this cluster's pods and the job submitter; {_EXAMPLE}"
        )
        return [ctx.problem(where, Rule.NETWORK_POLICY, head_pod.labels, message, fix)]
    problems = []
    gcs = next(p for p in ports if "gcs-server" in p[0])
    dashboard = next(p for p in ports if "dashboard" in p[0])
    needs = [(ray_pod(doc, g), gcs, "could not join the cluster") for g in groups[1:]]
    submitter = submitter_pod(doc)
    if submitter is not None:
        needs.append((submitter, dashboard, "could not submit the job (`ray job submit`)"))
    names = ", ".join(f"NetworkPolicy/{p.name}" for p in selecting)
    for pod, port, consequence in needs:
        if any(p.admits(pod, port) for p in selecting):
            continue
        number = port[1]
        shown = {k: v for k, v in pod.labels.items() if k.startswith(("ray.io/", "app."))}
        message = (
            f"{names} selects the head pod but admits no {pod.what} to port {number}: it "
            f"{consequence}"
        )
        fix = (
            f"add an ingress rule from a podSelector matching the {pod.what}'s labels "
            f"({shown}) on port {number}; {_EXAMPLE}"
        )
        problems.append(ctx.problem(where, Rule.NETWORK_POLICY, pod.what, message, fix))
    return problems


def policy_problems(
    ctx: DocContext, doc: dict[str, Any], ray_docs: list[dict[str, Any]]
) -> list[ManifestProblem]:
    """For a NetworkPolicy: ingress rules that open the head port of a Ray cluster it selects to
    every pod, every namespace or an address range (each reported once)."""
    policy, problems, seen = Policy.of(doc), [], set()
    for ray_doc in ray_docs:
        groups = pod_groups(ray_doc)
        if not groups or policy.why_not_selected(ray_pod(ray_doc, groups[0])) is not None:
            continue
        ports = head_ports(groups[0])
        for i, rule in enumerate(policy.ingress()):
            covered = [number for names, number in ports if _covers(rule, (names, number))]
            for suffix, source in _broad_sources(rule) if covered else []:
                if (i, *suffix) in seen:
                    continue
                seen.add((i, *suffix))
                message = (
                    f"admits {source} to the Ray head's port(s) {covered} of "
                    f"{ray_doc['kind']}/{ray_doc['metadata'].get('name')}, which run code for "
                    "whoever connects"
                )
                fix = (
                    "narrow the rule to the pods that need these ports: a podSelector such as "
                    'ray.io/is-ray-node: "yes" plus the pod template\'s app.kubernetes.io/instance'
                    f", or the job submitter's labels; {_EXAMPLE}"
                )
                path = ["spec", "ingress", i, *suffix]
                problems.append(ctx.problem(path, Rule.NETWORK_POLICY, source, message, fix))
    return problems


def _broad_sources(rule: dict[str, Any]) -> list[tuple[list[Any], str]]:
    """(path below the rule, description) of each source that is not a chosen set of pods."""
    peers = rule.get("from")
    if not peers:
        return [([], "every source (the rule has no `from`)")]
    found = []
    for j, peer in enumerate(peers):
        peer = peer if isinstance(peer, dict) else {}
        if "ipBlock" in peer:
            cidr = (peer.get("ipBlock") or {}).get("cidr")
            found.append((["from", j, "ipBlock"], f"the address range {cidr}"))
        elif not _narrows(peer.get("podSelector")):
            scope = "the namespace" if peer.get("namespaceSelector") is None else (
                "every namespace" if not _narrows(peer.get("namespaceSelector"))
                else "the selected namespaces")  # fmt: skip
            found.append((["from", j], f"every pod in {scope}"))
    return found


def _narrows(selector: Any) -> bool:
    return isinstance(selector, dict) and bool(
        selector.get("matchLabels") or selector.get("matchExpressions")
    )


def _peer_admits(peer: dict[str, Any], pod: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # an address range; which pods it holds cannot be read from manifests
    namespace_selector = peer.get("namespaceSelector")
    if namespace_selector is not None:
        namespace = Pod("namespace", {_NAMESPACE_LABEL: pod.namespace or "default"}, None)
        if selector_mismatch(namespace_selector, namespace) is not None:
            return False
    pod_selector = peer.get("podSelector")
    return pod_selector is None or selector_mismatch(pod_selector, pod) is None


def _covers(rule: dict[str, Any], port: tuple[frozenset[str], int]) -> bool:
    """Whether a rule's `ports` include this TCP port (no `ports`: every port)."""
    names, number = port
    entries = [p for p in rule.get("ports") or [] if isinstance(p, dict)]
    if not entries:
        return True
    for entry in entries:
        value = entry.get("port")
        if (entry.get("protocol") or "TCP") != "TCP":
            continue
        if value is None or value in names:
            return True
        if isinstance(value, int) and value <= number <= (entry.get("endPort") or value):
            return True
    return False


def _namespace(doc: dict[str, Any]) -> str | None:
    namespace = (doc.get("metadata") or {}).get("namespace")
    return str(namespace) if namespace else None
