"""Names inside `<run_dir>/checkpoints/` (`step_<step>_<session>/`, `__<rank>_0.distcp`,
`__<rank>_extra.json`, `__<rank>_items.json`, `.metadata`, `manifest.json`), and the checks that
keep anything read from storage inside it (docs/design.md, section 7).
"""

from __future__ import annotations

import dataclasses
import re
import secrets

from ray_resilience.checkpoint.errors import UnsafeCheckpointError

CHECKPOINTS_DIR = "checkpoints"
MANIFEST_NAME = "manifest.json"
METADATA_NAME = ".metadata"
FORMAT_VERSION = "ray_resilience.checkpoint/2"
READABLE_FORMATS = ("ray_resilience.checkpoint/1", FORMAT_VERSION)
"""Manifests this version reads: /1 lists a CRC32 per file, /2 the checksum it names (CRC-32C
when the `crc32c` package is there)."""

_STEP_DIR = re.compile(r"step_(\d{12,19})_([0-9a-f]{16})")
_SESSION = re.compile(r"[0-9a-f]{16}")
_DATA_FILE = re.compile(r"__(\d{1,7})_0\.distcp")
_EXTRA_FILE = re.compile(r"__(\d{1,7})_extra\.json")
_ITEMS_FILE = re.compile(r"__(\d{1,7})_items\.json")
MAX_STEP = 10**19 - 1
MAX_GENERATION = 16**5 - 1
"""A session id is 5 hex digits of lease generation, 9 of sequence within it, 2 random."""


@dataclasses.dataclass(frozen=True, order=True)
class StepDir:
    """One step folder, parsed from its name. Ordered by (step, session)."""

    step: int
    session: str

    @property
    def name(self) -> str:
        return step_dir_name(self.step, self.session)


def check_session(session: str) -> str:
    if not isinstance(session, str) or not _SESSION.fullmatch(session):
        raise UnsafeCheckpointError(repr(session), "a session id must be 16 lowercase hex digits")
    return session


def step_dir_name(step: int, session: str) -> str:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        raise ValueError(f"checkpoint step={step!r} must be an integer in [0, {MAX_STEP}]")
    return f"step_{step:012d}_{check_session(session)}"


def parse_step_dir(name: str) -> StepDir | None:
    """The step folder a listed name denotes, or None for anything else (ignored, never joined)."""
    match = _STEP_DIR.fullmatch(name)
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
                                  or _DATA_FILE.fullmatch(name) or _EXTRA_FILE.fullmatch(name)
                                  or _ITEMS_FILE.fullmatch(name)):
        return name
    raise UnsafeCheckpointError(where, f"refers to {name!r}, which is not a checkpoint file name "
                                       "(possible tampering; the name would leave the step folder)")


def file_rank(name: str) -> int | None:
    """The rank a data or extra file belongs to, or None for shared files."""
    match = _DATA_FILE.fullmatch(name) or _EXTRA_FILE.fullmatch(name) or _ITEMS_FILE.fullmatch(name)
    return int(match.group(1)) if match else None


def make_session(generation: int, seq: int) -> str:
    """A session id of lease `generation` whose place among that generation's sessions is `seq`."""
    if not 0 <= generation <= MAX_GENERATION:
        raise ValueError(f"lease generation {generation} is outside [0, {MAX_GENERATION}]")
    return f"{generation:05x}{seq % 16**9:09x}{secrets.randbits(8):02x}"


def session_generation(session: str) -> int:
    return int(session[:5], 16)


def session_order(session: str) -> tuple[int, int]:
    """(lease generation, sequence): a later session of a run compares greater."""
    return int(session[:5], 16), int(session[5:14], 16)


def timeline_key(step_dir: StepDir, generation: int | None = None) -> tuple[int, int, int]:
    """Where a step folder sits on the run's timeline: (lease generation, session sequence, step),
    so a resumed attempt's commits follow the ones it abandoned whatever their step. A folder of a
    generation above `generation` (the newest one known) predates these session ids: it sorts
    by step before every other."""
    gen, seq = session_order(step_dir.session)
    if generation is not None and gen > generation:
        return (-1, 0, step_dir.step)
    return (gen, seq, step_dir.step)
