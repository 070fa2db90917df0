"""Near-copies shown to the instructor: per exercise and per written answer, the submissions of the whole term
that are near-copies of the reference solution or of each other.

Published solutions get pasted and students copy each other, with comments removed and names changed. What
this module finds is a list for a person to look at, never a score change.

**What is compared.** Each exercise cell and each written answer on its own (`normalised_cells`), against
the same cell of every other submission of the term (every week's, from the class folder's records, see
`gradebook.term`) and against the reference solution, which is one more submission here. Code is normalised
before it is compared: parsed as Python, docstrings and comments dropped, every name the cell binds (its
variables, parameters, loop variables, helper functions) written as `v`, the layout made uniform by
`ast.unparse`; attribute and library names (`torch.softmax`, `self.W_q`) are kept, since they are what two
honest solutions differ by. A written answer is compared as its words, lower case, without markup. The code
the release gives in the cell (its signature, docstring, given lines) is boilerplate: nothing it holds
counts as similarity.

**How.** `copydetect`'s winnowing fingerprints (the algorithm of MOSS: Schleimer, Wilkerson and Aiken,
"Winnowing: Local Algorithms for Document Fingerprinting", 2003): k-grams of the normalised text, hashed
and winnowed, the release's fingerprints removed as boilerplate. A pair's similarity is the larger of the
two shares of each text's fingerprinted characters that the other one covers (copydetect's
`compare_files`): a copy with lines added still covers all of the original.

**When a pair is listed.** A cell whose fingerprints cover fewer than `MIN_CHARACTERS` characters (a one-line
answer, the release's code left out) is not compared. Short exercises are similar by nature (there are few
honest ways to write a padding mask), so every exercise has its own threshold, calibrated on honest work
(`CALIBRATION`, written by `python -m quality.similarity --write`): the honest class's three styles, code and
written answers, and the mistake catalog's correct alternatives that rewrite the reference; and on copies: the
reference pasted with its comments removed and its names changed. An exercise on which honest work comes as
close to the reference (or to other honest work) as a paste does is *too short to tell*: the report says so
instead of listing anyone.

The fingerprints are recomputed in every run from the normalised texts the records keep (copydetect hashes
with Python's `hash`, which differs from one process to the next).
"""

from __future__ import annotations

import ast
import difflib
import io
import json
import re
import textwrap
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

NORMALISER = 1  # the version of the normalisation below: texts stored by another version are made again
K = 25  # copydetect's noise threshold: a match shorter than this many characters of normalised text is noise
WINDOW = 1  # copydetect's guarantee threshold minus noise threshold plus one: every k-gram is kept
MIN_CHARACTERS = 100  # a text whose fingerprints cover fewer characters (four k-grams) is too short to tell
REFERENCE = "the reference solution"  # the reference, in lists of members
CALIBRATION = Path(__file__).with_name("similarity_calibration.json")
RESULTS = "similarity.json"  # in the class folder, written by the batch command, read by the class report
_SOLUTION_MARKERS = re.compile(r"^\s*###\s*(BEGIN|END) SOLUTION\s*$", re.MULTILINE)
_RUBRIC = re.compile(r"\*\*\s*Rubric\.?\s*\*\*", re.IGNORECASE)
_MODEL_ANSWER = re.compile(r"\*\*\s*Model answer\.?\s*\*\*", re.IGNORECASE)
_BLANK = ("YOUR ANSWER HERE", "# YOUR CODE HERE", "raise NotImplementedError()")


def _metadata(cell: nbformat.NotebookNode) -> dict:
    metadata = cell.get("metadata", {})
    nbgrader = metadata.get("nbgrader", {}) if isinstance(metadata, dict) else {}
    return nbgrader if isinstance(nbgrader, dict) else {}


