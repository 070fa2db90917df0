"""nbgrader's Execute, made to survive a kernel that dies.

A student cell that calls `os._exit`, crashes the interpreter (segfault) or is killed for memory
makes plain nbgrader abandon the whole notebook, so every later grade cell scores 0 and the
instructor sees only a log line. `ResilientExecute` instead

1. records in the cell that killed the kernel an error a student can read;
2. starts a new kernel and replays, silently, the cells above that ran without error, so the
   notebook's state (imports, the student's classes) is back;
3. goes on with the next cell.

So a crash costs the cell that crashed (and nothing else). After `max_kernel_deaths` crashes the
remaining cells are marked as not run, so a notebook that crashes everywhere can't take forever.

It also grades defensively (see `transformer_course.grading.guard`): the stage's checks are
imported before the first cell, each grade cell runs with the re-binding guard line in front
(removed again afterwards), hidden test cells stay out of IPython's input history, and a cell
whose kernel reply says "error" counts as failed even when notebook code stopped the traceback
from being displayed.
"""

from __future__ import annotations

import copy
from typing import Any

from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import DeadKernelError
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_output
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Integer

from transformer_course.grading.guard import checks_module, guarded, is_grade_cell, prelude, unguarded

KERNEL_DIED = (
    "the Python process running your notebook stopped while running this cell (os._exit, a crash "
    "in native code, or more memory than allowed); this cell scores 0, the cells after it still ran"
)


def _failed(cell: NotebookNode) -> bool:
    return any(output.get("output_type") == "error" for output in cell.get("outputs", []))


class ResilientExecute(Execute):
    max_kernel_deaths = Integer(3, help="Kernel crashes tolerated per notebook before giving up.").tag(config=True)

    def reset_execution_trackers(self) -> None:
        super().reset_execution_trackers()
        self.kernel_deaths = 0
        self.checks: str | None = None  # the stage's checks module, found by the prelude
        self.prelude_done = False

    async def _run_prelude(self, cell_index: int) -> None:
        self.prelude_done = True
        self.checks = checks_module(self.nb)
        if self.checks:
            await self._execute_aside(new_code_cell(prelude(self.checks)), cell_index)

    async def _execute_aside(self, cell: NotebookNode, cell_index: int) -> None:
        """Run a cell whose outputs nobody keeps (nbclient would store it as cell `cell_index`)."""
        kept = self.nb.cells[cell_index]
        try:
            await super().async_execute_cell(cell, cell_index, execution_count=None, store_history=False)
        finally:
            self.nb.cells[cell_index] = kept

    async def async_execute_cell(
        self, cell: NotebookNode, cell_index: int, execution_count: int | None = None, store_history: bool = True
    ) -> NotebookNode:
        if cell.cell_type == "code" and self.kernel_deaths > self.max_kernel_deaths:
            cell.outputs = [new_output("error", ename="NotRun", evalue="not run: the kernel crashed too often above",
                                       traceback=["NotRun: the kernel crashed too often in the cells above"])]
            return cell
        # hidden tests stay out of IPython's input history (`In`, `_ih`), which a later student cell
        # could print into its output and so into the feedback
        store_history = store_history and "BEGIN HIDDEN TESTS" not in cell.get("source", "")
        if cell.cell_type == "code" and not self.prelude_done:
            await self._run_prelude(cell_index)
        guard = is_grade_cell(cell) and bool(self.checks)
        if guard:
            cell.source = guarded(cell.source, self.checks)
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        except DeadKernelError:
            self.kernel_deaths += 1
            self.log.warning("kernel died in cell %d; restarting and replaying the cells above", cell_index)
            cell.outputs = [new_output("error", ename="KernelDied", evalue=KERNEL_DIED,
                                       traceback=[f"KernelDied: {KERNEL_DIED}"])]
            if self.kernel_deaths <= self.max_kernel_deaths:
                await self._restart_and_replay(cell_index)
            return cell
        finally:
            if guard:
                cell.source = unguarded(cell.source)

    async def _check_raise_for_error(self, cell: NotebookNode, cell_index: int, exec_reply: dict | None) -> None:
        """A failed cell must show as failed: nbgrader scores by error outputs, and notebook code can
        stop IPython from displaying the traceback (`get_ipython().showtraceback = ...`)."""
        content = (exec_reply or {}).get("content", {})
        if content.get("status") == "error" and not _failed(cell):
            cell.outputs.append(new_output(
                "error", ename=content.get("ename", "Error"), evalue=content.get("evalue", ""),
                traceback=[f"{content.get('ename', 'Error')}: {content.get('evalue', '')}",
                           "(the grader found this error although the notebook hid its traceback)"]))
        await super()._check_raise_for_error(cell, cell_index, exec_reply)

    # nbconvert's preprocess_cell calls the synchronous wrapper, which the base class bound to its own
    # coroutine; rebind it to ours
    execute_cell = run_sync(async_execute_cell)

    async def _restart_and_replay(self, upto: int) -> None:
        assert self.km is not None
        if self.kc is not None:
            self.kc.stop_channels()
        await ensure_async(self.km.restart_kernel(now=True))
        self.kc = self.km.client()
        await ensure_async(self.kc.start_channels())
        await ensure_async(self.kc.wait_for_ready(timeout=self.startup_timeout))
        self.kc.allow_stdin = False
        await self._run_prelude(upto)
        for index, earlier in enumerate(self.nb.cells[:upto]):
            if earlier.cell_type == "code" and not _failed(earlier):
                replay: Any = copy.deepcopy(earlier)
                await self._execute_aside(replay, index)


class LimitOutputSize(NbGraderPreprocessor):
    """Cut every text output to `max_characters` (nbgrader's LimitOutput counts lines only, so one
    10-MB line would land whole in the autograded notebook, the gradebook and the feedback)."""

    max_characters = Integer(20_000, help="Characters kept per output.").tag(config=True)

    def preprocess_cell(self, cell: NotebookNode, resources: dict, index: int) -> tuple[NotebookNode, dict]:
        for output in cell.get("outputs", []):
            if isinstance(output.get("text"), str) and len(output.text) > self.max_characters:
                cut = len(output.text) - self.max_characters
                output.text = output.text[: self.max_characters] + f"\n... [{cut} more characters cut by the grader]\n"
            for kind, value in list(output.get("data", {}).items()):
                if isinstance(value, str) and len(value) > 10 * self.max_characters:
                    output.data[kind] = f"[{kind} output of {len(value)} characters removed by the grader]"
        return cell, resources


def with_resilient_execution(preprocessors: list) -> list:
    """nbgrader's autograde pipeline with ResilientExecute for Execute and LimitOutputSize after it."""
    replaced = []
    for preprocessor in preprocessors:
        name = preprocessor if isinstance(preprocessor, str) else preprocessor.__name__
        if name.rsplit(".", 1)[-1] == "Execute":
            replaced += [ResilientExecute, LimitOutputSize]
        else:
            replaced.append(preprocessor)
    return replaced
