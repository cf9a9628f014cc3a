"""Security rules: Ray token authentication, containers that run as a non-root user without extra
privileges (an init container may chown a volume), no world-writable folders, and no credentials
in a manifest. NetworkPolicies: `network_rules.py`.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ray_resilience.deploy.cluster import PodSpecAt, cluster_spec, pod_groups, pod_specs
from ray_resilience.deploy.problems import DocContext, ManifestProblem, Rule

# What a root init container may keep to chown a volume fsGroup does not reach.
OWNERSHIP_CAPABILITIES = frozenset({"CHOWN", "FOWNER"})
# What Pod Security "restricted" lets other containers add (usable through file capabilities).
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
MIN_TOKEN_AUTH_RAY = (2, 52, 0)  # KubeRay rejects authOptions.mode token below this rayVersion
SECRET_ENV_VARS = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "RAY_AUTH_TOKEN"}
)
SECRET_URI_PARAMS = frozenset({"access_key", "secret_key", "session_token"})  # pyarrow's S3 URI
_CONFINED_SECCOMP = ("RuntimeDefault", "Localhost")
_URI = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"]+")
_OCTAL = re.compile(r"^[0-7]{1,4}$")
_SYMBOLIC = re.compile(r"^[ugoa]*[-+=][-+=rwxXstugo]*(,[ugoa]*[-+=][-+=rwxXstugo]*)*$")
_SHELL_OPERATORS = frozenset({"&&", "||", ";", "|", "&", "(", ")"})
_IAM_ROLE_FIX = (
    "remove it; give the pods an IAM role instead: a ServiceAccount with the "
    "eks.amazonaws.com/role-arn annotation (IRSA) or an EKS Pod Identity association, used "
    "through serviceAccountName (see cluster_configs/rayjob-eks-p5.yaml)"
)


def security_problems(ctx: DocContext, doc: dict[str, Any]) -> list[ManifestProblem]:
    """Token auth (Ray kinds), then container hardening, credentials and world-writable modes for
    every pod spec the document runs."""
    problems = _auth_problems(ctx, doc) + _default_submitter_problems(ctx, doc)
    for pod in pod_specs(doc):
        problems += _pod_problems(ctx, pod)
    entrypoint = (doc.get("spec") or {}).get("entrypoint") if doc.get("kind") == "RayJob" else None
    if isinstance(entrypoint, str):
        problems += _command_problems(ctx, ["spec", "entrypoint"], [entrypoint], "the entrypoint")
    return problems


def _auth_problems(ctx: DocContext, doc: dict[str, Any]) -> list[ManifestProblem]:
    """authOptions.mode token, a Ray version that supports it, and no container overriding it."""
    found = cluster_spec(doc)
    if found is None:
        return []
    path, spec = found
    auth = spec.get("authOptions") if isinstance(spec.get("authOptions"), dict) else {}
    problems = []
    if auth.get("mode") != "token":
        message = (
            "Ray token authentication is off: the head's job API (8265), GCS (6379) and client "
            "port (10001) run code for anyone who can open a connection to them"
        )
        fix = (
            "add authOptions: {mode: token} to the cluster spec; KubeRay then creates a Secret "
            "with a random token and sets RAY_AUTH_MODE / RAY_AUTH_TOKEN in every Ray container "
            "and in the job submitter"
        )
        where = [*path, "authOptions", "mode"] if auth else [*path, "authOptions"]
        problems.append(ctx.problem(where, Rule.TOKEN_AUTH, auth.get("mode"), message, fix))
    else:
        version = spec.get("rayVersion")
        if _version(version) < MIN_TOKEN_AUTH_RAY:
            message = (
                "authOptions.mode token needs rayVersion 2.52.0 or newer; the operator rejects "
                "the cluster otherwise"
            )
            fix = 'set rayVersion to the image\'s Ray version, e.g. "2.60.0"'
            problems.append(ctx.problem([*path, "rayVersion"], Rule.TOKEN_AUTH, version, message,
                                        fix))  # fmt: skip
        if auth.get("enableK8sTokenAuth") and doc.get("kind") != "RayCluster":
            message = f"the operator rejects enableK8sTokenAuth in a {doc.get('kind')}"
            fix = "drop enableK8sTokenAuth; mode token alone uses a generated Secret"
            where = [*path, "authOptions", "enableK8sTokenAuth"]
            problems.append(ctx.problem(where, Rule.TOKEN_AUTH, True, message, fix))
    for group in pod_groups(doc):
        for i, var in enumerate(group.ray_container().get("env") or []):
            if (var or {}).get("name") != "RAY_AUTH_MODE" or "value" not in var:
                continue
            if str(var["value"]).strip().lower() == "token":
                continue
            message = (
                f"{group.name} pod: RAY_AUTH_MODE {var['value']!r} turns token authentication "
                "off in the Ray container (KubeRay only sets the variable when it is absent)"
            )
            where = [*group.pod_path, "containers", 0, "env", i, "value"]
            fix = "remove this RAY_AUTH_MODE entry; authOptions.mode: token sets it"
            problems.append(ctx.problem(where, Rule.TOKEN_AUTH, var["value"], message, fix))
    return problems


def _default_submitter_problems(ctx: DocContext, doc: dict[str, Any]) -> list[ManifestProblem]:
    """K8sJobMode without submitterPodTemplate runs KubeRay's default submitter, which has no
    securityContext."""
    spec = doc.get("spec") or {}
    mode = spec.get("submissionMode") or "K8sJobMode"
    if doc.get("kind") != "RayJob" or mode != "K8sJobMode" or spec.get("submitterPodTemplate"):
        return []
    message = (
        "no submitterPodTemplate: KubeRay's default submitter pod has no securityContext, so it "
        "runs as whatever user the image declares, with the runtime's default capabilities"
    )
    fix = (
        "add a submitterPodTemplate with the head's image, restartPolicy: Never and the Ray "
        "pods' securityContext (see cluster_configs/rayjob-eks-p5.yaml)"
    )
    return [ctx.problem(["spec", "submitterPodTemplate"], Rule.NON_ROOT, mode, message, fix)]


def _version(text: Any) -> tuple[int, ...]:
    """`"2.60.0"` -> (2, 60, 0), `"2.52"` -> (2, 52, 0); unparseable sorts below every version."""
    parts = [int(p) for p in re.findall(r"\d+", str(text or ""))[:3]]
    return (*parts, *[0] * (3 - len(parts))) if parts else (-1,)


def _pod_problems(ctx: DocContext, pod: PodSpecAt) -> list[ManifestProblem]:
    pod_context = pod.spec.get("securityContext") or {}
    problems = []
    for field in ("initContainers", "containers"):
        for i, container in enumerate(pod.spec.get(field) or []):
            if not isinstance(container, dict):
                continue
            where = [*pod.path, field, i]
            label = f"{pod.name}, container {container.get('name')!r}"
            init = field == "initContainers"
            problems += _container_problems(ctx, where, label, container, pod_context, init)
            problems += _env_problems(ctx, where, label, container)
            words = [str(w) for key in ("command", "args") for w in container.get(key) or []]
            command_path = [*where, "command" if container.get("command") else "args"]
            problems += _command_problems(ctx, command_path, words, label)
    return problems


def _container_problems(
    ctx: DocContext,
    where: list[Any],
    label: str,
    container: dict[str, Any],
    pod_context: dict[str, Any],
    init: bool,
) -> list[ManifestProblem]:
    """Pod Security "restricted" for one container; the pod's securityContext is the default."""
    own = container.get("securityContext") or {}
    problems: list[ManifestProblem] = []

    def effective(key: str) -> Any:
        return own[key] if key in own else pod_context.get(key)

    def add(field: list[str], rule: Rule, value: Any, message: str, fix: str) -> None:
        path = [*where, "securityContext", *field]
        problems.append(ctx.problem(path, rule, value, f"{label}: {message}", fix))

    # Init containers are judged by their capabilities: root that may only chown is allowed.
    if not init and effective("runAsUser") == 0:
        add(["runAsUser"], Rule.NON_ROOT, 0, "runs as root (uid 0), so code it runs, e.g. a "
            "submitted job, owns the node's mounts and devices", "run as the image's non-root "
            "user: runAsUser: 1000, runAsNonRoot: true in the pod's securityContext")  # fmt: skip
    elif not init and effective("runAsNonRoot") is not True:
        add(["runAsNonRoot"], Rule.NON_ROOT, effective("runAsNonRoot"), "runAsNonRoot is not "
            "true, so nothing stops it running as root (an image's USER 0, a runAsUser: 0)",
            "set runAsNonRoot: true and runAsUser: 1000 in the pod's securityContext")  # fmt: skip
    if own.get("privileged") is True:
        add(["privileged"], Rule.PRIVILEGE, True, "is privileged: it gets every device and "
            "capability of the node", "remove privileged; ask for devices as resources "
            "(nvidia.com/gpu, vpc.amazonaws.com/efa)")  # fmt: skip
    elif own.get("allowPrivilegeEscalation") is not False:
        add(["allowPrivilegeEscalation"], Rule.PRIVILEGE, own.get("allowPrivilegeEscalation"),
            "allowPrivilegeEscalation is not false: a setuid binary in the image can regain "
            "privileges", "set allowPrivilegeEscalation: false")  # fmt: skip
    capabilities = own.get("capabilities") or {}
    dropped = {_capability(c) for c in capabilities.get("drop") or []}
    if "ALL" not in dropped:
        add(["capabilities", "drop"], Rule.CAPABILITIES, capabilities.get("drop"), "does not "
            "drop ALL capabilities, so it keeps the runtime's defaults (NET_RAW, SETUID, ...)",
            "set capabilities.drop: [ALL]")  # fmt: skip
    allowed = OWNERSHIP_CAPABILITIES if init else RESTRICTED_CAPABILITIES
    extra = sorted({_capability(c) for c in capabilities.get("add") or []} - allowed)
    if extra:
        why = (
            "an init container may keep only CHOWN and FOWNER, to hand a volume to the Ray user"
            if init
            else "a non-root process does not hold added capabilities after exec (Kubernetes "
            "sets no ambient capabilities), so they only widen what a setuid binary could gain"
        )
        add(["capabilities", "add"], Rule.CAPABILITIES, extra, f"adds {', '.join(extra)}: {why}",
            f"remove {', '.join(extra)} from capabilities.add")  # fmt: skip
    seccomp = effective("seccompProfile") or {}
    if seccomp.get("type") not in _CONFINED_SECCOMP:
        add(["seccompProfile"], Rule.SECCOMP, seccomp.get("type"), "has no RuntimeDefault "
            "seccomp profile, so it runs Unconfined (the kubelet's default)",
            "set seccompProfile: {type: RuntimeDefault} in the pod's securityContext")  # fmt: skip
    return problems


