"""A sweep's journal: every finished run appended as one JSON line, so a sweep that stops (a
deadline, a session's end, a crash) resumes where it stopped instead of starting over.

A size's sweep at ~1 GB per rank takes hours on the 2-core machine; with the journal it can run
across several sittings. The first line holds the sweep's settings; resuming with different ones
is refused, naming the setting. Each run line holds the run's record (timeline included), when
it ended and in which sitting; each sitting line the commit its runs used, so the result
document says how the sweep was split and on which code.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from .results import _plain

SETTINGS_ADDED_LATER = {"ref_reps": 1}
"""Settings a journal written before they existed lacks, at the value they had then."""


class SweepPaused(Exception):
    """The deadline passed between two runs: what ran is in the journal; resume to go on."""

    def __init__(self, journal: str, done: int) -> None:
        super().__init__(f"stopped at the deadline after {done} runs; the journal {journal} "
                         "keeps them: rerun the same command with --resume to go on")
        self.journal, self.done = journal, done


class JournalMismatch(ValueError):
    """A resume whose settings differ from the journal's."""


class Journal:
    """Runs by key (the run folder's name, unique and in order within a sweep)."""

    def __init__(self, path: str, settings: dict[str, Any], *, resume: bool) -> None:
        self.path = path
        self.runs: dict[str, dict[str, Any]] = {}
        self.sittings: list[dict[str, Any]] = []
        exists = os.path.exists(path)
        if exists and not resume:
            raise JournalMismatch(
                f"{path} exists: a sweep with this --work already ran (part of) this size; pass "
                "--resume to go on with it, or choose another --work")
        if resume and not exists:
            raise JournalMismatch(f"--resume: {path} does not exist; nothing to resume (run "
                                  "without --resume to start this size)")
        if exists:
            self._load(settings)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._append({"settings": settings})
        self.sitting = len(self.sittings)
        self.sittings.append({"started": time.time(), "ended": None, "runs": 0,
                              "commit": checkout_commit()})
        self._append({"sitting": self.sitting, "started": self.sittings[-1]["started"],
                      "commit": self.sittings[-1]["commit"]})

    def _load(self, settings: dict[str, Any]) -> None:
        lines = []
        with open(self.path, encoding="utf-8") as f:
            text = f.read()
        for n, line in enumerate(text.splitlines()):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                if n < len(text.splitlines()) - 1 or text.endswith("\n"):
                    raise JournalMismatch(f"{self.path}: line {n + 1} is not JSON") from None
                # the sweep was killed while appending its last run: that run runs again
                with open(self.path, "w", encoding="utf-8") as f:
                    f.write(text[:len(text) - len(line)])
        saved = lines[0].get("settings") if lines else None
        if saved is None:
            raise JournalMismatch(f"{self.path} has no settings line; it is not a sweep journal")
        saved = {**SETTINGS_ADDED_LATER, **saved}
        for key in sorted(set(saved) | set(settings)):
            if saved.get(key) != _jsonable(settings.get(key)):
                raise JournalMismatch(
                    f"--resume: {key} is {settings.get(key)!r} but the journal {self.path} was "
                    f"written with {saved.get(key)!r}; resume with the same settings")
        for line in lines[1:]:
            if "sitting" in line:
                self.sittings.append({"started": line["started"], "ended": None, "runs": 0,
                                      "commit": line.get("commit")})
            elif "key" in line:
                self.runs[line["key"]] = line["record"]
                self.sittings[line["in_sitting"]]["ended"] = line["ended"]
                self.sittings[line["in_sitting"]]["runs"] += 1
        missing = [r["run_dir"] for r in self.runs.values() if not os.path.isdir(r["run_dir"])]
        if missing:
            raise JournalMismatch(
                f"--resume: run folders of the journal are gone ({missing[0]} and "
                f"{len(missing) - 1} more); the bit-equality checks need them: resume with the "
                "same --work on the same machine, or start over")

    def get(self, key: str) -> dict[str, Any] | None:
        record = self.runs.get(key)
        return None if record is None else json.loads(json.dumps(record))

    def add(self, key: str, record: dict[str, Any]) -> None:
        ended = time.time()
        self._append({"key": key, "in_sitting": self.sitting, "ended": ended, "record": record})
        self.runs[key] = json.loads(json.dumps(record, default=_plain))
        self.sittings[self.sitting]["ended"] = ended
        self.sittings[self.sitting]["runs"] += 1

    def duration_s(self) -> float:
        """Wall time of the sittings, each from its start to its last finished run."""
        return sum(s["ended"] - s["started"] for s in self.sittings if s["ended"])

    def summary(self) -> list[dict[str, Any]]:
        """The sittings as the result document lists them (UTC times)."""
        def utc(t: float | None) -> str | None:
            return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        return [{"started_utc": utc(s["started"]), "last_run_ended_utc": utc(s["ended"]),
                 "runs": s["runs"], "commit": s["commit"]} for s in self.sittings if s["runs"]]

    def _append(self, line: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True, default=_plain) + "\n")
            f.flush()
            os.fsync(f.fileno())


def checkout_commit(repo: str | None = None) -> str | None:
    """The commit of checkout `repo` (default: this one, which the runs of this sitting use),
    with "+dirty" for local edits."""
    repo = repo or os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head.strip() + ("+dirty" if dirty.strip() else "")


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=_plain))
