"""Rules that tie a RayJob's entrypoint to its cluster: the script exists, ranks match GPUs,
a rerun resumes (fixed run name, shared storage path), the local tier fits its tmpfs.
"""

from __future__ import annotations

import os
import posixpath
from decimal import Decimal
from typing import Any

from ray_resilience.deploy.cluster import PodGroup, pod_groups, quantity
from ray_resilience.deploy.entrypoint import Entrypoint, parse_entrypoint
from ray_resilience.deploy.problems import DocContext, ManifestProblem, Rule
from ray_resilience.deploy.storage_rules import path_problems

GPU_RESOURCE = "nvidia.com/gpu"
JOB_ARG_ALIASES = {"checkpoint_dir": "storage_path", "data_dir": "data",
                   "checkpoint_freq": "checkpoint_interval", "train_batch_size": "batch_size",
                   "max_training_steps": "max_steps"}
"""The example job's second names (the AWS FSDP test case's) -> the names these rules read
(ray_resilience/examples/job_args.py; tests/unit/test_example_args.py keeps them in step)."""
MODEL_PARAMS = {"tiny": 123_712, "small": 31_597_056, "llama3-8b": 8_030_261_248,
                "llama3-tiny": 123_712, "llama3.1-8b": 8_030_261_248}
"""Parameters of the example models `--model` names (tests check them against the models)."""
BYTES_PER_PARAM = 12
"""fp32 parameters and AdamW's two moments."""
LOCAL_FILES = 2
"""Files per rank in the local tier: the newest snapshot and the one before."""
CONTAINER_SHM = 64 * 2**20
"""A container's /dev/shm when no volume is mounted there."""
HEADROOM = 1.1
"""Room beyond the local tier's files (NCCL's and Ray's own /dev/shm files)."""
_ENTRYPOINT = ("spec", "entrypoint")
_SHELL_EXPANSION = ("$", "`")


def job_problems(ctx: DocContext, doc: dict[str, Any], jobs_dir: str) -> list[ManifestProblem]:
    """All entrypoint rules for one RayJob (InteractiveMode jobs have no entrypoint to check)."""
    spec = doc.get("spec") or {}
    if spec.get("submissionMode") == "InteractiveMode":
        return []
    text = spec.get("entrypoint")
    try:
        entry = _canonical(parse_entrypoint(text if isinstance(text, str) else ""))
    except ValueError as err:
        fix = "fix the shell quoting of the entrypoint"
        return [ctx.problem(_ENTRYPOINT, Rule.ENTRYPOINT_FILE, text, f"cannot parse: {err}", fix)]
    problems = _script_problems(ctx, entry, jobs_dir, text) + _resume_problems(ctx, spec, entry)
    groups = pod_groups(doc)
    if groups:
        problems += _gpu_problems(ctx, entry, groups)
        problems += path_problems(ctx, entry, groups, "storage_path", writable=True)
        problems += path_problems(ctx, entry, groups, "data", writable=False)
        problems += _local_tier_problems(ctx, entry, groups)
    return problems


def _canonical(entry: Entrypoint) -> Entrypoint:
    return Entrypoint(entry.script, {JOB_ARG_ALIASES.get(k, k): v for k, v in entry.args.items()})


def _script_problems(
    ctx: DocContext, entry: Entrypoint, jobs_dir: str, text: Any
) -> list[ManifestProblem]:
    """The entrypoint must run a script from jobs/ that exists in `jobs_dir`."""
    if entry.script is None:
        message = "no `python jobs/<file>.py` invocation found in the entrypoint"
        fix = "run one of the job scripts, e.g. python jobs/train_llama_fsdp.py ..."
        return [ctx.problem(_ENTRYPOINT, Rule.ENTRYPOINT_FILE, text, message, fix)]
    parts = posixpath.normpath(entry.script).split("/")
    if "jobs" not in parts[:-1]:
        message = "the entrypoint script is not under jobs/, where the job scripts ship"
        fix = "run a script from jobs/, e.g. jobs/train_llama_fsdp.py"
        return [ctx.problem(_ENTRYPOINT, Rule.ENTRYPOINT_FILE, entry.script, message, fix)]
    relative = parts[len(parts) - parts[::-1].index("jobs") :]
    if os.path.isfile(os.path.join(jobs_dir, *relative)):
        return []
    available = sorted(n for n in os.listdir(jobs_dir) if n.endswith(".py"))
    message = f"{'/'.join(relative)} does not exist in {jobs_dir}; the job would fail at start"
    fix = f"fix the script name; available: {', '.join(available) or 'none'}"
    return [ctx.problem(_ENTRYPOINT, Rule.ENTRYPOINT_FILE, entry.script, message, fix)]


