"""Stage 2's bug hunt, measured as the notebook measures it: a small Transformer (`Copier`: nn.Transformer with the
course's embeddings and positional encoding) trained on the copy task with the look-ahead mask planted in the
student notebook (`.triu()`, the transposed triangle) reaches a training loss near 0 and copies every symbol with
teacher forcing but almost none when decoding greedily; with the correct mask both ways copy. These are the symptoms
the lesson asks students to reason from (lessons/02_attention.py, section 7), on the notebook's own settings (400
steps, seed 0, 200 test sequences drawn with seed 1)."""

import pytest
import torch

from transformer_course.reference import make_look_ahead_mask
from transformer_course.reference.copy_task import BOS, LENGTH, copy_batch, copy_two_ways, train_copier


def planted(size: int) -> torch.Tensor:
    """The classmate's mask of the bug hunt: the upper triangle, diagonal included."""
    return torch.ones(size, size, dtype=torch.bool).triu().unsqueeze(0).unsqueeze(0)


def copied(make_mask) -> tuple[float, float, float]:
    """(last training loss, share copied with teacher forcing, share copied greedily), as the notebook computes them."""
    torch.set_num_threads(1)
    model, losses = train_copier(make_mask, steps=400)
    source, _, _ = copy_batch(200, torch.Generator().manual_seed(1))
    forced, written = copy_two_ways(model, source, make_mask)
    return (losses[-1], (forced == source).double().mean().item(), (written == source).double().mean().item())


def test_the_package_copies_as_the_notebook_did():
    """`copy_two_ways`, which the notebook calls, gives what its own loop gave before it moved into the package."""
    torch.set_num_threads(1)
    model, _ = train_copier(make_look_ahead_mask, steps=20)
    source, decoder_in, _ = copy_batch(50, torch.Generator().manual_seed(1))
    with torch.no_grad():
        forced = model(source, decoder_in, make_look_ahead_mask(LENGTH + 1)).argmax(dim=-1)[:, :LENGTH]
        written = torch.full((50, 1), BOS)
        for _ in range(LENGTH):
            logits = model(source, written, make_look_ahead_mask(written.size(1)))
            written = torch.cat([written, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    package_forced, package_written = copy_two_ways(model, source, make_look_ahead_mask)
    assert torch.equal(package_forced, forced) and torch.equal(package_written, written[:, 1:])


@pytest.mark.parametrize("mask", ["planted", "correct"])
def test_the_copy_task_shows_the_symptom_of_the_planted_mask_and_none_of_the_correct_one(mask):
    loss, teacher_forced, greedy = copied(planted if mask == "planted" else make_look_ahead_mask)
    assert loss < 0.05 and teacher_forced > 0.99, (loss, teacher_forced)  # training looks perfect either way
    if mask == "planted":
        assert greedy < 0.2, greedy  # "the same model, writing on its own, gets most symbols wrong"
    else:
        assert greedy > 0.95, greedy  # after the repair, greedy decoding copies too
