"""Grading: taking a class's notebooks in, running them where they can harm nothing, and what instructors read.

One folder per role; imports run one way (tests/test_layout.py holds them to it):

    intake/      submissions and identities: a downloads folder as it comes, each file checked, repaired or
                 refused with a reason
    sandbox/     the security boundary: the student's confined processes (`isolation`), the process that runs
                 their notebooks (`runner`, `seal`) and the grader's side of that channel (`executor`)
    gradebook/   nbgrader's gradebook and class folder (`class_folder`) and its configuration (`config`)
    outputs/     what instructors read: scores (`scores`), feedback without hidden tests (`feedback`), the
                 class report (`report`), written answers (`answers`), files for the LMS (`lms`)
    classroom/   grading a class with one command: the batch command (`batch`) and one student's
                 grading process (`worker`)

Allowed imports between them (and every folder may use `cells`, what a notebook's cells are):
intake, sandbox, gradebook: nothing else of grading; outputs: gradebook and intake; classroom: all.
`batch.py`, `answers.py`, `lms.py` and `report.py` beside this file are the documented command lines
(`python -m transformer_course.grading.batch ...`), two lines each.
The course's own quality tools (mistake catalog, mutations, example classes) live in `quality/` at the
repository root, outside the package students install.
"""


import sys

# nbformat imports jsonschema, whose format checkers import rfc3987_syntax when it is installed (nbformat
# asks for jsonschema[format-nongpl]); rfc3987_syntax builds some 35 Lark parsers as it is imported:
# 0.7 s in every grading process (the batch command, each worker), for the "iri" format, which no notebook
# or nbgrader schema uses (python-jsonschema/jsonschema#1428). Refusing the import leaves that one format
# unchecked and changes nothing else (tests/test_grading_speed.py).
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