def _resume_problems(
    ctx: DocContext, spec: dict[str, Any], entry: Entrypoint
) -> list[ManifestProblem]:
    """backoffLimit > 0 only helps if the rerun finds the same run folder on shared storage."""
    retries = spec.get("backoffLimit")
    if not isinstance(retries, int) or retries <= 0 or entry.script is None:
        return []
    why = f"backoffLimit {retries} reruns the job on a brand-new RayCluster, but"
    run_name = entry.args.get("run_name")
    problems = []

    def add(value: object, message: str, fix: str) -> None:
        problems.append(ctx.problem(_ENTRYPOINT, Rule.RESUME, value, f"{why} {message}", fix))

    if not isinstance(run_name, str):
        add(run_name, "without --run_name every rerun starts from step 0", "add --run_name NAME")
    elif any(c in run_name for c in _SHELL_EXPANSION):
        add(run_name, "the shell expands --run_name, so a rerun may get a new name and start "
            "from step 0", "use a literal run name, e.g. --run_name llama3-8b-run1")  # fmt: skip
    if not isinstance(entry.args.get("storage_path"), str):
        add(None, "without --storage_path the checkpoints stay in the old cluster's pods",
            "add --storage_path on the shared volume, e.g. /fsx/checkpoints")  # fmt: skip
    return problems


def _gpus(group: PodGroup) -> int:
    """GPUs Ray sees in one pod: rayStartParams num-gpus overrides the container's GPU limit."""
    override = (group.spec.get("rayStartParams") or {}).get("num-gpus")
    resources = group.ray_container().get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    value = limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE)) if override is None else override
    return int(quantity(value or 0) or 0)


def _gpu_problems(
    ctx: DocContext, entry: Entrypoint, groups: list[PodGroup]
) -> list[ManifestProblem]:
    """One training process per GPU: GPUs per worker pod x pods == --num_workers."""
    head, workers = groups[0], groups[1:]
    total = sum(_gpus(g) * g.pods() for g in workers)
    layout = ", ".join(f"{g.name}: {_gpus(g)} GPUs x {g.pods()} pods" for g in workers) or "none"
    num_workers = entry.args.get("num_workers")
    problems = []

    def add(value: object, message: str, fix: str, path: Any = _ENTRYPOINT) -> None:
        problems.append(ctx.problem(path, Rule.GPU_COUNT, value, message, fix))

    if _gpus(head):
        add(_gpus(head), "the head pod holds GPUs that no rank uses (ranks run on worker pods; "
            "the head runs the driver and the supervisor)", f"remove {GPU_RESOURCE} from the "
            "head", [*head.pod_path, "containers", 0, "resources"])  # fmt: skip
    if entry.args.get("use_gpu") is not True:
        if total:
            add(total, f"worker pods hold {total} GPUs ({layout}) but the entrypoint lacks "
                "--use_gpu: training would run on CPU with the GPUs idle",
                "add --use_gpu, or remove the GPUs from the worker groups")  # fmt: skip
    elif not (isinstance(num_workers, str) and num_workers.isdigit()):
        add(num_workers, "--use_gpu without an integer --num_workers: ranks cannot be matched "
            "to GPUs", f"pass --num_workers {total} ({layout})")  # fmt: skip
    elif int(num_workers) != total:
        add(f"--num_workers {num_workers}", f"--num_workers {num_workers} but the worker pods "
            f"hold {total} GPUs ({layout}); with one rank per GPU the job would wait forever "
            "for GPUs or leave some idle", f"pass --num_workers {total}, or change replicas / "
            f"{GPU_RESOURCE} so that GPUs per pod x pods = {num_workers}")  # fmt: skip
    return problems


