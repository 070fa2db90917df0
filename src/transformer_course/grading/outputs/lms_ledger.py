"""The record of what was written for the LMS, and what a grade the LMS holds means against it.

CLASS/lms/uploaded.json keeps, for every LMS, stage and LMS id, every grade the command wrote into an
upload file (`values`, the last one first) and the digest of the last comment written, with the time. It is
what "the last upload" means: the files are written for the instructor to upload, so a grade written but
never uploaded is still ours, and a later run that finds the LMS holding it, or an older one of ours,
replaces it with the grade now.

`compare` reads a grade the LMS holds (from its export) against the record:
- SAME: the LMS holds the grade the course gives now: nothing to write;
- EMPTY: the LMS holds none: write it;
- OURS: the LMS holds a grade this command wrote before (a regrade, or hand grades since): write the new one;
- EDITED: the LMS holds a grade this command never wrote: someone gave or changed it in the LMS. It is kept
  and listed unless the instructor asks to replace it.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from transformer_course.grading.outputs.files import write_text_atomically
from transformer_course.grading.outputs.lms_exports import number, same

LEDGER = "uploaded.json"
SAME, EMPTY, OURS, EDITED = "same", "empty", "ours", "edited"


def digest(comment: str) -> str:
    """The comment's digest, as plain text with its spaces collapsed: Moodle's HTML and our plain text of the
    same comment give the same digest."""
    plain = html.unescape(re.sub(r"<[^>]+>", " ", comment))
    return hashlib.sha256(" ".join(plain.split()).encode("utf-8")).hexdigest()[:16] if plain.strip() else ""


@dataclass
class Sent:
    values: list[float]  # every grade written for this cell, the last one first
    comment: str  # the digest of the last comment written ("" none)
    at: str  # when it was last written


class Ledger:
    """CLASS/lms/uploaded.json: {lms: {stage: {LMS id: Sent}}}."""

    def __init__(self, entries: dict[str, dict[str, dict[str, Sent]]] | None = None) -> None:
        self.entries = entries or {}

    @classmethod
    def load(cls, folder: Path) -> Ledger:
        """The record in FOLDER (empty when there is none yet)."""
        try:
            data = json.loads((folder / LEDGER).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as error:
            raise ValueError(f"{folder / LEDGER} cannot be read ({error}): move it away to start a new record "
                             "(every grade the LMS holds then counts as edited in the LMS)") from None
        return cls({lms: {stage: {who: Sent([float(v) for v in sent.get("values", [])], sent.get("comment", ""),
                                             sent.get("at", ""))
                                  for who, sent in people.items()}
                          for stage, people in stages.items()}
                    for lms, stages in data.get("uploads", {}).items()})

    def get(self, lms: str, stage: str, who: str) -> Sent | None:
        return self.entries.get(lms, {}).get(stage, {}).get(who)

    def record(self, lms: str, stage: str, who: str, value: float | None = None, comment: str | None = None,
               at: datetime | None = None) -> None:
        """Note that VALUE (and COMMENT's digest, when given) was written for this cell."""
        sent = self.entries.setdefault(lms, {}).setdefault(stage, {}).setdefault(who, Sent([], "", ""))
        if value is not None:
            sent.values = [round(value, 2), *(v for v in sent.values if not same(v, value))]
        if comment is not None:
            sent.comment = digest(comment)
        sent.at = (at or datetime.now()).isoformat(timespec="seconds")

    def save(self, folder: Path) -> Path:
        uploads = {lms: {stage: {who: {"values": sent.values, "comment": sent.comment, "at": sent.at}
                                 for who, sent in sorted(people.items())}
                         for stage, people in sorted(stages.items())}
                   for lms, stages in sorted(self.entries.items())}
        text = json.dumps({"about": "grades written into the LMS upload files, per LMS, stage and LMS id (the last "
                                    "one first); see grading/outputs/lms_ledger.py", "uploads": uploads}, indent=1)
        return write_text_atomically(folder / LEDGER, text + "\n")


def compare(ours: float, held: str | None, sent: Sent | None) -> str:
    """SAME, EMPTY, OURS or EDITED: what the grade the LMS holds (HELD, as exported) is, against the course's
    grade now (OURS) and what this command wrote before (SENT)."""
    if held is None or not held.strip() or held.strip() == "-":
        return EMPTY
    value = number(held)
    if same(value, ours):
        return SAME
    if value is not None and sent is not None and any(same(value, old) for old in sent.values):
        return OURS
    return EDITED
