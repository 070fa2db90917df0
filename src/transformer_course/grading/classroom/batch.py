"""Grade a whole class with one command.

    python -m transformer_course.grading.batch SUBMISSIONS [--class-dir DIR] [--jobs N] [--force]

SUBMISSIONS is the folder of notebooks as downloaded from Colab or an LMS (see
`transformer_course.grading.intake.submissions` for the layouts understood). For every student this

1. checks each notebook (JSON, nbformat, nbgrader cells) and repairs it from the release when
   metadata was stripped or graded cells deleted, or rejects it with a reason;
2. autogrades it with real nbgrader, each kernel sandboxed (no network, no other students'
   files, no hidden tests, no gradebook; memory and time limits), N students at a time;
3. writes per-student HTML feedback without hidden tests;

then writes DIR/scores.csv (per-cell and total scores, status and reasons) and prints a summary.
The folder is merged into the class folder's term: a notebook graded before from identical bytes is not
graded again, so an interrupted run resumes where it stopped and a week's download adds to the term;
--regrade STUDENT[/STAGE] grades one student's notebooks of the folder again, --force every notebook of it.
For a class too big for one machine, give every machine the
same --db-url (e.g. a PostgreSQL URL) and its own --shard K/N, or `--shard slurm` / `kubernetes` /
`auto` in a scheduler's job array (see the instructor's guide, website/instructor/cluster.md).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import importlib
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath

import nbformat
from tqdm.auto import tqdm

from transformer_course.authoring import assignments as course_assignments
from transformer_course.authoring import release_tag
from transformer_course.data import multi30k, token_cache
from transformer_course.grading.classroom import GRADER_WORK, NOTEBOOK_TIMEOUT, SANDBOX_PROBLEM
from transformer_course.grading.classroom.releases import Environment, Releases, differences, merge, note_cell
from transformer_course.grading.gradebook import term
from transformer_course.grading.gradebook.class_folder import Classroom, gradebook_lock
from transformer_course.grading.gradebook.config import ROOT
from transformer_course.grading.intake.identities import Identity, lookalike_notes, student_ids
from transformer_course.grading.intake.submissions import (
    Found,
    Handed,
    Limits,
    Release,
    Submission,
    discover,
    download_root,
    flag_shared_files,
    load,
    other_file,
    printable,
    shared_file_flags,
)
from transformer_course.grading.outputs import answers, deadlines, hand_grades, report, similarity
from transformer_course.grading.outputs.files import replace_atomically, write_text_atomically
from transformer_course.grading.outputs.roster import Roster, RosterError
from transformer_course.grading.outputs.scores import scored as row_scored
from transformer_course.grading.outputs.spreadsheet import EXCEL_BOM, protect
from transformer_course.grading.sandbox import hidden_inputs
from transformer_course.grading.sandbox.isolation import bubblewrap_problem


@dataclass
class StudentResult:
    student: str  # the path-safe student id (gradebook, folders, records)
    submissions: list[Submission] = field(default_factory=list)
    status: str = "pending"  # graded | skipped (already graded) | rejected | failed
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    name: str = ""  # as the LMS or the folder wrote it, any script
    lms_id: str = ""  # the LMS's id for the student, when the download names one
    lms: str = ""  # which LMS the id is of ("canvas", "moodle"; "" none)
    identity: Identity | None = None
    to_grade: list[str] = field(default_factory=list)  # the stages of this folder graded in this run (new, changed)
    rejected: list[Submission] = field(default_factory=list)  # this folder's files that cannot be graded
    changed: bool = False  # the record gained a note without a grading (an older notebook not graded)
    record: term.Record | None = None  # what the class folder remembers of the student (`BatchGrader.plan`)


def term_identity(record: term.Record) -> Identity:
    """The identity a record was written for (the student keeps their id all term)."""
    return Identity(record.identity.get("lms", ""), record.identity.get("lms_id", ""),
                    record.identity.get("match", ""), record.identity.get("name", ""))


def fingerprint(submissions: list[Submission]) -> str:
    """The files' names and the bytes that were checked (never read again: a file may change or vanish)."""
    digest = hashlib.sha256()
    for submission in sorted(submissions, key=lambda s: s.relative):
        digest.update(os.fsencode(submission.path.name) + submission.digest.encode())
    return digest.hexdigest()


def in_shard(student: str, shard: tuple[int, int] | None) -> bool:
    if shard is None:
        return True
    index, count = shard
    return int(hashlib.sha256(student.encode()).hexdigest(), 16) % count == index - 1


def scheduler_shard(kind: str, environment: dict[str, str] | os._Environ) -> tuple[int, int] | None:
    """(K, N) of this task of a scheduler's job array, read from the scheduler's own variables.

    slurm: SLURM_ARRAY_TASK_ID within SLURM_ARRAY_TASK_MIN..MAX by SLURM_ARRAY_TASK_STEP, of
    SLURM_ARRAY_TASK_COUNT tasks (ids may start at 0, 1 or anywhere; the range must be contiguous).
    kubernetes: JOB_COMPLETION_INDEX (0-based) of an Indexed Job, with JOB_COMPLETIONS (the Job's
    spec.completions, which Kubernetes does not pass to the pod: the manifest sets it).
    auto: whichever of the two is there; None (the whole class) outside any job array."""
    if kind == "auto":
        kind = ("slurm" if "SLURM_ARRAY_TASK_ID" in environment else
                "kubernetes" if "JOB_COMPLETION_INDEX" in environment else "")
        if not kind:
            return None

    def number(name: str, default: int | None = None) -> int:
        value = environment.get(name)
        if value is None and default is not None:
            return default
        try:
            return int(str(value))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--shard {kind} needs ${name} (an integer), found {value!r}") from None

    if kind == "slurm":
        task, count, first = (number(name) for name in (
            "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"))
        step = number("SLURM_ARRAY_TASK_STEP", 1)
        last = number("SLURM_ARRAY_TASK_MAX", first + (count - 1) * step)
        position, off_step = divmod(task - first, step) if step > 0 else (-1, 1)
        if off_step or not 0 <= position < count or (last - first) // step + 1 != count:
            raise argparse.ArgumentTypeError(
                f"--shard slurm: task {task} of an array {first}-{last}:{step} with {count} tasks is not a "
                "contiguous range; submit it with --array=A-B or --array=A-B:S (a %limit is fine)")
        return position + 1, count
    if kind == "kubernetes":
        index = number("JOB_COMPLETION_INDEX")
        if "JOB_COMPLETIONS" not in environment:
            raise argparse.ArgumentTypeError("--shard kubernetes needs $JOB_COMPLETIONS, the Job's spec.completions "
                                             "(set it in the pod's env; Kubernetes does not)")
        count = number("JOB_COMPLETIONS")
        if not 0 <= index < count:
            raise argparse.ArgumentTypeError(f"--shard kubernetes: index {index} is not in 0..{count - 1}")
        return index + 1, count
    raise argparse.ArgumentTypeError(f"unknown scheduler {kind!r}")


