"""A notebook's JSON without its saved outputs and without values nested too deeply, cut out of the
file's bytes without parsing them: what the grader reads of a file too large, or too deep, to parse.

A notebook's saved outputs can be hundreds of MB (one printed tensor, a plot saved a thousand times)
and a JSON value can be nested deeper than Python's parser goes (it stops near 1,000 levels). Neither
is graded: outputs are never read (the grader runs every cell again), and no notebook field is
nested more than a few levels. This module walks the notebook's structure (the top object, its
`cells`, each cell's fields; version 3's `worksheets`), copies what it keeps byte for byte, and
writes `[]` for every cell's `outputs`, `{}` for pasted images (`attachments`) and the notebook's
own metadata, and `null` for any value nested deeper than the limit. Values it leaves out are
skipped by counting brackets, strings matched whole, at the speed of Python's regular expressions
(300 MB in about a second): their insides are not checked, since nothing reads them.

It runs as its own process (`trimmed` starts it), stdlib only, with the file handed over as an open
descriptor: limited in time and memory, so a file made to exhaust either costs only itself:

    python trim.py FD DEPTH KEPT_BYTES     writes a JSON header line, then the trimmed text

The header: {"digest": sha256 of the whole file, "outputs": bytes of outputs left out,
"attachments": bytes of pasted images left out, "deep": values left out for their depth}. On a
file it cannot trim, it exits with status 3 and one line on stderr saying why, in a student's words.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import resource
import sys

_SPACE = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_SCALAR = re.compile(rb'[^ \t\n\r,:\[\]{}"]+')
# everything up to the next bracket that is not inside a string, strings matched whole
_NO_BRACKETS = re.compile(rb'(?:[^"\[\]{}]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+', re.DOTALL)
_OPENING, _CLOSING = re.compile(rb"[\[{]+"), re.compile(rb"[\]}]+")
_LEFT_OUT = {"outputs": b"[]", "attachments": b"{}", "metadata": b"{}"}


class TrimError(ValueError):
    """The file cannot be trimmed; the message says why, to the student."""


class Trimmer:
    def __init__(self, data: bytes | mmap.mmap, depth: int, kept_bytes: int) -> None:
        self.data, self.depth, self.kept_bytes = data, depth, kept_bytes
        self.capped: dict[int, re.Pattern[bytes]] = {}  # runs of opening brackets read no further than needed
        self.pieces: list[bytes] = []
        self.kept = 0
        self.left_out = {"outputs": 0, "attachments": 0, "deep": 0}

    def trim(self) -> bytes:
        start = 3 if self.data[:3] == b"\xef\xbb\xbf" else 0
        if self.data[start:start + 2] in (b"\xff\xfe", b"\xfe\xff"):
            raise TrimError("the file is saved as UTF-16 or UTF-32 text; save it as UTF-8")
        if b"\0" in self.data[start:start + 4]:
            raise TrimError("the file is not UTF-8 text (it holds zero bytes): is it really a .ipynb notebook?")
        end = self.value(self._space(start), "notebook", 0)
        if self._space(end) != len(self.data):
            raise TrimError(f"the JSON goes on after the notebook ends (at byte {end:,})")
        return b"".join(self.pieces)

    # --- reading -----------------------------------------------------------------------------------

    def _space(self, position: int) -> int:
        return _SPACE.match(self.data, position).end()  # type: ignore[union-attr]

    def _char(self, position: int) -> bytes:
        if position >= len(self.data):
            raise TrimError("the file ends in the middle of the notebook (is it cut short?)")
        return self.data[position:position + 1]

    def _expect(self, position: int, char: bytes) -> int:
        position = self._space(position)
        if self._char(position) != char:
            raise TrimError(f"the JSON is broken at byte {position:,} (expected {char.decode()!r})")
        return position + 1

    def _emit(self, piece: bytes) -> None:
        self.kept += len(piece)
        if self.kept > self.kept_bytes:
            raise TrimError(f"apart from its saved outputs, the notebook holds more than "
                            f"{self.kept_bytes / 2**20:g} MB, far more than a notebook of this course")
        self.pieces.append(piece)

    def skip(self, position: int, deepest: int | None = None) -> tuple[int, int]:
        """(the end, the depth) of the array or object at POSITION; with DEEPEST, (-1, depth) as soon as
        it nests deeper than that. Brackets are counted, not matched: what is skipped is not read."""
        depth = most = 0
        if deepest is not None and deepest not in self.capped:
            self.capped[deepest] = re.compile(rb"[\[{]{1,%d}" % (deepest + 1))
        opening = _OPENING if deepest is None else self.capped[deepest]
        while True:
            position = _NO_BRACKETS.match(self.data, position).end()  # type: ignore[union-attr]
            char = self._char(position)
            if char in (b"[", b"{"):
                run = opening.match(self.data, position).end()  # type: ignore[union-attr]
                depth, position = depth + run - position, run
                most = max(most, depth)
                if deepest is not None and most > deepest:
                    return -1, most
            elif char in (b"]", b"}"):
                run = _CLOSING.match(self.data, position).end()  # type: ignore[union-attr]
                if run - position >= depth:
                    return position + depth, most
                depth, position = depth - (run - position), run
            else:  # a quote that opens no string: the file ends inside one
                raise TrimError(f"a text in the file never ends (from byte {position:,}): is the file cut short?")

    def value(self, position: int, role: str, depth: int) -> int:
        """Copy (or leave out) the value at POSITION; returns where it ends."""
        position = self._space(position)
        char = self._char(position)
        if role in _LEFT_OUT:
            end = self.skip(position)[0] if char in (b"[", b"{") else self._scalar_end(position)
            if role != "metadata":
                self.left_out[role] += end - position
            self._emit(_LEFT_OUT[role])
            return end
        if char == b"{" and role in ("notebook", "cell", "worksheet"):
            return self.members(position, role, depth)
        if char == b"[" and role in ("cells", "worksheets"):
            return self.items(position, "cell" if role == "cells" else "worksheet", depth)
        if char in (b"[", b"{"):
            if depth >= self.depth:
                end = self.skip(position)[0]
                self.left_out["deep"] += 1
                self._emit(b"null")
                return end
            end, _ = self.skip(position, self.depth - depth)
            if end >= 0:  # shallow enough: copied as it is
                self._emit(self.data[position:end])
                return end
            return self.members(position, "", depth) if char == b"{" else self.items(position, "", depth)
        end = self._scalar_end(position)
        self._emit(self.data[position:end])
        return end

    def _scalar_end(self, position: int) -> int:
        found = (_STRING if self._char(position) == b'"' else _SCALAR).match(self.data, position)
        if not found:
            raise TrimError(f"the JSON is broken at byte {position:,}")
        return found.end()

    def members(self, position: int, role: str, depth: int) -> int:
        """An object: each member's value by its role ("outputs" of a cell is left out, ...)."""
        self._emit(b"{")
        position = self._space(position + 1)
        if self._char(position) == b"}":
            self._emit(b"}")
            return position + 1
        while True:
            key = _STRING.match(self.data, position)
            if not key:
                raise TrimError(f"the JSON is broken at byte {position:,} (expected a field name)")
            self._emit(key.group())
            self._emit(b":")
            position = self.value(self._expect(key.end(), b":"), _member_role(role, key.group()), depth + 1)
            position = self._space(position)
            char = self._char(position)
            if char == b"}":
                self._emit(b"}")
                return position + 1
            position = self._space(self._expect(position, b","))
            self._emit(b",")

    def items(self, position: int, role: str, depth: int) -> int:
        """An array: each item with ROLE (a cell of `cells`, a worksheet of `worksheets`)."""
        self._emit(b"[")
        position = self._space(position + 1)
        if self._char(position) == b"]":
            self._emit(b"]")
            return position + 1
        while True:
            position = self._space(self.value(position, role, depth + 1))
            if self._char(position) == b"]":
                self._emit(b"]")
                return position + 1
            position = self._expect(position, b",")
            self._emit(b",")