def compared_cells(notebook: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    """{grade id: cell} of the cells a student writes in: exercise cells (code) and written answers."""
    return {_metadata(cell)["grade_id"]: cell for cell in notebook.cells
            if _metadata(cell).get("solution") and isinstance(_metadata(cell).get("grade_id"), str)}


# --- normalising ---------------------------------------------------------------------------------------

class _Names(ast.NodeTransformer):
    """Every name the code binds (assigned, a parameter, a loop or comprehension variable, a function or class it
    defines, an import's alias) written as `v`; names it only reads (torch, math, the notebook's given names)
    kept; docstrings dropped."""

    def __init__(self, bound: set[str]) -> None:
        self.bound = bound

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.bound:
            node.id = "v"
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        self.generic_visit(node)
        node.arg = "v"
        return node

    def _body(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        self.generic_visit(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name in self.bound:
            node.name = "v"
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Module = _body

    def visit_alias(self, node: ast.alias) -> ast.AST:
        if node.asname:
            node.asname = "v"
        return node


def _bound(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias) and node.asname:
            names.add(node.asname)
    return names


def normalise_code(source: str) -> str:
    """SOURCE with comments and docstrings dropped, every name it binds written `v`, laid out by `ast.unparse`.

    Code that is not valid Python (an unfinished cell) is read token by token instead: comments and layout
    dropped, names kept."""
    text = "\n".join(line for line in textwrap.dedent(source).splitlines()
                     if not line.lstrip().startswith(("%", "!")))  # IPython magics and shell lines
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _tokens(text)
    try:
        return ast.unparse(_Names(_bound(tree)).visit(tree))
    except (RecursionError, ValueError):
        return _tokens(text)


def _tokens(text: str) -> str:
    words: list[str] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                continue
            words.append("\n" if token.type == tokenize.NEWLINE else token.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return " ".join(re.sub(r"#.*$", "", line).strip() for line in text.splitlines() if line.strip())
    return " ".join(words)


def normalise_text(markdown: str) -> str:
    """A written answer as its words: lower case, letters and digits of any script, markup and TeX commands
    left out, one space between words."""
    text = re.sub(r"\\[A-Za-z]+", " ", markdown)  # \mathrm, \sqrt, \cdot
    return " ".join(re.findall(r"[^\W_]+", text.lower()))


def model_answer(source: str) -> str:
    """The model answer of a written question's solution cell, without its rubric."""
    return _MODEL_ANSWER.sub(" ", _RUBRIC.split(source, maxsplit=1)[0])


def _normalised(cell: nbformat.NotebookNode, reference: bool = False) -> str:
    if cell.cell_type == "markdown":
        return normalise_text(model_answer(cell.source) if reference else cell.source)
    return normalise_code(_SOLUTION_MARKERS.sub("", cell.source) if reference else cell.source)


def normalised_cells(notebook: nbformat.NotebookNode, released: nbformat.NotebookNode) -> dict[str, str]:
    """{grade id: normalised text} of the exercise cells and written answers of NOTEBOOK that differ from the
    release (a cell handed in as released is left out: there is nothing of the student's in it)."""
    given = compared_cells(released)
    found = {}
    for grade_id, cell in compared_cells(notebook).items():
        if grade_id not in given or cell.cell_type != given[grade_id].cell_type:
            continue
        text = _normalised(cell)
        if text and text != _normalised(given[grade_id]):
            found[grade_id] = text
    return found


def reference_cells(solution: nbformat.NotebookNode) -> dict[str, str]:
    """{grade id: normalised text} of the reference solution's exercise cells and model answers."""
    return {grade_id: _normalised(cell, reference=True) for grade_id, cell in compared_cells(solution).items()}


def boilerplate_cells(released: nbformat.NotebookNode) -> dict[str, str]:
    """{grade id: normalised text} of the release's cells: what the course gives, which is never a copy."""
    return {grade_id: _normalised(cell) for grade_id, cell in compared_cells(released).items()}


# --- comparing -------------------------------------------------------------------------------------------

def fingerprint(text: str, boilerplate: object = None):  # noqa: ANN201  (copydetect.CodeFingerprint)
    """copydetect's fingerprint of a normalised text (winnowed k-grams), the release's fingerprints removed."""
    from copydetect import CodeFingerprint

    return CodeFingerprint("cell.py", K, WINDOW, boilerplate=boilerplate, filter=False, fp=io.StringIO(text))


def boilerplate_hashes(text: str):  # noqa: ANN201  (a numpy array, as copydetect takes it)
    import numpy as np

    return np.unique(np.array(sorted(fingerprint(text).hashes), dtype=np.int64)) if text else np.array([])


def similarity(first, second) -> float:  # noqa: ANN001  (copydetect.CodeFingerprint)
    """The larger of the two shares of each text's fingerprinted characters covered by the other (0 to 1)."""
    from copydetect import compare_files

    if not first.token_coverage or not second.token_coverage or not first.hashes & second.hashes:
        return 0.0
    _, (one, two), _ = compare_files(first, second)
    return float(min(1.0, max(one, two)))


def size(print_) -> int:  # noqa: ANN001
    """How many characters of the normalised text the fingerprints cover (the release's left out)."""
    return int(print_.token_coverage)


# --- calibration ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Threshold:
    """When two submissions of one cell are near-copies: similarity at least `at`; None: the cell is too short
    to tell honest work from a copy (`why` says what the calibration measured)."""

    at: float | None
    why: str = ""


def calibration(path: Path = CALIBRATION) -> dict[tuple[str, str], Threshold]:
    """{(stage, grade id): Threshold} as `python -m quality.similarity --write` measured them."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {(stage, grade_id): Threshold(entry.get("threshold"), entry.get("why", ""))
            for stage, cells in data.get("cells", {}).items() for grade_id, entry in cells.items()}


# --- the class --------------------------------------------------------------------------------------------

@dataclass
class Group:
    """Submissions of one cell that are near-copies of each other (connected by similar pairs)."""

    assignment: str
    grade_id: str
    written: bool  # a written answer (else an exercise cell)
    members: list[str]  # students, and REFERENCE when the reference solution is one of them
    pairs: list[tuple[str, str, float]] = field(default_factory=list)  # every pair over the threshold

    @property
    def students(self) -> list[str]:
        return [member for member in self.members if member != REFERENCE]


@dataclass
class Findings:
    groups: list[Group]
    too_short: dict[tuple[str, str], str]  # cells too short to tell: why
    compared: dict[tuple[str, str], int]  # submissions compared per cell (the reference left out)
    thresholds: dict[tuple[str, str], float]

    def to_json(self) -> dict:
        return {"about": "near-copies per exercise and written answer (grading/outputs/similarity.py)",
                "groups": [{"assignment": g.assignment, "grade_id": g.grade_id, "written": g.written,
                            "members": g.members, "pairs": [list(pair) for pair in g.pairs]} for g in self.groups],
                "too_short": [{"assignment": stage, "grade_id": cell, "why": why}
                              for (stage, cell), why in sorted(self.too_short.items())],
                "compared": [{"assignment": stage, "grade_id": cell, "submissions": count,
                              "threshold": self.thresholds.get((stage, cell))}
                             for (stage, cell), count in sorted(self.compared.items())]}


def compare(submissions: dict[tuple[str, str], dict[str, str]], references: dict[tuple[str, str], str],
            boilerplate: dict[tuple[str, str], str], thresholds: dict[tuple[str, str], Threshold],
            written: set[tuple[str, str]] | None = None) -> Findings:
    """Every cell's near-copies. SUBMISSIONS: {(stage, grade id): {student: normalised text}}; REFERENCES and
    BOILERPLATE: {(stage, grade id): normalised text}; THRESHOLDS: the calibration. A cell without a threshold
    (not calibrated: a cell the course added since) is compared with the strictest one calibrated."""
    written = written or set()
    calibrated = [threshold.at for threshold in thresholds.values() if threshold.at is not None]
    fallback = max(calibrated) if calibrated else 0.9
    groups, too_short, compared, used = [], {}, {}, {}
    for key in sorted(set(submissions) | set(references)):
        texts = {student: text for student, text in submissions.get(key, {}).items() if text}
        compared[key] = len(texts)
        threshold = thresholds.get(key, Threshold(fallback))
        if threshold.at is None:
            too_short[key] = threshold.why
            continue
        used[key] = threshold.at
        if not texts:
            continue
        common = boilerplate_hashes(boilerplate.get(key, ""))
        alike: dict[str, list[str]] = {}  # one fingerprint per distinct text: a class that pasted one text is cheap
        if references.get(key):
            alike[references[key]] = [REFERENCE]
        for student, text in sorted(texts.items()):
            alike.setdefault(text, []).append(student)
        prints = {members[0]: fingerprint(text, common) for text, members in alike.items()}
        prints = {name: print_ for name, print_ in prints.items() if size(print_) >= MIN_CHARACTERS}
        alike = {text: members for text, members in alike.items() if members[0] in prints}
        pairs = _similar_pairs(prints, threshold.at) + [  # the same normalised text: each joined to the first
            (members[0], member, 1.0) for members in alike.values() for member in members[1:]]
        groups += [Group(key[0], key[1], key in written, members, [p for p in pairs if p[0] in members])
                   for members in _components(pairs)]
    return Findings(groups, too_short, compared, used)


def _similar_pairs(prints: dict, at: float) -> list[tuple[str, str, float]]:
    """(first, second, similarity) of every pair at or over AT; pairs without a common fingerprint are not
    compared (an index of the fingerprints says which pairs share one)."""
    index: dict[int, list[str]] = {}
    for name, print_ in prints.items():
        for value in print_.hashes:
            index.setdefault(value, []).append(name)
    candidates = set()
    for names in index.values():
        if len(names) > 1:
            candidates.update((a, b) for i, a in enumerate(names) for b in names[i + 1:])
    pairs = []
    for first, second in sorted(tuple(sorted(pair, key=_reference_first)) for pair in candidates):
        score = similarity(prints[first], prints[second])
        if score >= at:
            pairs.append((first, second, round(score, 3)))
    return sorted(pairs, key=lambda pair: (-pair[2], pair[0], pair[1]))


def _reference_first(name: str) -> tuple[int, str]:
    return (0, "") if name == REFERENCE else (1, name)


def _components(pairs: list[tuple[str, str, float]]) -> list[list[str]]:
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    for first, second, _ in pairs:
        parent[root(first)] = root(second)
    members: dict[str, list[str]] = {}
    for name in parent:
        members.setdefault(root(name), []).append(name)
    return sorted((sorted(group, key=_reference_first) for group in members.values()), key=lambda g: g[0])


def region_lines(released: str, submitted: str) -> list[str]:
    """The lines of SUBMITTED that are not the release's (what the student wrote in the cell)."""
    ours, theirs = released.splitlines(), submitted.splitlines()
    lines = []
    for operation, _, _, j1, j2 in difflib.SequenceMatcher(a=ours, b=theirs, autojunk=False).get_opcodes():
        if operation in ("replace", "insert"):
            lines += theirs[j1:j2]
    return [line for line in lines if line.strip() and line.strip() not in _BLANK]


# --- the class folder ---------------------------------------------------------------------------------------

def write(class_dir: Path, course: Path, records: dict, assignment_ids: list[str] | None = None) -> Path:
    """CLASS/similarity.json: the near-copies of the term (every student's latest notebook of every stage the
    records hold, `gradebook.term`) and of the reference solution (COURSE/solutions), for the class report."""
    from transformer_course.grading.outputs.files import write_text_atomically

    submissions: dict[tuple[str, str], dict[str, str]] = {}
    for student, record in records.items():
        for stage, entry in record.notebooks.items():
            if entry.status == "rejected" or (assignment_ids and stage not in assignment_ids):
                continue
            texts = entry.normalised if entry.normaliser == NORMALISER else _again(class_dir, student, stage)
            for grade_id, text in texts.items():
                submissions.setdefault((stage, grade_id), {})[student] = text
    references, boilerplate, written = {}, {}, set()
    for stage in sorted({stage for stage, _ in submissions}):
        try:
            solution = nbformat.read(course / "solutions" / stage / f"{stage}.ipynb", as_version=4)
            released = nbformat.read(class_dir / "release" / stage / f"{stage}.ipynb", as_version=4)
        except (OSError, ValueError):
            continue
        references.update({(stage, grade_id): text for grade_id, text in reference_cells(solution).items()})
        boilerplate.update({(stage, grade_id): text for grade_id, text in boilerplate_cells(released).items()})
        written |= {(stage, grade_id) for grade_id, cell in compared_cells(released).items()
                    if cell.cell_type == "markdown"}
    submissions = {key: texts for key, texts in submissions.items() if key in boilerplate}
    findings = compare(submissions, {key: references[key] for key in submissions if key in references},
                       boilerplate, calibration(), written)
    return write_text_atomically(class_dir / RESULTS, json.dumps(findings.to_json(), indent=1, ensure_ascii=False))


def _again(class_dir: Path, student: str, stage: str) -> dict[str, str]:
    """The normalised cells of a notebook the records keep in another normaliser's form, from the class folder's
    copy of it ({} when there is none)."""
    try:
        notebook = nbformat.read(class_dir / "submitted" / student / stage / f"{stage}.ipynb", as_version=4)
        released = nbformat.read(class_dir / "release" / stage / f"{stage}.ipynb", as_version=4)
    except (OSError, ValueError):
        return {}
    return normalised_cells(notebook, released)


def read(class_dir: Path) -> dict:
    """What the last run found (`write`), {} when nothing was written."""
    try:
        data = json.loads((class_dir / RESULTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
