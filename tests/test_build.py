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


def test_cell_ids_come_from_names_or_content_not_position():
    from transformer_course.authoring import cell_id

    taken: set[str] = set()
    first = cell_id("03_blocks", "markdown", "## Residual connections", taken)
    assert first.startswith("03-") and len(first) == 11
    taken.add(first)
    # the same cell elsewhere in the lesson, after a cell was inserted above it: the same id
    assert cell_id("03_blocks", "markdown", "## Residual connections", set()) == first
    # two cells with the same text are told apart in their order
    assert cell_id("03_blocks", "markdown", "## Residual connections", taken) == f"{first}-2"
    assert cell_id("03_blocks", "code", "## Residual connections", set()) != first


def test_one_stage_is_named_by_number_or_name():
    from transformer_course.authoring import named_assignments

    assert named_assignments(ROOT, ["03"]) == ["03_blocks"] == named_assignments(ROOT, ["03_blocks"])
    assert named_assignments(ROOT, ["3", "0"]) == ["03_blocks", "00_why_attention"]