def _member_role(role: str, key: bytes) -> str:
    """What a member of an object with ROLE is, by its key (as written: an escaped key is just data)."""
    if role == "notebook":
        return {b'"cells"': "cells", b'"worksheets"': "worksheets", b'"metadata"': "metadata"}.get(key, "")
    if role == "worksheet":
        return "cells" if key == b'"cells"' else ""
    if role == "cell":
        return {b'"outputs"': "outputs", b'"attachments"': "attachments"}.get(key, "")
    return ""


def main(argv: list[str]) -> int:
    descriptor, depth, kept_bytes = (int(argument) for argument in argv)
    size = os.fstat(descriptor).st_size
    # room for the interpreter, the mapped file and what is kept (the kept pieces and their join)
    memory = size + 4 * kept_bytes + 512 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        if not size:
            raise TrimError("the file is empty")
        with mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ) as data:
            data.madvise(mmap.MADV_SEQUENTIAL)
            digest = hashlib.sha256(data).hexdigest()
            trimmer = Trimmer(data, depth, kept_bytes)
            text = trimmer.trim()
    except TrimError as error:
        print(error, file=sys.stderr)
        return 3
    except (RecursionError, MemoryError):
        print("the file's structure is too large or too deep to read", file=sys.stderr)
        return 3
    header = {"digest": digest, **trimmer.left_out}
    sys.stdout.buffer.write(json.dumps(header).encode() + b"\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
