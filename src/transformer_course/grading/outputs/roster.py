"""The class roster: who is enrolled, and the LMS id of a student whose notebook came without one.

    python -m transformer_course.grading.batch DOWNLOADS --roster roster.csv

A sheet the instructor keeps (CSV in any spreadsheet's dialect, or .xlsx), one row per student:

    name,email,lms_id,sis_user_id,sis_login_id,section
    Ada Lovelace,ada@example.org,12345,S-001,alovelace,Section A
    Bo Chen,bo@example.org,12346,,,

`lms_id` is the student's Canvas user id (the `ID` column of Canvas's gradebook export); `name` is the name
as the downloads folder writes it (the folder or file name a notebook that came by email or on a USB stick was
put under), `email` an address such a folder may be named by instead. The other columns are optional and fill
the Canvas files' columns of the same name when Canvas's export is not given. An optional `lms` column says
`canvas` (the default) or `moodle`: Moodle numbers participants per assignment, so a Moodle roster maps a name
only to the participant of one assignment's download.

A notebook whose folder or file names no LMS id and whose name (exactly as written) or email (letter case
ignored) is the roster's is that student's: it joins their LMS submissions (one student, one row per stage)
and the LMS files name them. The roster also says who is in the class: the report lists, per stage, the
enrolled students with no submission.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformer_course.grading.intake.identities import Identity, readable
from transformer_course.grading.outputs.spreadsheet import SheetError, read_sheet

COLUMNS = ("name", "email", "lms_id", "lms", "sis_user_id", "sis_login_id", "section")


class RosterError(ValueError):
    """The roster cannot be used as written; the message names the file and row."""


@dataclass(frozen=True)
class Person:
    name: str
    email: str
    lms_id: str
    lms: str = "canvas"
    sis_user_id: str = ""
    sis_login_id: str = ""
    section: str = ""


class Roster:
    def __init__(self, people: list[Person], path: Path | None = None) -> None:
        self.people, self.path = people, path
        self.by_name = {person.name: person for person in people if person.name}
        self.by_email = {person.email.casefold(): person for person in people if person.email}
        self.by_id = {person.lms_id: person for person in people if person.lms_id}

    @classmethod
    def load(cls, path: Path) -> Roster:
        try:
            rows = read_sheet(path, ("lms_id",), cite=("name", "email"))
        except SheetError as error:
            raise RosterError(str(error)) from None
        people, problems, seen = [], [], {}
        for number, row in rows:
            values = {key.strip().casefold(): (value or "").strip() for key, value in row.items()}
            person = Person(**{column: values.get(column, "") for column in COLUMNS if column != "lms"},
                            lms=(values.get("lms") or "canvas").casefold())
            where = f"{path.name} row {number}"
            if not person.lms_id or not (person.name or person.email):
                problems.append(f"{where}: a row needs an lms_id and a name or an email")
            elif person.lms not in ("canvas", "moodle"):
                problems.append(f"{where}: lms {person.lms!r} is neither canvas nor moodle")
            for key in (f"name {person.name}", f"email {person.email.casefold()}", f"lms_id {person.lms_id}"):
                if key.split(" ", 1)[1] and key in seen:
                    problems.append(f"{where}: the {key.split(' ', 1)[0]} {key.split(' ', 1)[1]!r} is also in row "
                                    f"{seen[key]}: one row per student")
                seen.setdefault(key, number)
            people.append(person)
        if problems:
            raise RosterError("the roster cannot be used; fix these rows:\n  " + "\n  ".join(problems))
        return cls(people, path)

    def find(self, identity: Identity) -> Person | None:
        """The roster's row for a student the download names without an LMS id (None: not in the roster)."""
        if identity.lms_id or identity.match.startswith("raw:"):
            return None
        return self.by_name.get(identity.match) or self.by_email.get(identity.match.casefold())

    def identity(self, identity: Identity) -> tuple[Identity, str]:
        """IDENTITY as the roster names it (with the LMS id), and a note saying so ("" when unchanged)."""
        person = self.find(identity)
        if person is None:
            return identity, ""
        mapped = Identity(person.lms, person.lms_id, "", readable(person.name) or identity.name)
        return mapped, (f"named {identity.match!r} in the downloads (no LMS id): the roster's "
                        f"{person.lms.capitalize()} user {person.lms_id}")


def class_roster(class_dir: Path) -> Roster | None:
    """The roster the batch command was given for this class (CLASS/term.json), None when there is none."""
    try:
        term = json.loads((class_dir / "term.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    path = term.get("roster") if isinstance(term, dict) else None
    if not path:
        return None
    return Roster.load(Path(path))
