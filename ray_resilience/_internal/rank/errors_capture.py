"""Turning an exception on a rank into a `WorkerError` that crosses the actor boundary."""

from __future__ import annotations

import copy
import os
import pickle
import traceback
from typing import Any

from ray_resilience.errors import WorkerError

#: Frames from these files are our machinery, not the user's code: left out of tracebacks.
_OWN_FRAMES = ("ray_resilience/_internal/rank/worker.py", "ray/util/tracing/")


def _user_frames(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb is not None and any(p in tb.tb_frame.f_code.co_filename for p in _OWN_FRAMES):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def describe(exc: BaseException, rank: int, attempt: int) -> WorkerError:
    """Type, message and traceback always travel; the exception itself when it pickles."""
    try:
        # copy.copy takes the same __reduce__ path as unpickling on the other side.
        pickle.dumps(exc)
        copy.copy(exc)
        cause: BaseException | None = exc
    except Exception:  # noqa: BLE001 - the cause stays on this side; type and text travel
        cause = None
    error = WorkerError(ranks=[rank], attempt=attempt, exc_type=type(exc).__qualname__,
                        message=str(exc), traceback=_user_frames(exc), cause=cause)
    _drop_frames(exc)
    return error


DISTRIBUTED_FRAMES = f"{os.sep}torch{os.sep}distributed{os.sep}"


def raised_in_distributed(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) came out of torch.distributed code: a
    collective or the store failing, which is how a rank sees a peer's failure. Call it before
    `describe`, which drops the frames."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(c.__module__.startswith("torch.distributed") for c in type(exc).__mro__):
            return True  # DistError and its kinds (backend, network, store)
        tb = exc.__traceback__
        while tb is not None:
            if DISTRIBUTED_FRAMES in tb.tb_frame.f_code.co_filename:
                return True
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return False


def _drop_frames(exc: BaseException | None) -> None:
    """Tracebacks hold the attempt's frames (model, optimizer, device mesh): let them go."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def describe_startup(exc: BaseException) -> dict[str, Any]:
    """Why the rank's actor could not build its worker, as plain data (type, message, the
    missing module if any, traceback): the exception's own class may not unpickle elsewhere."""
    module = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    return {"exc_type": type(exc).__qualname__, "message": str(exc), "module": module,
            "traceback": "".join(traceback.format_exception(type(exc), exc,
                                                            exc.__traceback__))}
