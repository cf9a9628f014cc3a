"""Names inside `<run_dir>/checkpoints/` (`step_<step>_<session>/`, `__<rank>_0.distcp`,
`__<rank>_extra.json`, `__<rank>_items.json`, `.metadata`, `manifest.json`), and the checks that
keep anything read from storage inside it (docs/design.md, section 7).
"""

from __future__ import annotations

import dataclasses
import re

from ray_resilience.checkpoint.errors import UnsafeCheckpointError

CHECKPOINTS_DIR = "checkpoints"
MANIFEST_NAME = "manifest.json"
METADATA_NAME = ".metadata"
FORMAT_VERSION = "ray_resilience.checkpoint/1"

_STEP_DIR = re.compile(r"^step_(\d{12,19})_([0-9a-f]{16})$")
_SESSION = re.compile(r"^[0-9a-f]{16}$")
_DATA_FILE = re.compile(r"^__(\d{1,7})_0\.distcp$")
_EXTRA_FILE = re.compile(r"^__(\d{1,7})_extra\.json$")
_ITEMS_FILE = re.compile(r"^__(\d{1,7})_items\.json$")
MAX_STEP = 10**19 - 1


@dataclasses.dataclass(frozen=True, order=True)
class StepDir:
    """One step folder, parsed from its name. Ordered by (step, session)."""

    step: int
    session: str

    @property
    def name(self) -> str:
        return step_dir_name(self.step, self.session)


def check_session(session: str) -> str:
    if not isinstance(session, str) or not _SESSION.match(session):
        raise UnsafeCheckpointError(repr(session), "a session id must be 16 lowercase hex digits")
    return session


def step_dir_name(step: int, session: str) -> str:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        raise ValueError(f"checkpoint step={step!r} must be an integer in [0, {MAX_STEP}]")
    return f"step_{step:012d}_{check_session(session)}"


def parse_step_dir(name: str) -> StepDir | None:
    """The step folder a listed name denotes, or None for anything else (ignored, never joined)."""
    match = _STEP_DIR.match(name)
    if match is None:
        return None
    return StepDir(int(match.group(1)), match.group(2))


def data_file_name(rank: int) -> str:
    return f"__{int(rank)}_0.distcp"


def extra_file_name(rank: int) -> str:
    return f"__{int(rank)}_extra.json"


def items_file_name(rank: int) -> str:
    """The CRC-32C of each item of a rank's data file, for reads of only part of it."""
    return f"__{int(rank)}_items.json"


def check_file_name(name: str, *, where: str) -> str:
    """`name` if it is a plain file name a step folder may hold; UnsafeCheckpointError for
    anything else, so storage content never steers a read outside the step folder."""
    if isinstance(name, str) and (name in (METADATA_NAME, MANIFEST_NAME)
                                  or _DATA_FILE.match(name) or _EXTRA_FILE.match(name)
                                  or _ITEMS_FILE.match(name)):
        return name
    raise UnsafeCheckpointError(where, f"refers to {name!r}, which is not a checkpoint file name "
                                       "(possible tampering; the name would leave the step folder)")


def file_rank(name: str) -> int | None:
    """The rank a data or extra file belongs to, or None for shared files."""
    match = _DATA_FILE.match(name) or _EXTRA_FILE.match(name) or _ITEMS_FILE.match(name)
    return int(match.group(1)) if match else None
