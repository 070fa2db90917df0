"""Built-in example submissions: a correct one, a blank one and one with a single known bug.

They are made from the committed notebooks at run time (never stored), so they can't go stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import nbformat


@dataclass(frozen=True)
class Mutation:
    """A realistic student mistake: replace `find` by `replace` in the solution code."""

    description: str
    find: str
    replace: str

    def apply(self, notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
        hits = [cell for cell in notebook.cells if self.find in cell.source and is_solution(cell)]
        if len(hits) != 1:
            raise ValueError(f"mutation {self.description!r}: expected one solution cell with {self.find!r}, "
                             f"found {len(hits)}")
        hits[0].source = hits[0].source.replace(self.find, self.replace)
        return notebook


def is_solution(cell: nbformat.NotebookNode) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution"))


# One representative bug per stage for the demo and the end-to-end test; the full mistake
# catalog lives with the checks.
KNOWN_BUGS: dict[str, Mutation] = {
    "01_positional_encoding": Mutation(
        "cos written to the even columns as well (no sin)",
        "pe[:, 0::2] = torch.sin(position * div_term)",
        "pe[:, 0::2] = torch.cos(position * div_term)",
    ),
    "02_attention": Mutation(
        "scores not divided by sqrt(d_k)",
        "scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)",
        "scores = Q @ K.transpose(-2, -1)",
    ),
    "03_blocks": Mutation(
        "no residual connection around the feed-forward sublayer (encoder)",
        "x = self.norm2(x + self.dropout(self.feed_forward(x)))",  # only EncoderBlock has this line
        "x = self.norm2(self.dropout(self.feed_forward(x)))",
    ),
    "04_transformer": Mutation(
        "encoder embeddings not scaled by sqrt(d_model)",
        "x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, src_len, d_model)",
        "x = self.embedding(x)  # (batch, src_len, d_model)",
    ),
    "05_training": Mutation(
        "target not shifted: the decoder is asked to predict the token it already reads",
        "tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]",
        "tgt_in, tgt_out = tgt[:, :-1], tgt[:, :-1]",
    ),
    "06_decoding": Mutation(
        "finished sentences are not padded: they keep producing words after <eos>",
        "        next_token = next_token.masked_fill(finished, pad_idx)  # finished sentences only get padding\n",
        "",
    ),
}


def student_submissions(root: Path, assignments: list[str]) -> dict[str, dict[str, nbformat.NotebookNode]]:
    """{student: {assignment: notebook}} for the three example students."""
    submissions: dict[str, dict[str, nbformat.NotebookNode]] = {"ada": {}, "blake": {}, "chen": {}}
    for assignment in assignments:
        name = f"{assignment}/{assignment}.ipynb"
        solution = nbformat.read(root / "solutions" / name, as_version=4)
        submissions["ada"][assignment] = solution  # everything right
        submissions["blake"][assignment] = nbformat.read(root / "notebooks" / name, as_version=4)  # blank
        buggy = nbformat.read(root / "solutions" / name, as_version=4)
        if assignment in KNOWN_BUGS:
            KNOWN_BUGS[assignment].apply(buggy)
        submissions["chen"][assignment] = buggy  # one bug per stage
    return submissions