def _capability(name: Any) -> str:
    return str(name).upper().removeprefix("CAP_")


def _env_problems(
    ctx: DocContext, where: list[Any], label: str, container: dict[str, Any]
) -> list[ManifestProblem]:
    """AWS keys and Ray tokens as literal env values (valueFrom a Secret is fine)."""
    problems = []
    for i, var in enumerate(container.get("env") or []):
        name, value = (var or {}).get("name"), (var or {}).get("value")
        if name not in SECRET_ENV_VARS or not value:
            continue
        if name == "RAY_AUTH_TOKEN":
            what = "a Ray auth token"
            fix = "remove it; authOptions.mode: token makes KubeRay inject a generated one"
        else:
            what, fix = "an AWS credential", _IAM_ROLE_FIX
        message = (
            f"{label}: {name} is {what} written into the manifest, so it lands in git, in "
            "`kubectl get -o yaml` and in every process's environment"
        )
        shown = f"<{len(str(value))} characters, not shown>"
        problems.append(ctx.problem([*where, "env", i, "value"], Rule.CREDENTIALS, shown, message,
                                    fix))  # fmt: skip
    return problems


def _command_problems(
    ctx: DocContext, path: list[Any], words: list[str], label: str
) -> list[ManifestProblem]:
    """World-writable modes (chmod / mkdir -m / install -m) and keys in URI query strings."""
    problems = []
    for command in world_writable_commands(words):
        message = (
            f"{label} runs `{command}`: a world-writable folder lets any user on the node plant "
            "or replace files, e.g. a checkpoint the next restore loads"
        )
        fix = (
            "hand the folder to the Ray user instead: chown 1000:100 and chmod 0750 (an init "
            "container running as root with only CHOWN and FOWNER), or fsGroup where the volume "
            "honours it"
        )
        problems.append(ctx.problem(path, Rule.WORLD_WRITABLE, command, message, fix))
    for uri, keys in secret_uris(" ".join(words)):
        message = (
            f"{label} passes {', '.join(keys)} in a URI query string: the keys land in the "
            "manifest, the job's logs, Result.path and results.json"
        )
        fix = "drop the key parameters from the URI; " + _IAM_ROLE_FIX.removeprefix("remove it; ")
        problems.append(ctx.problem(path, Rule.CREDENTIALS, uri, message, fix))
    return problems


