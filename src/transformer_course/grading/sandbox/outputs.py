"""A cell's outputs as the student's runner sends them, checked field by field before the grader uses them.

The runner (`runner.CellRecorder`) sends a list of plain dicts in nbformat's shape. The runner is the
student's process: it may send anything the channel can carry (a `data` that is a list, a traceback that is
a number, a million outputs). `cell_outputs` accepts exactly the shapes the runner makes and refuses
everything else with `MalformedOutputs`, which fails that one cell (the session ends the runner), never the
grader. `OutputBudget` bounds what one notebook's outputs may keep, in memory and then on disk (the
autograded copy, the gradebook, the feedback): past it, a cell's outputs are left out and the notebook's
row says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_OUTPUTS = 2_000  # outputs one cell may send (a display per line of a long loop stays far below)
MAX_TRACEBACK_LINES = 200
OUTPUT_KINDS = ("stream", "display_data", "execute_result", "error")


class MalformedOutputs(ValueError):
    """The runner sent outputs that are not in the runner's shape: the student's code wrote them."""


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise MalformedOutputs(f"{field} is a {type(value).__name__}, not text")
    return value


def _output(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedOutputs(f"an output is a {type(value).__name__}, not a record")
    kind = value.get("output_type")
    if kind not in OUTPUT_KINDS:
        raise MalformedOutputs("an output of an unknown kind")
    if kind == "stream":
        name = value.get("name")
        if name not in ("stdout", "stderr"):
            raise MalformedOutputs("a stream that is neither stdout nor stderr")
        return {"output_type": kind, "name": name, "text": _text(value.get("text"), "a stream's text")}
    if kind == "error":
        traceback = value.get("traceback", [])
        if not isinstance(traceback, list) or len(traceback) > MAX_TRACEBACK_LINES:
            raise MalformedOutputs("an error's traceback is not a short list of lines")
        return {"output_type": kind, "ename": _text(value.get("ename"), "an error's name"),
                "evalue": _text(value.get("evalue"), "an error's text"),
                "traceback": [_text(line, "a traceback line") for line in traceback]}
    data = value.get("data")
    if not isinstance(data, dict):
        raise MalformedOutputs(f"a display's data is a {type(data).__name__}, not a record")
    checked = {_text(mime, "a display's kind of data"): _text(content, "a display's data")
               for mime, content in data.items()}
    output: dict[str, Any] = {"output_type": kind, "data": checked}
    if kind == "execute_result":
        count = value.get("execution_count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
            raise MalformedOutputs("an execution count that is not a number")
        output["execution_count"] = count
    return output


def cell_outputs(value: Any) -> list[dict[str, Any]]:
    """The outputs of one cell (`value`: the `outputs` field of the runner's `cell-done` message), each rebuilt
    with only the fields the grader reads, of the types it expects; MalformedOutputs for anything else."""
    if not isinstance(value, list):
        raise MalformedOutputs(f"the outputs are a {type(value).__name__}, not a list")
    if len(value) > MAX_OUTPUTS:
        raise MalformedOutputs(f"{len(value)} outputs in one cell, more than {MAX_OUTPUTS}")
    return [_output(output) for output in value]


def size_of(output: dict[str, Any]) -> int:
    """Bytes an output takes in the autograded notebook (its texts, UTF-8), near enough for a budget."""
    texts = [output.get("text", ""), output.get("ename", ""), output.get("evalue", ""),
             *output.get("traceback", []), *output.get("data", {}).keys(), *output.get("data", {}).values()]
    return sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)


@dataclass
class OutputBudget:
    """The bytes of output one notebook may keep (`limit`); what is past it is left out, and `spent_at`
    names the first cell that went over."""

    limit: int = 16 * 2**20
    used: int = 0
    spent_at: str | None = None

    def keep(self, outputs: list[dict[str, Any]], cell: str) -> list[dict[str, Any]]:
        """`outputs` as far as the budget allows: whole outputs while they fit, then one line saying the rest
        was left out (errors are kept when they fit: they say why a cell failed)."""
        kept = []
        for output in outputs:
            size = size_of(output)
            if self.spent_at is None and self.used + size <= self.limit:
                self.used += size
                kept.append(output)
                continue
            if self.spent_at is None:
                self.spent_at = cell
            note = (f"[outputs left out: this notebook's outputs passed the grader's budget of "
                    f"{self.limit / 2**20:g} MB]\n")
            if not kept or kept[-1].get("text") != note:
                kept.append({"output_type": "stream", "name": "stderr", "text": note})
        return kept

    def reason(self) -> str | None:
        """The row's reason when the budget was spent, else None."""
        if self.spent_at is None:
            return None
        return (f"its outputs passed the grader's budget of {self.limit / 2**20:g} MB at {self.spent_at}: the outputs "
                "from there on were left out (every cell still ran and was graded)")
