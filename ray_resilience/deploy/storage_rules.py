"""Storage rules: checkpoints must land on one shared volume that outlives the pods and that every
Ray pod mounts at the same path (a RayJob rerun runs on a new RayCluster).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from ray_resilience.deploy.cluster import PodGroup, pod_groups
from ray_resilience.deploy.entrypoint import Entrypoint
from ray_resilience.deploy.problems import DocContext, ManifestProblem, Rule

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_POD_LOCAL = frozenset({"emptyDir", "ephemeral"})  # deleted with the pod, never shared
_READ_ONLY = frozenset({"configMap", "secret", "downwardAPI", "projected"})
_ENTRYPOINT = ("spec", "entrypoint")


def claim_problems(ctx: DocContext, doc: dict[str, Any], claims: set[str]) -> list[ManifestProblem]:
    """Ray pods may only use PersistentVolumeClaims declared alongside (when any are declared)."""
    problems = []
    for group in pod_groups(doc) if claims else []:
        for i, volume in enumerate(group.pod_spec.get("volumes") or []):
            claim = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
            if claim is None or claim in claims:
                continue
            message = (
                f"claim {claim!r} is not among the PersistentVolumeClaims declared alongside "
                f"({', '.join(sorted(claims))}); the {group.name} pod would stay Pending"
            )
            path = [*group.pod_path, "volumes", i, "persistentVolumeClaim", "claimName"]
            fix = "use the claim name declared in the storage manifest"
            problems.append(ctx.problem(path, Rule.CLAIM_DECLARED, claim, message, fix))
    return problems


def path_problems(
    ctx: DocContext, entry: Entrypoint, groups: list[PodGroup], flag: str, *, writable: bool
) -> list[ManifestProblem]:
    """`--<flag> PATH` must be on one shared, persistent volume mounted in every Ray pod."""
    path = entry.args.get(flag)
    if not isinstance(path, str) or _URI.match(path):
        return []  # absent, or object storage (s3://...) which needs no mount
    if not path.startswith("/"):
        message = f"--{flag} is relative: it resolves inside each pod's working directory"
        fix = "use an absolute path under the shared volume's mountPath"
        return [ctx.problem(_ENTRYPOINT, Rule.STORAGE_PATH, path, message, fix)]
    problems, backings = [], {}
    for group in groups:
        problem, backing = _check_mount(ctx, group, flag, posixpath.normpath(path), writable)
        problems += [problem] if problem else []
        backings.update({group.name: backing} if backing else {})
    if len(set(backings.values())) > 1:
        message = f"--{flag} {path} is on different storage in different pods: {backings}"
        fix = "mount the same claim at the same path in every Ray pod"
        problems.append(ctx.problem(_ENTRYPOINT, Rule.STORAGE_PATH, path, message, fix))
    return problems


def _check_mount(
    ctx: DocContext, group: PodGroup, flag: str, path: str, writable: bool
) -> tuple[ManifestProblem | None, str | None]:
    """(problem, identity of the backing storage) for the deepest mount holding `path`."""
    mounts = [m for m in group.ray_container().get("volumeMounts") or [] if isinstance(m, dict)]
    holding = [i for i, m in enumerate(mounts) if _under(path, str(m.get("mountPath", "")))]
    where = [*group.pod_path, "containers", 0, "volumeMounts"]
    if not holding:
        message = (
            f"--{flag} {path} is on no volume mounted in the {group.name} pod's ray container: "
            "files would land on the container's own disk and vanish with it"
        )
        fix = f"mount the shared volume (e.g. the FSx claim) at {path} or a parent, in every pod"
        return ctx.problem(where, Rule.STORAGE_PATH, path, message, fix), None
    best = max(holding, key=lambda i: len(str(mounts[i]["mountPath"])))
    mount = mounts[best]
    volumes = [v for v in group.pod_spec.get("volumes") or [] if isinstance(v, dict)]
    volume = next((v for v in volumes if v.get("name") == mount.get("name")), {})
    source = next((k for k in volume if k != "name"), None)
    if source is None or source in _POD_LOCAL or source in _READ_ONLY:
        what = f"a {source} volume" if source else "a volume missing from spec.volumes"
        message = f"--{flag} {path} is on {what} in the {group.name} pod: not shared storage"
        fix = "back it with a persistentVolumeClaim (hostPath only on a one-node test cluster)"
        return ctx.problem([*where, best], Rule.STORAGE_PATH, mount.get("name"), message, fix), None
    if writable and mount.get("readOnly"):
        message = f"--{flag} {path} is mounted read-only in the {group.name} pod"
        fix = "drop readOnly from this volumeMount"
        return ctx.problem([*where, best, "readOnly"], Rule.STORAGE_PATH, True, message, fix), None
    return None, f"{source}: {volume[source]!r} at {mount.get('mountPath')}"


def _under(path: str, mount_path: str) -> bool:
    if not mount_path:
        return False
    mount_path = posixpath.normpath(mount_path)
    return path == mount_path or path.startswith(mount_path.rstrip("/") + "/")