def collect(folder: Path, release: Release, limits: Limits | None = None, known: dict[Identity, str] | None = None,
            flag_copies: bool = True, roster: Roster | None = None,
            times: deadlines.SubmissionTimes | None = None) -> dict[str, StudentResult]:
    """Every student in the folder with their checked notebooks (one per assignment, the newest: by the
    LMS's time, else Canvas's file number, else the file time, `deadlines.newer_key`).

    Nothing in the folder stops this and every file is accounted for: a notebook is a submission,
    rejected with the reason when it cannot be graded; another file is named on its student's rows,
    and a student with no notebook at all gets a rejected row naming their files. Students are told
    apart by LMS id, else by their exact name (see `identities`); a name without an LMS id that the
    ROSTER has is that student's LMS id. KNOWN: the students the class folder knows from earlier weeks, who
    keep their ids. FLAG_COPIES: flag files handed in by several students of this folder (the batch command
    flags them across the whole term instead, when it writes the scores)."""
    found = discover(folder)
    submissions = [load(release, item, limits) if item.notebook else other_file(release, item) for item in found]
    mapped: dict[int, str] = {}
    for submission in submissions if roster is not None else ():
        if submission.identity is not None:
            submission.identity, note = roster.identity(submission.identity)
            if note:
                mapped[id(submission)] = note
    identities = [submission.identity for submission in submissions if submission.identity]
    ids = student_ids(identities, known)
    notes = lookalike_notes([*identities, *(known or {})], {**(known or {}), **ids})
    students: dict[str, StudentResult] = {}
    others: dict[str, list[Submission]] = {}
    for submission in submissions:
        assert submission.identity is not None  # load always names the student
        submission.student = ids[submission.identity]
        result = students.get(submission.student)
        if result is None:
            result = students[submission.student] = StudentResult(
                submission.student, name=submission.identity.name, lms_id=submission.identity.lms_id,
                lms=submission.identity.lms, identity=submission.identity,
                reasons=list(notes.get(submission.identity, [])))
        if id(submission) in mapped and mapped[id(submission)] not in result.reasons:
            result.reasons.append(mapped[id(submission)])
        if submission.status == "other":
            others.setdefault(submission.student, []).append(submission)
            continue
        same = [s for s in result.submissions if s.assignment and s.assignment == submission.assignment]
        if same:
            newest = max([*same, submission], key=lambda s: deadlines.newer_key(s, times))
            older = same[0] if newest is submission else submission
            result.reasons.append(f"{submission.assignment}: two notebooks, graded the newer "
                                  f"{printable(newest.relative)}, ignored {printable(older.relative)}")
            if newest is submission:
                result.submissions.remove(same[0])
                result.submissions.append(submission)
            continue
        result.submissions.append(submission)
    for student, files in others.items():
        _name_other_files(students[student], files)
    if flag_copies:
        flag_shared_files([s for result in students.values() for s in result.submissions])
    return students


def _name_other_files(result: StudentResult, files: list[Submission]) -> None:
    """Files that are not notebooks, on the student's rows; a student with no notebook gets a row of
    its own for them, rejected with the reason."""
    names = ", ".join(printable(file.relative) for file in files[:5])
    names += f" and {len(files) - 5} more" if len(files) > 5 else ""
    if result.submissions:
        result.reasons.append(f"also handed in, not graded (only notebooks are): {names}")
        return
    first = files[0]
    first.status = "rejected"
    first.reasons = [f"no notebook (.ipynb) among the files handed in: {names}; only notebooks are graded "
                     "(archives are not unpacked, and Jupyter's .ipynb_checkpoints copies are not graded)"]
    result.submissions.append(first)