def world_writable_commands(words: list[str]) -> list[str]:
    """`chmod MODE`, `mkdir -m MODE`, `install -m MODE` whose MODE gives others write access."""
    tokens = _shell_tokens(words)
    found = []
    for i, token in enumerate(tokens):
        name = posixpath.basename(token)
        if name not in ("chmod", "mkdir", "install"):
            continue
        rest = tokens[i + 1 :]
        rest = rest[: next((j for j, t in enumerate(rest) if t in _SHELL_OPERATORS), len(rest))]
        mode = _chmod_mode(rest) if name == "chmod" else _mode_option(rest)
        if mode is not None and _world_writable(mode):
            found.append(f"{name} {mode}")
    return found


def _shell_tokens(words: list[str]) -> list[str]:
    tokens = []
    for word in words:
        lexer = shlex.shlex(word, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            tokens += list(lexer)
        except ValueError:  # unbalanced quotes: fall back to whitespace
            tokens += word.split()
    return tokens


def _chmod_mode(args: list[str]) -> str | None:
    return next((a for a in args if _OCTAL.match(a) or _SYMBOLIC.match(a)), None)


def _mode_option(args: list[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg in ("-m", "--mode") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--mode="):
            return arg.partition("=")[2]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
    return None


def _world_writable(mode: str) -> bool:
    if _OCTAL.match(mode):
        return bool(int(mode, 8) & 0o002)
    for clause in mode.split(","):
        who = clause[: len(clause) - len(clause.lstrip("ugoa"))]
        for op, perms in re.findall(r"([-+=])([rwxXstugo]*)", clause[len(who) :]):
            if op in "+=" and "w" in perms and ("o" in who or "a" in who):
                return True
    return False


def secret_uris(text: str) -> list[tuple[str, list[str]]]:
    """(URI with the secret values masked, secret parameter names) for each URI carrying keys."""
    found = []
    for match in _URI.finditer(text):
        parts = urlsplit(match.group(0))
        params = parse_qsl(parts.query, keep_blank_values=True)
        keys = sorted({k for k, _ in params if k.lower() in SECRET_URI_PARAMS})
        if keys:
            query = "&".join(f"{k}={'***' if k in keys else v}" for k, v in params)
            found.append((parts._replace(query=query).geturl(), keys))
    return found