def local_file_bytes(state_bytes: int) -> int:
    """One local-tier file of a rank holding `state_bytes` (`local_tier.slot_bytes`)."""
    return 4096 + state_bytes + state_bytes // 8 + 65536


def _tmpfs_limit(group: PodGroup, mount_path: str) -> tuple[Any, Decimal | None, Any]:
    """(YAML path, size limit in bytes, volume) of the Memory emptyDir mounted at `mount_path`
    in the Ray container; size None when there is none (a container's /dev/shm: 64 MiB)."""
    mounts = group.ray_container().get("volumeMounts") or []
    volumes = {v.get("name"): (i, v) for i, v in enumerate(group.pod_spec.get("volumes") or [])}
    for mount in mounts:
        if posixpath.normpath(str(mount.get("mountPath", ""))) == mount_path:
            index, volume = volumes.get(mount.get("name"), (None, {}))
            empty = volume.get("emptyDir")
            if isinstance(empty, dict) and empty.get("medium") == "Memory":
                return ([*group.pod_path, "volumes", index, "emptyDir", "sizeLimit"],
                        quantity(empty.get("sizeLimit")) if "sizeLimit" in empty else None,
                        empty.get("sizeLimit"))
    return [*group.pod_path, "volumes"], None, None


def _local_tier_problems(
    ctx: DocContext, entry: Entrypoint, groups: list[PodGroup]
) -> list[ManifestProblem]:
    """Each worker pod's memory-backed tmpfs holds 2 local-tier files per rank it hosts (state
    per rank from the model and --num_workers), with headroom."""
    params = MODEL_PARAMS.get(str(entry.args.get("model")))
    num_workers = entry.args.get("num_workers")
    if str(entry.args.get("local_interval_steps", "auto")) == "0" or params is None \
            or not (isinstance(num_workers, str) and num_workers.isdigit()) \
            or not int(num_workers):
        return []
    local_dir = posixpath.normpath(str(entry.args.get("local_dir", "/dev/shm")))
    state = params * BYTES_PER_PARAM // int(num_workers)
    workers = [g for g in groups[1:] if g.pods()]
    pods = sum(g.pods() for g in workers)
    problems = []
    for group in workers:
        ranks = _gpus(group) if entry.args.get("use_gpu") is True else -(-int(num_workers) // pods)
        need = int(LOCAL_FILES * local_file_bytes(state) * ranks * HEADROOM)
        path, limit, value = _tmpfs_limit(group, local_dir)
        if limit is None and value is None and local_dir == "/dev/shm":
            limit = Decimal(CONTAINER_SHM)  # the container runtime's own /dev/shm
        if limit is not None and limit >= need:
            continue
        shape = (f"--model {entry.args['model']} on {num_workers} ranks is {state / 1e9:.2f} GB "
                 f"of parameters and AdamW state per rank; {group.name}'s {ranks} rank(s) per "
                 f"pod keep {LOCAL_FILES} local-tier files each in {local_dir}: "
                 f"{need / 2**30:.0f}Gi with {HEADROOM:.0%} headroom")
        has = ("no memory-backed volume is mounted there (a container's /dev/shm is 64 MiB)"
               if limit is None and value is None else f"its sizeLimit is {value}")
        problems.append(ctx.problem(path, Rule.LOCAL_TIER, value or local_dir,
                                    f"{shape}, but {has}; ranks would turn the local tier off",
                                    f"mount an emptyDir (medium: Memory, sizeLimit >= "
                                    f"{-(-need // 2**30)}Gi) at {local_dir} and keep the memory "
                                    "limit above it, or pass --local_interval_steps 0"))
    return problems
