"""A rank that could not start becomes a `WorkerStartupError` naming the rank, its node, the
cause and the fix, never an internal error of the supervisor."""

from __future__ import annotations

from typing import Any

from ray_resilience.errors import WorkerStartupError

SHIP_CODE_FIX = (
    "The ranks import the train function's module by name, and module {module!r} is not "
    "importable on that node: ship your code with the job, e.g. ray.init(runtime_env="
    "{{'working_dir': '.'}}) or runtime_env={{'py_modules': [...]}} (`ray job submit "
    "--working-dir .`), or install it on every node.")
UNPICKLE_FIX = ("The train function or train_loop_config could not be rebuilt on the rank: "
                "give every node the same packages and versions as the driver (runtime_env "
                "'pip' or 'py_modules', or the cluster image).")
ACTOR_FIX = ("Ray could not create the rank's actor; check the runtime_env (working_dir, pip) "
             "and the node's logs.")


def node_name(info: dict[str, Any]) -> str:
    """`ip (node id)` of a rank's info, as far as known."""
    node = str(info.get("node_id") or "?")[:16]
    return f"{info['ip']} ({node})" if info.get("ip") else node


def from_info(rank: int, info: dict[str, Any]) -> WorkerStartupError | None:
    """The error an actor reported from its `__init__` (see `WorkerActor.info`), or None."""
    failed = info.get("startup_error")
    if failed is None:
        return None
    module = failed.get("module")
    fix = SHIP_CODE_FIX.format(module=module) if module else UNPICKLE_FIX
    return WorkerStartupError(rank=rank, node=node_name(info), exc_type=failed["exc_type"],
                              message=failed["message"], fix=fix,
                              traceback=failed.get("traceback", ""))


def from_actor_error(rank: int, node_id: str | None, exc: BaseException) -> WorkerStartupError:
    """The error for an actor Ray could not create or that died before it answered."""
    return WorkerStartupError(rank=rank, node=str(node_id or "?")[:16],
                              exc_type=type(exc).__name__, message=str(exc), fix=ACTOR_FIX)


def first_failure(infos: list[dict[str, Any]]) -> WorkerStartupError | None:
    """The lowest rank's startup error among `infos`, if any."""
    for rank, info in enumerate(infos):
        error = from_info(rank, info)
        if error is not None:
            return error
    return None
