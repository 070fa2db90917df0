"""Grading layer: nbgrader plug-ins and instructor tools (top of the package)."""

import sys

# nbformat imports jsonschema, whose format checkers import rfc3987_syntax when it is installed (nbformat
# asks for jsonschema[format-nongpl]); rfc3987_syntax builds some 35 Lark parsers as it is imported:
# 0.7 s in every grading process (the batch command, each worker), for the "iri" format, which no notebook
# or nbgrader schema uses (python-jsonschema/jsonschema#1428). Refusing the import leaves that one format
# unchecked and changes nothing else (tests/test_grading_speed.py).
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
