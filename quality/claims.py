"""Judge every cause the checks claim against the edit a mutant planted (issue 41: "the engine says what it saw
or nothing").

The held-out catalog is judged by what its edit did; so is a mutant here. Each failing grade cell's
`likely cause:` text is read as claims, and each claim is one of
- *correct*: it is about the student line the edit changed (each clause that starts on a quoted line is read
  on its own, its subject being the first line it quotes) (the changed statement, or for a deleted statement
  the line before the gap) and its words fit the kind of edit;
- *vague*: it quotes no student line and its words fit the kind of edit, or no cause is given (acceptable);
- *false*: a clause is about a student line the edit did not change ("a cause about a line that was not changed"),
  or it says something the edit did not do: that a value is unused where the edit removed nothing, that two
  values are swapped where the edit swapped nothing, that something is applied twice where the edit
  repeated nothing, that a step is missing where the edit removed nothing, that two steps are in another
  order where the edit moved nothing.

A line the edit did not change may be quoted as where a changed value *arrives*, when the quoted line reads a
value the edit changed: after an edit that removes or replaces a value (a deleted statement, a dropped call,
another variable) as "X receives A where the reference gives it B"; after any other edit only as the same
value changed ("receives 0.25 × the output of self.embedding where the reference gives it 4 × ..."). Observations (the
crash's line, "what happened there") are not claims and are not read.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from quality.inprocess import GradeOutcome
from quality.mutations import Mutant
from transformer_course.checks.framework import CAUSE_LABEL, CODE_LABEL, IDEA_LABEL

VERDICTS = ("correct", "vague", "false")

# the engine's quotes of a student line: "in `forward`, line 3 (`x = ...`)", "after line 3 of `forward` (`...`)"
_QUOTE = re.compile(r"(?P<after>after )?(?:in `(?P<function>\w+)`, )?line (?P<number>\d+)"
                    r"(?: of `(?P<function2>\w+)`)? \(`(?P<code>[^`\n]*)`\)")

# What a claim's words say the edit did, and the kinds of edit that can make each true.
UNUSED = re.compile(r"nothing uses the result|is never used|is not used|never read")
SWAPPED = re.compile(r"\bare swapped\b|\bthe two are swapped\b")
TWICE = re.compile(r"\btwice\b|\bappl(?:y|ies|ied)(?: the [\w ]+)? again\b|more than once")
MISSING = re.compile(r"\bis never called\b|\bis missing\b|\bmissing step\b|\bis not applied\b|\bnever applied\b")
MAY_CLAIM = {
    "unused": {"delete_statement", "swap_variable", "swap_arguments", "drop_call", "swap_operands",
               "duplicate_call"},
    "swapped": {"swap_arguments", "swap_operands", "swap_variable", "change_axis", "replace_operator",
                "swap_comparison", "drop_call", "delete_statement", "off_by_one"},
    "twice": {"duplicate_call", "swap_variable", "delete_statement", "swap_arguments"},
    "missing": {"delete_statement", "drop_call", "swap_variable", "swap_arguments", "replace_operator",
                "change_constant", "change_axis", "off_by_one", "swap_comparison"},
}
ORDER = re.compile(r"in another order|\bcomes later\b|\bcomes after\b")
MAY_CLAIM["order"] = {"swap_variable", "swap_arguments", "swap_operands", "duplicate_call"}
WORDS = {"unused": UNUSED, "swapped": SWAPPED, "twice": TWICE, "missing": MISSING, "order": ORDER}


@dataclass(frozen=True)
class Claim:
    """One `likely cause:` text of one failing grade cell, judged."""

    grade_id: str
    text: str
    verdict: str  # correct | vague | false
    why: str = ""


def _norm(code: str) -> str:
    return re.sub(r"\s+", "", code)


def causes(message: str) -> list[str]:
    """The `likely cause:` texts of a message (up to the next folded label or the end of its paragraph)."""
    found = []
    for part in message.split(CAUSE_LABEL)[1:]:
        for label in (IDEA_LABEL, CODE_LABEL, "\n  expected:", "\n  got:", "\n\n"):
            part = part.partition(label)[0]
        found.append(" ".join(part.split()))
    return [text for text in found if text]


def _statement_lines(mutant: Mutant) -> tuple[set[str], set[str], list[str]]:
    """(the lines the edit wrote, the lines it removed, the exercise cell's code before the edit, as lines)."""
    find, replace = mutant.edit.find.splitlines(), mutant.edit.replace.splitlines()
    common = 0
    while common < min(len(find), len(replace)) and find[common] == replace[common]:
        common += 1
    # the widened prefix (lines before the statement) is common; a multi-line statement's unchanged lines too
    written = {_norm(line) for line in replace[common:] if line.strip()}
    removed = {_norm(line) for line in find[common:] if line.strip()}
    tree_lines: list[str] = []
    try:
        for node in ast.walk(ast.parse(mutant.module_source)):
            if isinstance(node, ast.stmt) and node.lineno <= node.end_lineno and _norm(mutant.mutated) in _norm(
                    ast.get_source_segment(mutant.module_source, node) or "") and not isinstance(
                    node, ast.FunctionDef | ast.ClassDef | ast.For | ast.If | ast.With | ast.While | ast.Module):
                segment = ast.get_source_segment(mutant.module_source, node) or ""
                tree_lines = segment.splitlines()
                break
    except SyntaxError:
        pass
    written |= {_norm(line) for line in tree_lines if line.strip()}
    return written, removed, mutant.module_source.splitlines()


def _positions(mutant: Mutant, code: str) -> tuple[int | None, list[int]]:
    """(the changed line's index in the mutated module, the indices of the lines that read like `code`)."""
    lines = [_norm(line) for line in mutant.module_source.splitlines()]
    changed = next((index for index, line in enumerate(lines) if line and line == _norm(mutant.mutated)), None)
    return changed, [index for index, line in enumerate(lines) if line and line == _norm(code)]


def _reads_a_changed_value(mutant: Mutant, code: str) -> bool:
    """The quoted line comes after the changed one and reads a name the edited statement assigns (or, deleted,
    would have): the value arriving there is the one the edit changed."""
    changed, quoted = _positions(mutant, code)
    if changed is None or not any(changed < index <= changed + 40 for index in quoted):
        return False
    targets = {target.removeprefix("self.") for target in mutant.targets}
    try:
        names = {node.id for node in ast.walk(ast.parse(code.strip().removesuffix(":") or "pass"))
                 if isinstance(node, ast.Name)}
    except SyntaxError:
        names = set(re.findall(r"[A-Za-z_]\w*", code))
    return bool(targets & names)


def _before_the_gap(mutant: Mutant, code: str) -> bool:
    """For a deleted statement (or a dropped call): the quoted line comes just before the changed one."""
    changed, quoted = _positions(mutant, code)
    return changed is not None and any(changed - 12 <= index < changed for index in quoted)


# Edits that change which value a later line receives (a statement or call gone, another variable used): a line
# after them that they did not change may be said to receive another value than the reference's.
STRUCTURAL = ("delete_statement", "drop_call", "swap_variable")
_CLAUSE = re.compile(r"; (?=in `\w+`, line \d+|after line \d+)")


_RECEIVES = re.compile(r"receives (?P<got>.+?) (?:as (?:its|the) \w+ )?where the reference gives it "
                       r"(?P<wanted>.+?)(?:[;:]|$)")
_FACTOR = re.compile(r"^(?:-?[\d.]+(?:e[-+]?\d+)? × "
                     r"|a value that is none of the inputs and none of the parts' outputs)")


def _same_source_changed(text: str) -> bool:
    """"X receives 0.25 × the output of self.embedding where the reference gives it 4 × the output of
    self.embedding": the same value changed, which an edit upstream makes true on any later line (naming another
    source there, "the output of self.norm2 where the reference gives it the output of self.norm1", is not)."""
    found = _RECEIVES.search(text)
    if found is None:
        return False
    got, wanted = (_FACTOR.sub("", part).partition(" (")[0].strip() for part in found.group("got", "wanted"))
    return got == wanted or not got


def clauses(text: str) -> list[str]:
    """A cause cut where it starts on another quoted line ("...; in `forward`, line 33 (`...`): ...")."""
    return [part for part in _CLAUSE.split(text) if part.strip()]


def _judge_clause(mutant: Mutant, text: str) -> tuple[str, str]:
    written, _, _ = _statement_lines(mutant)
    quotes = list(_QUOTE.finditer(text))
    said = {name for name, words in WORDS.items() if words.search(text)}
    wrong_words = sorted(name for name in said if mutant.kind not in MAY_CLAIM[name])
    if wrong_words:
        return "false", f"says {', '.join(wrong_words)} of a {mutant.kind} edit"
    if not quotes:
        return ("false", "says a result is unused without quoting the edited line") if "unused" in said else (
            "vague", "")
    if _norm(quotes[0]["code"]) in written:  # the clause's subject, its first quote: the others say where from
        return "correct", ""
    elsewhere = [quote for quote in quotes[:1] if not (
        ((quote["after"] or "missing" in said) and mutant.kind in ("delete_statement", "drop_call")
         and _before_the_gap(mutant, quote["code"]))
        or ("unused" not in said and (mutant.kind in STRUCTURAL or _same_source_changed(text))
            and _reads_a_changed_value(mutant, quote["code"])))]
    if elsewhere:
        return "false", f"quotes lines the edit did not change: {'; '.join(quote['code'] for quote in elsewhere)}"
    return "vague", "quotes where the changed value arrives or the step belongs, not the changed line"


def judge(mutant: Mutant, grade_id: str, text: str) -> Claim:
    """One cause text against the mutant's edit: false when any of its clauses is, else correct when one quotes
    the changed line, else vague."""
    judged = [_judge_clause(mutant, clause) for clause in clauses(text)] or [("vague", "")]
    for verdict in ("false", "correct", "vague"):
        found = [why for got, why in judged if got == verdict]
        if found:
            return Claim(grade_id, text, verdict, found[0])
    raise AssertionError(judged)


def judge_outcomes(mutant: Mutant, outcomes: dict[str, GradeOutcome]) -> list[Claim]:
    """Every cause claimed by the failing grade cells of one mutant; a failing cell with no cause is vague."""
    claims = []
    for grade_id, outcome in outcomes.items():
        if outcome.passed:
            continue
        texts = causes(outcome.message)
        if not texts:
            claims.append(Claim(grade_id, "", "vague", "no cause given"))
        claims += [judge(mutant, grade_id, text) for text in texts]
    return claims


def tally(claims: Iterable[Claim]) -> Counter:
    counted = Counter(claim.verdict for claim in claims)
    return Counter({verdict: counted.get(verdict, 0) for verdict in VERDICTS})
