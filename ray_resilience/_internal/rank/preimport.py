"""Ray's worker setup hook for rank processes: a prestarted process imports torch and the rank's
modules in the background at idle CPU priority, so a respawned rank's actor finds them imported
(docs/design.md, section 6). Nothing here may fail a worker: errors are logged.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from typing import Any

from ray_resilience._internal.constants import (
    DEFAULT_PREIMPORT_WATCH_INTERVAL_S,
    PREIMPORT_WATCH_INTERVAL_ENV_VAR,
    env_float,
)

log = logging.getLogger(__name__)

try:
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR as HOOK_ENV
except ImportError:  # pragma: no cover - the name Ray 2.60 uses
    HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"

HOOK = f"{__name__}.setup"
"""What `HOOK_ENV` names in the rank actors' env."""
USER_HOOK_ENV = "RAY_RESILIENCE_USER_SETUP_HOOK"
"""The job's own setup hook, run by `setup` before ours."""
PREIMPORT_KEY_ENV = "RAY_RESILIENCE_PREIMPORT_KEY"
"""The internal-KV key that switches the background import on for a run's rank processes."""
KV_NAMESPACE = "ray_resilience"

PREIMPORT_MODULES = (
    "torch",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch._dynamo",  # FSDP2's first fully_shard imports it
    "ray_resilience._internal.rank.worker",
    "ray_resilience._internal.checkpoint.rank.loader",
)
"""What a rank needs before its first step, in import order."""

_NORMAL_PRIORITY_MODULES = ("numpy", "pyarrow")
"""Imported on the calling thread: their helper threads inherit its scheduling policy."""

_thread: threading.Thread | None = None
_claimed = threading.Event()
_priority_lock = threading.Lock()
"""Orders the import thread's lowering of itself against a claim's raising it back."""
stats: dict[str, Any] = {}
"""What the preimport did here: `started`, `ended`, `seconds`, `policy`, `error`, and whether
an import a rank's claim found unfinished runs at the rank's priority from then on (`raised`)."""


def rank_env_vars(user_env: dict[str, str] | None, key: str) -> dict[str, str]:
    """Every rank actor's env vars: the user's, the setup hook, the run's switch `key`, and the
    job's own hook to chain."""
    env = dict(user_env or {})
    env[HOOK_ENV] = HOOK
    env[PREIMPORT_KEY_ENV] = key
    job_hook = os.environ.get(HOOK_ENV)
    if job_hook and job_hook != HOOK:
        env[USER_HOOK_ENV] = job_hook
    return env


def setup() -> None:
    """Ray's worker setup hook for rank processes (see the module docstring)."""
    user_hook = os.environ.get(USER_HOOK_ENV)
    if user_hook:  # the user's hook decides, as it would have without us: its error is fatal
        from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook  # noqa: PLC0415 - Ray-private, only with a user hook

        error = load_and_execute_setup_hook(user_hook)
        if error is not None:
            raise RuntimeError(error)
    key = os.environ.get(PREIMPORT_KEY_ENV)
    try:
        from ray.experimental.internal_kv import _internal_kv_get  # noqa: PLC0415 - Ray-private: may not fail the hook

        on = bool(key) and _internal_kv_get(key, namespace=KV_NAMESPACE) is not None
    except Exception as exc:  # noqa: BLE001 - see the module docstring
        log.warning("rank pre-import: could not read its switch (%s: %s)", type(exc).__name__, exc)
        on = False
    if not on:
        return
    try:  # an exception out of a setup hook ends the worker process: never one of ours
        start_preimport()
        threading.Thread(target=_exit_when_run_ends, args=(key,), name="rr-preimport-watch",
                         daemon=True).start()
    except Exception as exc:  # noqa: BLE001 - see the module docstring
        log.warning("rank pre-import: could not start (%s: %s)", type(exc).__name__, exc)


def _exit_when_run_ends(key: str) -> None:
    """Exits an unclaimed prestarted process once the supervisor switched its run's key off."""
    from ray.experimental.internal_kv import _internal_kv_get  # noqa: PLC0415 - Ray-private: may not fail the hook

    interval_s = env_float(PREIMPORT_WATCH_INTERVAL_ENV_VAR, DEFAULT_PREIMPORT_WATCH_INTERVAL_S)
    while not _claimed.wait(interval_s):
        try:
            ended = _internal_kv_get(key, namespace=KV_NAMESPACE) is None
        except Exception:  # noqa: BLE001 - GCS unreachable for now: ask again later
            continue
        if ended and not _claimed.is_set():
            log.info("rank pre-import: run %s ended with this process unused; exiting", key)
            os._exit(0)


def switch(key: str, on: bool) -> bool:
    """Turns the background import of run `key` on or off; False when the KV was unreachable."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put  # noqa: PLC0415 - Ray-private: may not fail the hook

    try:
        if on:
            _internal_kv_put(key, b"1", overwrite=True, namespace=KV_NAMESPACE)
        else:
            _internal_kv_del(key, namespace=KV_NAMESPACE)
        return True
    except Exception as exc:  # noqa: BLE001 - an optimization
        log.warning("rank pre-import: could not switch it %s (%s: %s)", "on" if on else "off",
                    type(exc).__name__, exc)
        return False


def start_preimport(modules: tuple[str, ...] = PREIMPORT_MODULES) -> None:
    """Starts the background import (once per process)."""
    global _thread
    if _thread is not None:
        return
    for name in _NORMAL_PRIORITY_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass
    _thread = threading.Thread(target=_preimport, args=(modules,), name="rr-preimport", daemon=True)
    _thread.start()


def claim() -> float:
    """Marks the process as taken by a rank and waits for the background import; returns the
    seconds waited. An import still running is now what a recovery waits for: its thread goes
    back to the rank's priority first (at SCHED_IDLE any busy thread on the node would starve
    it), where the process may raise it (`stats["raised"]`)."""
    _claimed.set()
    thread = _thread
    if thread is None or not thread.is_alive():
        return 0.0
    t0 = time.monotonic()
    if thread.native_id is not None:
        from ray_resilience._internal.priority import restore_thread  # noqa: PLC0415 - as in _preimport

        with _priority_lock:
            stats["raised"] = stats.get("policy") in (None, "normal") or \
                restore_thread(thread.native_id)
        if not stats["raised"]:
            log.info("rank pre-import: could not raise the unfinished import's priority (no "
                     "CAP_SYS_NICE or RLIMIT_NICE); waiting for it at SCHED_IDLE")
    thread.join()
    return time.monotonic() - t0


def _preimport(modules: tuple[str, ...]) -> None:
    stats["started"] = time.time()
    t0 = time.thread_time()
    try:
        from ray_resilience._internal.priority import lower_thread  # noqa: PLC0415 - inside the try: may not fail the hook

        with _priority_lock:  # a claim that came first keeps the import at the rank's priority
            stats["policy"] = "normal" if _claimed.is_set() else lower_thread("idle")

        for name in modules:
            importlib.import_module(name)
        from ray_resilience._internal.process_groups.teardown import freeze_startup_objects  # noqa: PLC0415 - torch: on the idle-priority thread

        freeze_startup_objects(collect=False)  # as the actor's prewarm would, right after imports
    except BaseException as exc:  # noqa: BLE001 - see the module docstring
        stats["error"] = f"{type(exc).__name__}: {exc}"
        log.warning("rank pre-import stopped (%s); the actor imports what it needs itself",
                    stats["error"])
    finally:
        stats["seconds"] = time.thread_time() - t0
        stats["ended"] = time.time()