class BatchGrader:
    def __init__(self, course: Path, class_dir: Path, submissions: Path, *, jobs: int = 2, force: bool = False,
                 db_url: str | None = None, shard: tuple[int, int] | None = None, timeout: int = 120,
                 memory_gb: float = 6.0, sandbox: bool = True, assignment_ids: list[str] | None = None,
                 require_sandbox: bool = False, limits: Limits | None = None,
                 sandbox_per_notebook: bool = False, secret_file: Path | None = None,
                 require_data: bool = False, regrade: list[str] | None = None, roster: Path | None = None,
                 deadlines_file: Path | None = None, submission_times: list[Path] | None = None,
                 notebook_timeout: int = NOTEBOOK_TIMEOUT) -> None:
        self.course, self.class_dir, self.submissions = course.resolve(), class_dir.resolve(), submissions.resolve()
        self.secret_file = hidden_inputs.secret_path(secret_file).resolve()  # the hidden inputs' secret
        self.require_data = require_data  # no Multi30k for a graded stage that reads it: nobody is graded
        self.jobs, self.force, self.shard, self.timeout, self.memory_gb = jobs, force, shard, timeout, memory_gb
        self.notebook_timeout = notebook_timeout  # one deadline per notebook: its cells, replays and hidden parts
        self.sandbox, self.require_sandbox = sandbox, require_sandbox
        self.sandbox_per_notebook = sandbox_per_notebook  # the design of 2026-11-25 evening (see the worker)
        self.limits = limits or Limits()  # how much of a file intake reads (tests lower them)
        self.assignment_ids = assignment_ids or course_assignments(self.course)
        self.classroom = Classroom(self.course, self.class_dir, database_url=db_url)
        self.db_url = self.classroom.db_url
        self.records = self.class_dir / "records"
        self.data_folder: str | None = None  # Multi30k for the kernels, set by prepare()
        self.tokens_folder: str | None = None  # Multi30k tokenised once for the kernels, set by prepare()
        self.start_up: Future[str | None] | None = None  # the start-up test (start_up_test)
        self.start_up_lock = threading.Lock()
        self.importing: threading.Thread | None = None  # nbgrader imported while the first workers start
        self.release: Release | None = None  # the class's release notebooks, read by run()
        self.run_stamp = ""  # when this run started (the records' entries say which run read a file)
        self.regrade = list(regrade or [])  # --regrade STUDENT[/STAGE]: graded again though their files did not change
        self.term_files = self.term_settings(roster, deadlines_file, submission_times)
        self.roster: Roster | None = None
        self.deadlines: deadlines.Deadlines | None = None
        self.times: deadlines.SubmissionTimes | None = None
        self.running = release_tag(self.course)  # the release this checkout grades with ("v0.2.0")
        self.releases = Releases(self.course, self.class_dir)  # notebooks of other releases (classroom.releases)
        self.graded_with: dict[tuple[str, str], Environment] = {}  # (student, stage) -> the release it is graded with
        self.regrading: dict[str, set[str] | None] = {}  # --regrade: {student: the stages (None: all)}, set by run()

    # --- the term's files: roster, deadlines, submission times ---------------------------------------------

    TERM = "term.json"  # in the class folder: where the instructor's roster and deadlines file are

    def term_settings(self, roster: Path | None, deadlines_file: Path | None,
                      submission_times: list[Path] | None) -> dict[str, object]:
        """The roster and deadlines files of this class: as given, else as an earlier run of this class folder
        recorded them (CLASS/term.json), so week 2 needs no option week 1 had. Submission times belong to one
        download and are never remembered."""
        try:
            saved = json.loads((self.class_dir / self.TERM).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        saved = saved if isinstance(saved, dict) else {}
        files = {"roster": str(roster.resolve()) if roster else saved.get("roster"),
                 "deadlines": str(deadlines_file.resolve()) if deadlines_file else saved.get("deadlines"),
                 "submission_times": [str(path.resolve()) for path in submission_times or []]}
        for key, given in (("roster", roster), ("deadlines", deadlines_file)):
            if files[key] and not given:
                print(f"using the {key} file of this class folder: {files[key]} (recorded in {self.TERM})", flush=True)
        return files

    def read_term(self) -> None:
        """Read the roster, deadlines and times files (GradingUnavailable, naming the file and entry, when one
        cannot be used), and record where the first two are."""
        try:
            if self.term_files["roster"]:
                self.roster = Roster.load(Path(str(self.term_files["roster"])))
            if self.term_files["deadlines"]:
                self.deadlines = deadlines.Deadlines.load(Path(str(self.term_files["deadlines"])))
                self.deadlines.check_stages(course_assignments(self.course))
            times = [Path(path) for path in self.term_files["submission_times"]]  # type: ignore[union-attr]
            if times:
                zone = self.deadlines.zone if self.deadlines else deadlines.Deadlines().zone
                self.times = deadlines.SubmissionTimes.load(times, zone)
        except (RosterError, deadlines.DeadlineError) as error:
            raise GradingUnavailable(str(error)) from None
        if self.term_files["roster"] or self.term_files["deadlines"]:
            self.class_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomically(self.class_dir / self.TERM, json.dumps(
                {"about": "the files of this class's term, used again by later runs (website/instructor/lms.md)",
                 "roster": self.term_files["roster"], "deadlines": self.term_files["deadlines"]}, indent=1) + "\n")

    def regrade_targets(self, everyone: dict[str, StudentResult]) -> dict[str, set[str] | None]:
        """{student: the stages to grade again (None: all)} for --regrade STUDENT[/STAGE] (a student named by id,
        LMS id or name as scores.csv has them); GradingUnavailable names what matches nobody."""
        targets: dict[str, set[str] | None] = {}
        unknown = []
        for item in self.regrade:
            who, stage = (item.split("/", 1) + [""])[:2]  # STUDENT or STUDENT/STAGE
            matches = [result.student for result in everyone.values() if who in (result.student, result.lms_id,
                                                                                    result.name)
                       and (not stage or any(s.assignment == stage for s in result.submissions))]
            if not matches or (stage and stage not in self.assignment_ids):
                unknown.append(item)
                continue
            for student in matches:
                if stage and targets.get(student, set()) is not None:
                    targets.setdefault(student, set()).add(stage)  # type: ignore[union-attr]
                else:
                    targets[student] = None
        if unknown:
            raise GradingUnavailable("--regrade " + ", ".join(map(repr, unknown)) + " names no student of this "
                                     "download (a student id, LMS id or name as scores.csv has it), no notebook of "
                                     "theirs in it, or no stage ("
                                     + ", ".join(self.assignment_ids) + "); nobody was graded")
        return targets

    # --- steps ----------------------------------------------------------------------------------

    def prepare(self, data: bool = True) -> list[str]:
        """Register the assignments once (again only when the source notebooks changed); with `data`, fetch
        Multi30k for every registered stage that reads it (`run` fetches it for the stages it grades only)."""
        assignment_ids = self.assignment_ids
        stamp = hashlib.sha256(b"".join(
            (self.course / "solutions" / a / f"{a}.ipynb").read_bytes() for a in assignment_ids)).hexdigest()
        marker = self.class_dir / "release" / ".source-sha256"
        # --force regenerates the release too, except in a shard: the other machines are grading from it
        force = self.force and self.shard is None

        def current() -> bool:
            return not force and marker.exists() and marker.read_text() == stamp

        if not current():
            with gradebook_lock(self.db_url, self.class_dir):  # machines sharing the class folder: one does it
                if not current():
                    pinned = self.class_dir / "release" / ".release"
                    before = pinned.read_text(encoding="utf-8").strip() if pinned.is_file() else ""
                    self.classroom.register(assignment_ids)
                    marker.write_text(stamp)
                    pinned.write_text(self.running + "\n", encoding="utf-8")
                    if before and before != self.running:
                        print(f"the class's release changes from {before} to {self.running} (this checkout): "
                              f"notebooks of {before} are graded with {before}'s checks where that release is "
                              "available (website/instructor/releasing.md)", flush=True)
        if data:
            self.data_folder = self.provide_data(assignment_ids)
        return assignment_ids

    def own_releases(self, students: list[StudentResult]) -> None:
        """Each notebook of another release than this checkout's: graded with its own release when that release
        is available and its graded cells are the class's (`classroom.releases`); else with this one's, and its
        row and feedback page say so (the report lists it under "another release")."""
        for result in students:
            for index, submission in enumerate(result.submissions):
                tag, assignment = submission.release, submission.assignment
                if not tag or tag == self.running or assignment not in result.to_grade or submission.notebook is None:
                    continue
                environment = self.releases.environment(tag, self.assignment_ids)
                if isinstance(environment, Environment):
                    theirs = nbformat.read(environment.class_dir / "release" / assignment / f"{assignment}.ipynb", 4)
                    ours = nbformat.read(self.class_dir / "release" / assignment / f"{assignment}.ipynb", 4)
                    why = "; ".join(differences(ours, theirs)[:4])
                    why = f"its graded cells differ from {self.running}'s ({why})" if why else ""
                else:
                    why = f"which is not available here ({environment})"
                if why:
                    submission.notebook.cells.insert(1, note_cell(tag, self.running))
                    result.reasons.append(f"{assignment}: from release {tag}, {why}: graded with {self.running}'s "
                                          "checks, which may differ from the ones the notebook ran: review it")
                    continue
                assert isinstance(environment, Environment)
                found = Found(submission.path, PurePosixPath(submission.relative))
                again = load(Release(environment.class_dir / "release", [assignment]), found, self.limits)
                again.student, again.identity = submission.student, submission.identity
                result.submissions[index] = again
                self.graded_with[result.student, assignment] = environment
                result.reasons.append(f"{assignment}: from release {tag} (this class is graded with "
                                      f"{self.running}): graded with {tag}'s checks")

    def readers_of_data(self, assignment_ids: list[str]) -> list[str]:
        """The stages among `assignment_ids` whose notebooks read Multi30k while graded (stages 0 and 5-7: their
        grading runs load it directly or through the translation helpers)."""
        readers = ("transformer_course.data.multi30k", "transformer_course.reference.translation")
        return [a for a in assignment_ids if any(reader in (self.course / "solutions" / a / f"{a}.ipynb").read_text(
            encoding="utf-8") for reader in readers)]

    def provide_data(self, assignment_ids: list[str]) -> str | None:
        """The Multi30k folder for the notebooks of `assignment_ids` that read it, fetched here: the sandboxed
        kernels have no network. None when none of them reads it; when it cannot be had, a warning (or, with
        `require_data`, GradingUnavailable) that names the stages and MULTI30K_DIR."""
        needing = self.readers_of_data(assignment_ids)
        if not needing:
            return None
        try:
            paths = [multi30k.file_path(split, language)
                     for split in multi30k.SPLITS for language in multi30k.LANGUAGES]
        except (multi30k.DataUnavailable, multi30k.ChecksumMismatch) as error:
            cause = str(error).split(". ")[0].rstrip(".")
            problem = (f"Multi30k is not available to the graded notebooks of {', '.join(needing)}, which read it "
                       f"while graded ({cause}). Set the environment variable {multi30k.ENVIRONMENT_VARIABLE} to a "
                       f"folder holding its six .gz files ({', '.join(multi30k.SHA256)}), or grade where "
                       f"{multi30k.cache_directory()} holds them or they can be downloaded")
            if self.require_data:
                raise GradingUnavailable(f"{problem}. Nobody was graded") from None
            print(f"WARNING: {problem}; without it their data cells will fail.", file=sys.stderr, flush=True)
            return None
        try:  # tokenised here once, not by every student's stage-5 notebook (about 9 s of CPU each)
            tokens = token_cache.prepare(paths[0].parent)
        except (OSError, ValueError, ImportError) as error:
            print(f"note: Multi30k could not be tokenised ahead of grading ({error}); each notebook tokenises it "
                  "itself", file=sys.stderr, flush=True)
            tokens = None
        self.tokens_folder = str(tokens) if tokens is not None else None
        return str(paths[0].parent)

    def record(self, result: StudentResult) -> term.Record:
        """What the class folder remembers of this student (an empty record when nothing readable)."""
        return term.load(self.records, result.student)

    def plan(self, result: StudentResult, record: term.Record) -> None:
        """Decide what of this week's folder is new for the student (`result.to_grade`, `result.rejected`).

        A notebook whose bytes the record holds, graded, is not graded again (unless --force, or --regrade names
        the student, or the student and its stage); a changed one
        (a resubmission) or a new stage is; one older, by its file's time, than the notebook graded for its
        stage is not (the newer stays, and its row says so). A file that could not be graded replaces the earlier
        row of that file, or of its stage when nothing was graded for it; beside a graded notebook of its stage
        it is a row of its own."""
        result.record = record
        self._migrate(result, record)
        result.to_grade, result.rejected = [], []
        for submission in result.submissions:
            stage = submission.assignment
            if submission.notebook is None or stage is None:
                result.rejected.append(submission)
                continue
            earlier = record.notebooks.get(stage)
            named = self.regrading.get(result.student, set())  # --regrade: None (all of theirs) or some stages
            again = result.student in self.regrading and (named is None or stage in named)
            if earlier is None or self.force or again or earlier.status != "graded":
                result.to_grade.append(stage)
            elif earlier.digest == submission.digest:
                continue
            elif self.older(submission, earlier):
                note = (f"{stage}: an older notebook, {printable(submission.relative)}, in a later download was not "
                        f"graded: the newer one graded before, {printable(earlier.file)}, stays")
                if note not in earlier.reasons:
                    earlier.reasons.append(note)
                    result.changed = True
            else:
                result.to_grade.append(stage)

    def older(self, submission: Submission, earlier: term.Entry) -> bool:
        """Whether SUBMISSION was handed in before the notebook graded for its stage: by the LMS's times when both
        have one (--submission-times), else by the files' times."""
        mine = deadlines.submission_time(submission, self.times)
        theirs = deadlines.HandedIn.read(earlier.handed)
        if mine.when and theirs and theirs.when and mine.source != "file time" and theirs.source != "file time":
            return mine.when < theirs.when
        return submission.modified < earlier.modified

    def _migrate(self, result: StudentResult, record: term.Record) -> None:
        """A record written before the class folder kept the term (no notebooks, the fingerprint of the files of the
        student's last run): when this folder holds those very files, they become the record's notebooks."""
        saved = record.last_run
        if record.notebooks or saved.get("fingerprint") != fingerprint(result.submissions):
            return
        if saved.get("status") != "graded":
            return
        notes, result.reasons = result.reasons, [str(reason) for reason in saved.get("reasons", [])
                                                 if isinstance(reason, str)]
        for submission in result.submissions:
            if submission.notebook is not None and submission.assignment:
                record.notebooks[submission.assignment] = self._entry(
                    result, submission, "graded", self.reasons_for(result, submission.assignment), "")
        result.reasons, result.changed = notes, True

    def _entry(self, result: StudentResult, submission: Submission, status: str, reasons: list[str],
               run: str) -> term.Entry:
        stage = submission.assignment or ""
        normalised = {}
        if submission.notebook is not None and stage in self.release.notebooks:
            normalised = similarity.normalised_cells(submission.notebook, self.release.notebooks[stage])
        return term.Entry(file=submission.relative, digest=submission.digest, modified=submission.modified,
                          inode=submission.inode, run=run, checked=submission.status, status=status,
                          reasons=reasons, untouched=submission.untouched, assignment=stage,
                          normalised=normalised, normaliser=similarity.NORMALISER,
                          handed=deadlines.submission_time(submission, self.times).to_json())

    def remember(self, result: StudentResult, record: term.Record, report: dict[str, dict] | None = None,
                 failure: str = "") -> None:
        """Write the student's record: the notebooks graded now (from the worker's REPORT: graded, or failed with
        the reason), the files that could not be graded; everything else of the record as it was."""
        record.identity = {"lms": result.identity.lms, "lms_id": result.identity.lms_id,
                           "match": result.identity.match, "name": result.identity.name} if result.identity else (
            record.identity)
        graded_now = {s.assignment: s for s in result.submissions if s.assignment in result.to_grade}
        for stage, submission in graded_now.items():
            reasons = self.reasons_for(result, stage)
            if failure:
                reasons.append(failure)
            done = report is not None and stage in report and report[stage].get("success")
            record.notebooks[stage] = self._entry(result, submission, "graded" if done else "failed", reasons,
                                                  self.run_stamp)
            record.files.pop(submission.relative, None)  # a file rejected before, handed in again readable
        for submission in result.rejected:
            reasons = list(submission.reasons or result.reasons)
            stage = submission.assignment
            earlier = record.notebooks.get(stage) if stage else None
            entry = self._entry(result, submission, "rejected", reasons, self.run_stamp)
            if stage and (earlier is None or earlier.status != "graded"):
                record.notebooks[stage] = entry
            else:
                if earlier is not None:
                    entry.reasons.append(f"{stage}: the notebook graded before, {printable(earlier.file)}, keeps "
                                         "its score")
                record.files[submission.relative] = entry
        if report is not None or failure:
            record.last_run = {"fingerprint": fingerprint(result.submissions), "status": result.status,
                               "reasons": result.reasons, "seconds": round(result.seconds, 1),
                               "notebook_seconds": {a: r.get("seconds") for a, r in sorted((report or {}).items())}}
        term.save(self.records, record)

    def place(self, result: StudentResult) -> list[str]:
        """Write the checked notebooks to grade where nbgrader looks; returns the assignments to grade."""
        to_grade = []
        for submission in result.submissions:
            if submission.notebook is None or submission.assignment not in result.to_grade:
                continue
            result.reasons += submission.reasons
            path = self.class_dir / "submitted" / result.student / submission.assignment
            path.mkdir(parents=True, exist_ok=True)
            nbformat.write(submission.notebook, path / f"{submission.assignment}.ipynb")
            to_grade.append(submission.assignment)
        return to_grade

    def grade(self, result: StudentResult) -> StudentResult:
        start = time.perf_counter()
        if self.start_up is not None and self.start_up.done() and self.verdict_of_start_up():
            return result  # no sandbox starts here: nobody is graded (run() says why)
        record = result.record or self.record(result)
        to_grade = self.place(result)
        if not to_grade:
            result.status = "rejected"
            result.reasons = result.reasons or [reason for s in result.rejected for reason in s.reasons] or [
                "no gradable notebook"]
            self.remember(result, record)
            return result
        report: dict = {}
        others = {a: self.graded_with[result.student, a] for a in to_grade if (result.student, a) in self.graded_with}
        mine = [a for a in to_grade if a not in others]
        parts: list[tuple[list[str], Environment | None]] = [(part, None) for part in self.split(mine)] if mine else []
        parts += [([a], environment) for a, environment in others.items()]  # graded by their release's worker
        for assignment, environment in others.items():  # where that release's gradebook looks for it
            self.place_for(environment, result, assignment)
        barrier = threading.Barrier(len(parts))  # every worker's visible cells before any hidden part
        with ThreadPoolExecutor(max_workers=len(parts)) as pool:
            for (_, environment), (part_report, problem) in zip(parts, pool.map(
                    lambda part: self.run_worker(result.student, part[0], barrier, part[1]), parts), strict=True):
                if environment is not None:
                    self.merge_release(environment, result, part_report)
                report.update(part_report)
                if problem:
                    result.reasons.append(problem)
        if self.verdict_of_start_up():
            return result  # nobody is graded (run() says why): no record, so a later run grades this student
        missing = len(report) < len(to_grade)  # a part gave no report: its reason is listed
        failures = {a: r["error"] for a, r in report.items() if not r["success"]}
        result.reasons += [f"{a}: nbgrader could not grade it: {error.splitlines()[-1] if error else '?'}"
                           for a, error in failures.items()]
        result.reasons += [f"{a}: flagged for review: your notebook {finding}"
                           for a, r in report.items() for finding in r.get("findings", [])]
        result.reasons += [f"{a}: {fault}" for a, r in report.items() for fault in r.get("faults", [])]
        result.status = "graded" if report and not failures and not missing else "failed"
        result.seconds = time.perf_counter() - start
        self.remember(result, record, report)
        return result

    def place_for(self, environment: Environment, result: StudentResult, assignment: str) -> None:
        """Write the student's notebook where the gradebook of its release looks for it."""
        for submission in result.submissions:
            if submission.assignment == assignment and submission.notebook is not None:
                path = environment.class_dir / "submitted" / result.student / assignment
                path.mkdir(parents=True, exist_ok=True)
                nbformat.write(submission.notebook, path / f"{assignment}.ipynb")

    def merge_release(self, environment: Environment, result: StudentResult, part_report: dict) -> None:
        """A notebook graded by its own release's worker joins the class's gradebook and folders."""
        for assignment, outcome in part_report.items():
            if not isinstance(outcome, dict) or not outcome.get("success"):
                continue
            try:
                merge(environment, self.class_dir, self.db_url, result.student, assignment)
            except Exception as error:  # noqa: BLE001  (the student's row says it, the batch goes on)
                outcome["success"] = False
                outcome["error"] = f"its grading by {environment.tag} could not join the class's gradebook: {error}"

    def run_worker(self, student: str, assignment_ids: list[str], barrier: threading.Barrier | None = None,
                   environment: Environment | None = None) -> tuple[dict, str]:
        """(the worker's report, a reason when it gave none) for grading these notebooks of a student, by this
        checkout's worker or, with ENVIRONMENT, by the worker of the notebooks' own release.

        The worker grades every visible cell of its notebooks first, says so, and waits for the other workers
        grading the same student (`barrier`) before any hidden part runs (worker.Phases)."""
        python, course, class_dir, db_url = ((environment.python, environment.course, environment.class_dir,
                                              environment.db_url) if environment is not None else
                                             (Path(sys.executable), self.course, self.class_dir, self.db_url))
        command = [str(python), "-m", "transformer_course.grading.classroom.worker", "--course", str(course),
                   "--class-dir", str(class_dir), "--student", student, "--db-url", db_url,
                   "--timeout", str(self.timeout), "--memory-gb", str(self.memory_gb)]
        if environment is None or _knows_notebook_timeout(environment.course):  # an older release's worker may not
            command += ["--notebook-timeout", str(self.notebook_timeout)]
        command += [item for assignment in assignment_ids for item in ("--assignment", assignment)]
        command += ([] if self.sandbox else ["--no-sandbox"]) + ["--wait-for-go"]
        command += ["--secret-file", str(self.secret_file)]
        command += ["--sandbox-per-notebook"] if self.sandbox_per_notebook else ["--wait-between-phases"]
        # what a student can cost: each notebook's deadline (its cells, replays and hidden parts together), plus the
        # grader's own work on it (its sandbox's start, nbgrader, its feedback page: seconds), with room to spare
        limit = 60 + (self.notebook_timeout + GRADER_WORK) * len(assignment_ids)
        with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**self.thread_limits(), **_clean_environment(),
                                              **self.data_environment(), "PYTHONWARNINGS": "ignore"}) as process:
            go = self.verdict_of_start_up() is None  # the worker imports meanwhile, then waits for this line
            try:
                stdout, stderr = self._talk(process, go, barrier, time.monotonic() + limit)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                return {}, f"grading took longer than {limit} s and was stopped"
            finally:
                if barrier is not None:
                    barrier.abort()  # harmless after everyone passed; frees the others when this one failed
        if not go:
            return {}, ""
        try:
            report = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
        except json.JSONDecodeError:
            report = {}
        if isinstance(report, dict) and isinstance(report.get(SANDBOX_PROBLEM), str):
            self.start_up_test()  # is it this machine? then nobody is graded (grade() and run() wait for it)
            return {}, f"the grading sandbox did not start: {printable(report[SANDBOX_PROBLEM])[:300]}"
        if not isinstance(report, dict) or not report:
            return {}, "the grading process failed: " + " | ".join(stderr.strip().splitlines()[-3:])
        return report, ""

    def _talk(self, process: subprocess.Popen, go: bool, barrier: threading.Barrier | None,
              deadline: float) -> tuple[str, str]:
        """The worker's standard output and error, read to the end: 'go' (or 'stop') first; between its two
        phases ('visible-done' on its standard output, worker.Phases) wait for the student's other workers, then
        'hidden'. A worker that ends or fails before 'visible-done' breaks the barrier: the others go on."""
        out: list[str] = []
        err: list[str] = []
        said = threading.Event()  # 'visible-done' arrived
        done_or_ended = threading.Event()

        def read_out() -> None:
            for line in process.stdout:
                out.append(line)
                if line.strip() == "visible-done":
                    said.set()
                    done_or_ended.set()
            done_or_ended.set()  # ended without saying it

        readers = [threading.Thread(target=read_out, daemon=True),
                   threading.Thread(target=lambda: err.extend(process.stderr), daemon=True)]
        for reader in readers:
            reader.start()
        with contextlib.suppress(OSError, ValueError):
            process.stdin.write("go\n" if go else "stop\n")
            process.stdin.flush()
        if go and not self.sandbox_per_notebook:
            if not done_or_ended.wait(max(0.0, deadline - time.monotonic())):
                raise subprocess.TimeoutExpired(process.args, 0)
            with contextlib.suppress(threading.BrokenBarrierError):
                if barrier is not None:
                    if process.poll() is None and said.is_set():
                        barrier.wait(max(1.0, deadline - time.monotonic()))
                    else:
                        barrier.abort()
            with contextlib.suppress(OSError, ValueError):
                process.stdin.write("hidden\n")
                process.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            process.stdin.close()
        process.wait(max(0.0, deadline - time.monotonic()))
        for reader in readers:
            reader.join(10)
        return "".join(out), "".join(err)

    def split(self, assignment_ids: list[str]) -> list[list[str]]:
        """A student's notebooks in groups graded at the same time, each group by its own worker and sandbox.

        With fewer students at once (--jobs) than cores, one student's notebooks share the spare
        cores, as threads used to (one torch thread per runner is cheaper): the heaviest notebooks
        first, each to the lightest group. With --jobs at least the number of cores: one group."""
        groups = min(len(assignment_ids), max(1, (os.cpu_count() or 1) // max(1, self.jobs)))
        if groups == 1:
            return [list(assignment_ids)]
        weight = {a: self.cost(a) for a in assignment_ids}
        split: list[list[str]] = [[] for _ in range(groups)]
        for assignment in sorted(assignment_ids, key=lambda a: -weight[a]):
            min(split, key=lambda group: sum(weight[a] for a in group)).append(assignment)
        return [sorted(group) for group in _balanced(split, weight)]

    def cost(self, assignment: str) -> float:
        """Relative grading cost of an assignment (to balance the groups), else its number of code cells / 10.

        The seconds each notebook took in its worker (nbgrader, its cells, its feedback; the worker's sandbox,
        started once for all of its notebooks before them, left out), as scripts/benchmark_grading.py prints them
        per notebook (medians of three runs); measured on 2026-11-25, night (2 cores, bubblewrap)."""
        measured = {"00_why_attention": 3.6, "01_positional_encoding": 2.3, "02_attention": 2.2, "03_blocks": 2.9,
                    "04_transformer": 2.7, "05_training": 5.5, "06_decoding": 3.7, "07_fast_and_better_decoding": 4.6}
        if assignment in measured:
            return measured[assignment]
        try:
            notebook = nbformat.read(self.class_dir / "release" / assignment / f"{assignment}.ipynb", as_version=4)
            return sum(cell.cell_type == "code" for cell in notebook.cells) / 10
        except (OSError, ValueError):
            return 1.0

    def imported(self) -> None:
        """Wait for nbgrader's import in the background (run()): two threads importing nbgrader's and nbconvert's
        modules at the same time can deadlock in Python's import locks (seen: the start-up test's import of the
        worker beside it)."""
        if self.importing is not None:
            self.importing.join()

    def runner_problem(self) -> str | None:
        """None when a runner starts here under this class's sandbox, else why not (the start-up test)."""
        self.imported()
        from transformer_course.grading.classroom.worker import runner_start_problem  # torch: only when grading

        return runner_start_problem(self.course, self.memory_gb, self.sandbox, self.data_folder)

    def raise_if_unavailable(self, problem: str | None) -> None:
        """Stop with the cause when no runner can start here, instead of failing every student."""
        if problem:
            how = "sandboxed" if self.sandbox else "unsandboxed"
            raise GradingUnavailable(f"a student's notebook runner cannot start on this machine ({how}, "
                                     f"{self.memory_gb} GB of memory), so nobody was graded: {problem}")

    def start_up_test(self) -> Future[str | None]:
        """The start-up test (`runner_problem`), started once, in a thread of its own.

        With a sandbox per notebook it runs before anyone is graded. Otherwise it runs only once a worker has
        said that its sandbox did not start (`worker.SANDBOX_PROBLEM`): every worker starts its sandbox before
        grading, so a machine where none can start still grades nobody, and a machine where they start pays
        nothing for the test."""
        with self.start_up_lock:
            if self.start_up is None:
                checking = ThreadPoolExecutor(max_workers=1)
                self.start_up = checking.submit(self.runner_problem)
                checking.shutdown(wait=False)
            return self.start_up

    def verdict_of_start_up(self) -> str | None:
        """The start-up test's answer (waiting for it): None when grading may go on."""
        return self.start_up.result() if self.start_up is not None else None

    def data_environment(self) -> dict[str, str]:
        environment = {multi30k.ENVIRONMENT_VARIABLE: self.data_folder} if self.data_folder else {}
        if self.data_folder and self.tokens_folder:
            environment[token_cache.ENVIRONMENT_VARIABLE] = self.tokens_folder
        return environment

    def thread_limits(self) -> dict[str, str]:
        """One torch thread per student's runner (unless the caller chose), whatever --jobs is.

        What the notebooks run while graded is small (grading-mode demos, checks on tiny tensors):
        a second thread brings no speed, only OpenMP's synchronisation. Measured on the course's
        notebooks (2-core machine shared with other work): the demo cell of stage 3 took 0.7 s of CPU
        with one thread and 16.9 s with two; a full submission 34 s of sandbox CPU against 98 s. With
        several kernels on the same cores the threads also spin against each other (3 students on
        2 cores: 238 s with default threads, 99 s with one thread each). Fill the cores with --jobs."""
        return {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}

    def run(self, grade: bool = True) -> dict[str, StudentResult]:
        """Grade this shard's students (all of them without a shard) and write scores.csv for the
        whole class; returns this shard's students. grade=False only writes scores.csv.

        The folder is merged into the class folder's term (`gradebook.term`): only what is new in it is
        graded (a new stage, a resubmission), and every student and notebook it lacks keeps its row."""
        problem = bubblewrap_problem() if self.sandbox and grade else None
        if problem:  # secure by default: unconfined grading only when the instructor asked for it by name
            raise GradingUnavailable(f"student notebooks cannot be isolated here: {problem}. Nobody was graded. "
                                     "Install bubblewrap (Debian/Ubuntu: apt install bubblewrap), or pass --no-sandbox "
                                     "to grade without isolation on a machine that holds nothing else of value")
        if grade and not self.sandbox:
            _warn_unsandboxed()
        if grade:
            self.use_secret()
        self.read_term()
        assignment_ids = self.prepare(data=False) if grade else self.assignment_ids
        self.release = release = Release(self.class_dir / "release", assignment_ids)
        self.run_stamp = datetime.now().isoformat(timespec="seconds")
        root = download_root(self.submissions)
        if root != self.submissions:
            print(f"the download lies in the folder {printable(root.name)} of {self.submissions}: reading it there",
                  flush=True)
        records = term.load_all(self.records)
        known = {term_identity(record): student for student, record in records.items() if record.identity}
        everyone = collect(self.submissions, release, self.limits, known=known, flag_copies=False,
                           roster=self.roster, times=self.times)
        if not grade:
            self.write_csv(everyone)
            self.write_similarity()
            report.write_report(self.class_dir)
            return everyone
        students = {name: result for name, result in everyone.items() if in_shard(name, self.shard)}
        self.regrading = self.regrade_targets(everyone)
        pending = []
        for result in students.values():
            record = records.get(result.student) or term.Record(result.student)
            self.plan(result, record)
            if result.to_grade or self._new_rejections(result, record):
                pending.append(result)
                continue
            result.status = "skipped"
            kept = [record.notebooks.get(s.assignment) for s in result.submissions if s.assignment]
            result.reasons = list(dict.fromkeys(reason for entry in kept if entry for reason in entry.reasons))
            if result.changed:
                self.remember(result, record)
        self.own_releases(pending)
        graded_stages = sorted({s.assignment for result in pending for s in result.submissions
                                if s.assignment in result.to_grade and s.notebook is not None})
        self.data_folder = self.provide_data(graded_stages)  # Multi30k only when a stage graded now reads it
        if any(result.to_grade for result in pending):  # nbgrader (half a second to import) is needed for the
            # scores at the end: imported meanwhile
            self.importing = threading.Thread(target=importlib.import_module, args=("nbgrader.api",), daemon=True)
            self.importing.start()
        if pending and self.sandbox_per_notebook:
            self.start_up_test()  # runs while the first workers start (they import nbgrader and wait for its answer)
        with ThreadPoolExecutor(max_workers=max(1, self.jobs)) as pool:
            futures = {pool.submit(self.grade, result): result for result in pending}
            for future in tqdm(as_completed(futures), total=len(futures), desc="grading", unit="student"):
                if future.exception() is not None:  # one student's unexpected error is their row, not the batch's end
                    error, result = future.exception(), futures[future]
                    result.status = "failed"
                    reason = (f"the grader failed on this student ({type(error).__name__}: "
                              f"{printable(str(error))[:200]})")
                    result.reasons.append(reason)
                    with contextlib.suppress(OSError):
                        self.remember(result, result.record or self.record(result), failure=reason)
        self.raise_if_unavailable(self.verdict_of_start_up())  # nobody graded, no scores.csv
        self.imported()
        self.write_csv(everyone, set(students))
        self.write_similarity()
        report.write_report(self.class_dir)  # report.html beside scores.csv
        answers.write_formgrader_config(self.class_dir, self.course, self.db_url)  # for grading answers by hand
        return students

    def _new_rejections(self, result: StudentResult, record: term.Record) -> bool:
        """Whether a file of this folder that cannot be graded is not in the record yet (as the same bytes and
        reasons)."""
        for submission in result.rejected:
            entries = [entry for entry in record.entries() if entry.file == submission.relative]
            if not any(entry.digest == submission.digest and entry.status == "rejected" for entry in entries):
                return True
        return False

    # --- reporting ------------------------------------------------------------------------------

    def write_csv(self, everyone: dict[str, StudentResult], mine: set[str] | None = None) -> Path:
        """scores.csv: one row per (student, assignment) of the whole term, plus one per file that could not be
        graded, with the reason.

        The rows come from the class folder's records (`gradebook.term`: every student and notebook graded into
        it, whichever downloads folder held them) and the gradebook's scores. Students of EVERYONE (this
        downloads folder) without a record of these files are another machine's (a shard's) and not graded yet,
        or graded there with records that are not in this class folder (MINE: the students this machine graded in
        this run, whose records say all). Byte-identical files handed in by
        several students are flagged across the whole term (`shared_file_flags`).

        Every text cell is safe to open in a spreadsheet (`spreadsheet_cell`); numbers stay numbers. Written
        answers graded by hand whose text did not change are taken off nbgrader's review list first
        (`hand_grades.keep_unchanged`). The file is replaced whole (`replace_atomically`): machines sharing
        the class folder never mix two versions, and of two writing at once the last one wins whole."""
        hand_grades.keep_unchanged(self.class_dir, self.db_url)
        scored = {(row["student"], row["assignment"]): row for row in answers.score_rows(self.db_url)}
        records = term.load_all(self.records)
        entries = [(student, entry) for student, record in records.items() for entry in record.entries()]
        flags = shared_file_flags([Handed(student, entry.assignment, entry.file, entry.digest, entry.inode, entry.run,
                                          entry.untouched) for student, entry in entries])
        flagged = {id(entry): found for (_, entry), found in zip(entries, flags, strict=True)}
        rows: list[dict] = []
        handed: dict[int, tuple[deadlines.HandedIn | None, list[str]]] = {}  # id(row) -> when, the student's names
        for student, record in records.items():
            person = {"name": record.name, "lms_id": record.lms_id, "lms": record.identity.get("lms", "")}
            names = deadlines.person_names(student, term_identity(record))
            for stage, entry in record.notebooks.items():
                row = scored.pop((student, stage), None) or {"student": student, "assignment": stage}
                row.update(person, status=entry.status, notebook=entry.checked, file=entry.file,
                           reasons="; ".join(dict.fromkeys([*entry.reasons, *flagged[id(entry)]])))
                rows.append(row)
                handed[id(row)] = (deadlines.HandedIn.read(entry.handed), names)
            for entry in record.files.values():
                rows.append({"student": student, **person, "assignment": entry.assignment or "?",
                             "status": entry.status, "notebook": entry.checked, "file": entry.file,
                             "reasons": "; ".join(dict.fromkeys([*entry.reasons, *flagged[id(entry)]]))})
        for result in everyone.values():  # this folder's students whose files no record holds: another machine's
            if result.student in (mine or set()):
                continue
            record = records.get(result.student)
            person = {"name": result.name, "lms_id": result.lms_id, "lms": result.lms}
            for submission in result.submissions:
                stage = submission.assignment
                if record is not None and any(entry.file == submission.relative and entry.digest == submission.digest
                                              for entry in record.entries()):
                    continue
                row = scored.pop((result.student, stage), None) if stage else None
                if row is not None and row_scored(row):
                    row.update(person, status="graded", notebook=submission.status, file=submission.relative,
                               reasons="graded on another machine, whose records are not in this class folder")
                    rows.append(row)
                    handed[id(row)] = (deadlines.submission_time(submission, self.times),
                                       deadlines.names_of(submission))
                    continue
                reasons = [*self.reasons_for(result, stage or "?"), "not graded yet (by the machine of its shard) "
                           "when this file was written"] if submission.status != "rejected" else submission.reasons
                rows.append({**(row or {}), "student": result.student, **person, "assignment": stage or "?",
                             "status": "rejected" if submission.status == "rejected" else "pending",
                             "notebook": submission.status, "reasons": "; ".join(reasons), "file": submission.relative})
        for row in scored.values():  # in the gradebook, in no record here nor in this folder
            row.update(status="graded" if row_scored(row) else "pending", reasons="graded on another machine, whose "
                       "records are not in this class folder" if row_scored(row) else "not graded yet (by another "
                       "machine) when this file was written")
            rows.append(row)
        late = list(deadlines.TERM_COLUMNS) if self.deadlines is not None else []
        if late:
            self.late_columns(rows, handed)
        fixed = ["student", "name", "lms_id", "lms", "assignment", *answers.GRADEBOOK_COLUMNS, *late, "status",
                 "notebook", "reasons", "file"]
        columns = [*fixed[:5], *sorted({key for row in rows for key in row} - set(fixed), key=str), *fixed[5:]]

        def write(handle) -> None:  # noqa: ANN001
            handle.write(EXCEL_BOM)  # Excel then reads it as UTF-8: names with umlauts stay whole
            writer = csv.writer(handle)
            writer.writerow([spreadsheet_cell(column) for column in columns])
            for row in sorted(rows, key=lambda row: (str(row["student"]), str(row["assignment"]), str(row["file"]))):
                writer.writerow([spreadsheet_cell(row.get(column, "")) for column in columns])

        return replace_atomically(self.class_dir / "scores.csv", write, newline="")

    def write_similarity(self) -> Path:
        """CLASS/similarity.json: the near-copies of every exercise and written answer across the term's records
        and the reference solution (`outputs.similarity`), which the class report lists."""
        return similarity.write(self.class_dir, self.course, term.load_all(self.records), self.assignment_ids)

    def late_columns(self, rows: list[dict], handed: dict[int, tuple[deadlines.HandedIn | None, list[str]]]) -> None:
        """Each notebook's row: its submission time, due date, lateness and penalty (`deadlines.handed_columns`),
        from when it was handed in as the class folder's record keeps it (HANDED: id(row) -> (when, the student's
        names)), against the deadlines file as it is now (an extension given later counts)."""
        assert self.deadlines is not None
        for row in rows:
            when, names = handed.get(id(row), (None, []))
            if when is not None:
                total = row.get("total")
                row.update(deadlines.handed_columns(when, str(row["assignment"]), names, self.deadlines,
                                                    float(total) if isinstance(total, int | float) else None))

    def reasons_for(self, result: StudentResult, assignment: str) -> list[str]:
        """The student's reasons about this assignment or about no assignment in particular."""
        rejected = {reason for s in result.submissions if s.status == "rejected" for reason in s.reasons}
        return list(dict.fromkeys(
            reason for reason in result.reasons if reason not in rejected
            and (assignment in reason or not any(a in reason for a in self.assignment_ids))))

    def use_secret(self) -> None:
        """Read the class's secret (made once, the first time, where `secret_file` says): the hidden tests'
        inputs are drawn from it (`hidden_inputs`). It must lie outside the class folder and the downloads."""
        for folder in (self.class_dir, self.submissions):
            if self.secret_file == folder or folder in self.secret_file.parents:
                raise GradingUnavailable(f"the secret the hidden inputs are drawn from ({self.secret_file}) lies in "
                                         f"{folder}: keep it outside the class folder and the downloads "
                                         "(--secret-file PATH)")
        try:
            secret, created = hidden_inputs.read_or_create(self.secret_file)
        except (OSError, hidden_inputs.SecretError) as problem:
            raise GradingUnavailable(f"the secret the hidden inputs are drawn from cannot be read: {problem}") from None
        if created:
            print(f"made the class's secret {self.secret_file}: the hidden tests' inputs are drawn from it. Keep it "
                  "(a regrade with it gives the same scores) and do not publish it; every grading machine needs "
                  "the same file", flush=True)
        self.same_secret_as_before(hidden_inputs.secret_id(secret))

    def same_secret_as_before(self, secret_id: str, attempts: int = 50) -> None:
        """Refuse a secret other than the one this class folder was graded with (its id, which reveals nothing of
        it, is kept in the class folder): another secret draws other hidden inputs, so regrades would change
        scores, and machines of one class on different secrets would grade its students on different inputs."""
        marker = self.class_dir / SECRET_ID_FILE
        try:
            known = marker.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            known = ""
        except OSError as problem:
            raise GradingUnavailable(f"cannot read {marker}: {problem}") from None
        if known and known != secret_id:
            raise GradingUnavailable(
                f"this class folder was graded with another secret (id {known}) than {self.secret_file} (id "
                f"{secret_id}): its hidden inputs, and the scores of code right only for some sizes, would change. "
                "Give --secret-file the class's own secret (the same file on every machine); to start the class "
                f"afresh on this one, delete {marker}. Nobody was graded")
        if known:
            return
        self.class_dir.mkdir(parents=True, exist_ok=True)
        if not marker.exists() and hidden_inputs.create_once(marker, secret_id + "\n", mode=0o644):
            return  # the first machine to grade the class says which secret: the others must agree
        if attempts == 0:
            raise GradingUnavailable(f"{marker} stays empty: delete it and grade again. Nobody was graded")
        time.sleep(0.1)  # another machine made it a moment ago: read what it wrote
        self.same_secret_as_before(secret_id, attempts - 1)


SECRET_ID_FILE = "hidden-inputs-secret.id"  # in the class folder: which secret graded it (its id, not the secret)


def _balanced(groups: list[list[str]], weight: dict[str, float]) -> list[list[str]]:
    """`groups` with notebooks swapped between the heaviest group and another while that lightens the heaviest
    (the first placement, heaviest first into the lightest group, can leave one notebook's difference: the
    student waits for the heaviest group)."""
    def load(group: list[str]) -> float:
        return sum(weight[a] for a in group)

    for _ in range(100):
        heaviest = max(groups, key=load)
        best, swap = load(heaviest), None
        for other in groups:
            if other is heaviest:
                continue
            for mine in heaviest:
                for theirs in [*other, None]:
                    change = weight[mine] - (weight[theirs] if theirs is not None else 0.0)
                    if 0 < change and max(load(heaviest) - change, load(other) + change) < best - 1e-9:
                        best, swap = max(load(heaviest) - change, load(other) + change), (other, mine, theirs)
        if swap is None:
            return groups
        other, mine, theirs = swap
        heaviest.remove(mine)
        other.append(mine)
        if theirs is not None:
            other.remove(theirs)
            heaviest.append(theirs)
    return groups


def spreadsheet_cell(value: object) -> object:
    """VALUE as a CSV cell no spreadsheet runs as a formula (OWASP CSV injection), whether it splits
    cells at commas or at semicolons (`outputs.spreadsheet.protect`).

    Numbers stay numbers; control characters are shown as <U+XXXX>, so no cell hides a line or an escape."""
    if value is None or isinstance(value, int | float):
        return value
    return printable(protect(str(value)))


def _clean_environment() -> dict[str, str]:
    """The grader's environment minus anything a student's kernel should not inherit."""
    secret_words = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")
    return {name: value for name, value in os.environ.items() if not any(w in name.upper() for w in secret_words)}


def _knows_notebook_timeout(course: Path) -> bool:
    """Whether the worker of the release checked out at COURSE takes --notebook-timeout (releases before one
    deadline per notebook do not, and would refuse the whole command)."""
    worker = course / "src" / "transformer_course" / "grading" / "classroom" / "worker.py"
    try:
        return "--notebook-timeout" in worker.read_text(encoding="utf-8")
    except OSError:
        return False


class GradingUnavailable(RuntimeError):
    """This machine cannot grade at all (e.g. a kernel cannot start); the message says why."""


def _warn_unsandboxed() -> None:
    bar = "!" * 100
    print(f"{bar}\n!! --no-sandbox: student notebooks run WITHOUT isolation, as you asked.\n"
          "!! A submission can read other students' files and the hidden tests, and reach the network.\n"
          f"!! Memory and time limits still apply.\n{bar}", flush=True)


def summary(students: dict[str, StudentResult], csv_path: Path) -> str:
    lines = [f"{'student':24s} {'status':9s} {'score':>9s}  notes"]
    totals: dict[str, list[float]] = {}
    with open(csv_path, encoding="utf-8-sig") as handle:
        for row in csv.DictReader(handle):
            if row.get("total"):
                pair = totals.setdefault(row["student"], [0.0, 0.0])
                pair[0] += float(row["total"])
                pair[1] += float(row["max"])
    for name in sorted(students):
        result = students[name]
        score = f"{totals[name][0]:g}/{totals[name][1]:g}" if name in totals else "-"
        note = result.reasons[0] if result.reasons else ""
        more = f" (+{len(result.reasons) - 1} more)" if len(result.reasons) > 1 else ""
        lines.append(f"{printable(name):24s} {result.status:9s} {score:>9s}  {printable(note)[:90]}{more}")
    return "\n".join(lines)


def parse_shard(text: str) -> tuple[int, int] | None:
    """--shard K/N (1 <= K <= N), or a scheduler's job array: slurm, kubernetes, auto (see scheduler_shard)."""
    if text in ("slurm", "kubernetes", "auto"):
        return scheduler_shard(text, os.environ)
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError("--shard takes K/N, slurm, kubernetes or auto") from None
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError("--shard K/N needs 1 <= K <= N")
    return index, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", type=Path, help="folder of student notebooks")
    parser.add_argument("--class-dir", type=Path, default=ROOT / "autograde" / "class",
                        help="where the gradebook, autograded copies, feedback and scores.csv go")
    parser.add_argument("--jobs", type=int, default=2, help="students graded at the same time")
    parser.add_argument("--force", action="store_true",
                        help="regrade every notebook of the folder, those graded before included")
    parser.add_argument("--db-url", help="SQLAlchemy URL of a shared gradebook (default: sqlite in --class-dir)")
    parser.add_argument("--shard", type=parse_shard,
                        help="K/N: grade only the K-th of N slices of the class; slurm, kubernetes or auto: the slice "
                             "of this task of the scheduler's job array (auto outside an array: the whole class)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds one cell may run")
    parser.add_argument("--notebook-timeout", type=int, default=NOTEBOOK_TIMEOUT,
                        help="seconds one notebook may run in all (its cells, the replays after a crash and its hidden "
                             "tests): what has not run by then scores 0. A student costs the class at most the sum "
                             "of their notebooks' deadlines, plus the grader's own work on them")
    parser.add_argument("--memory-gb", type=float, default=6.0,
                        help="memory each notebook's sandbox may use, all its processes together (GB)")
    parser.add_argument("--assignment", action="append", help="grade only this assignment (repeatable)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="grade without bubblewrap isolation (without it, a machine where no sandbox can start "
                             "grades nobody: exit status 2)")
    parser.add_argument("--require-sandbox", action="store_true",
                        help="kept for older recipes: refusing to grade without isolation is the default now")
    parser.add_argument("--sandbox-per-notebook", action="store_true",
                        help="grade each notebook from start to end in a sandbox of its own (slower; the design of "
                             "2026-11-25 evening) instead of all visible cells first, then the hidden parts, in one "
                             "sandbox")
    parser.add_argument("--secret-file", type=Path,
                        help="the class's secret, which the hidden tests' inputs are drawn from (made the first time; "
                             f"default: ${hidden_inputs.SECRET_VARIABLE}, else "
                             "~/.config/transformer-course/hidden-inputs.key); keep it outside the class folder")
    parser.add_argument("--require-data", action="store_true",
                        help="grade nobody (exit status 2) when a stage graded now reads Multi30k and it cannot be "
                             "had (MULTI30K_DIR), instead of grading with its data cells failing (the cluster recipes)")
    parser.add_argument("--regrade", action="append", metavar="STUDENT[/STAGE]",
                        help="grade this student (student id, LMS id or name) again though their files did not change, "
                             "or only this notebook of theirs (repeatable); --force regrades every notebook of the "
                             "folder")
    parser.add_argument("--roster", type=Path,
                        help="the class roster (name, email, lms_id, ...): maps notebooks without an LMS id (email, "
                             "USB) to the student's LMS id; remembered by the class folder")
    parser.add_argument("--deadlines", type=Path,
                        help="due dates, extensions and the late penalty (TOML, website/instructor/lms.md); "
                             "remembered by the class folder")
    parser.add_argument("--submission-times", type=Path, action="append", default=[], metavar="FILE",
                        help="when each notebook was handed in, as the LMS recorded it: Moodle's grading worksheet, "
                             "or a sheet with student, submitted[, assignment] (repeatable)")
    parser.add_argument("--scores-only", action="store_true",
                        help="grade nobody: write scores.csv for the whole class from the gradebook (after all shards)")
    arguments = parser.parse_args(argv)
    if not arguments.submissions.is_dir():
        parser.error(f"{arguments.submissions} is not a folder")
    grader = BatchGrader(ROOT, arguments.class_dir, arguments.submissions, jobs=arguments.jobs, force=arguments.force,
                         db_url=arguments.db_url, shard=arguments.shard, timeout=arguments.timeout,
                         memory_gb=arguments.memory_gb, sandbox=not arguments.no_sandbox,
                         assignment_ids=arguments.assignment, require_sandbox=arguments.require_sandbox,
                         sandbox_per_notebook=arguments.sandbox_per_notebook, secret_file=arguments.secret_file,
                         require_data=arguments.require_data, regrade=arguments.regrade,
                         roster=arguments.roster, deadlines_file=arguments.deadlines,
                         submission_times=arguments.submission_times, notebook_timeout=arguments.notebook_timeout)
    if arguments.shard:
        print(f"this machine grades shard {arguments.shard[0]}/{arguments.shard[1]} of the class", flush=True)
    try:
        students = grader.run(grade=not arguments.scores_only)
    except GradingUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    csv_path = grader.class_dir / "scores.csv"
    print(summary(students, csv_path))
    print(f"\nscores: {csv_path}\nfeedback: {grader.class_dir / 'feedback'}/<student>/<assignment>/\n"
          f"class report: {grader.class_dir / 'report.html'}")
    waiting = sum(answers.pending(row) for row in answers.read_csv(csv_path))
    if waiting:
        print(f"{waiting} graded notebook(s) have written answers to grade by hand: "
              f"python -m transformer_course.grading.answers export {grader.class_dir}\n"
              "  (see the instructor's guide, website/instructor/written-answers.md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
