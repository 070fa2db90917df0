"""One source of truth: the committed notebooks are exactly what the build produces."""

from conftest import ASSIGNMENTS, ROOT
from transformer_course.authoring import check, definition_source


def test_there_is_a_lesson_per_stage_so_far():
    """Stages 1, 2, ... without gaps; stage 0 (why attention, optional) comes before them."""
    numbered = [name for name in ASSIGNMENTS if name != "00_why_attention"]
    assert numbered[0] == "01_positional_encoding"
    assert [name[:2] for name in numbered] == [f"{n:02d}" for n in range(1, len(numbered) + 1)]


def test_committed_solutions_and_student_notebooks_are_current():
    stale = check(ROOT)
    assert not stale, (
        f"these committed files differ from a fresh build: {stale}\n"
        "run: python -m transformer_course.authoring build"
    )


def test_include_splices_the_reference_definition():
    source = definition_source("transformer_course.reference.positional_encoding:PositionalEncoding")
    assert source.startswith("class PositionalEncoding(nn.Module):")
    assert "### BEGIN SOLUTION" in source and source.rstrip().endswith("return self.dropout(x)")
