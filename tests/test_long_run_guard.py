"""Stage 5's guard before the long training run (`checks.training.before_the_long_run`): it stops the run while a
check of the notebook fails, and never on honest work, a prediction noted for grading included."""

import pytest
import torch

from transformer_course.checks import framework
from transformer_course.checks import training as check
from transformer_course.reference.training import compute_loss, train_epoch


@pytest.fixture(autouse=True)
def kernel_state():
    """The checks' record of a notebook's kernel, empty for each test and restored after it."""
    saved = dict(framework._RESULTS), dict(framework._LATEST)
    framework._RESULTS.clear()
    framework._LATEST.clear()
    yield
    framework._RESULTS.clear()
    framework._LATEST.clear()
    framework._RESULTS.update(saved[0])
    framework._LATEST.update(saved[1])


def train_epoch_without_train_mode(model, batches, criterion, optimizer, scheduler=None, device="cpu", clip_norm=1.0,
                                   max_steps=None, progress=True):
    """A train_epoch that leaves the model in whatever mode evaluate() left it in."""
    total, tokens = 0.0, 0
    for batch in batches:
        optimizer.zero_grad()
        loss = compute_loss(model, batch, criterion)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        count = int((batch.tgt_out != criterion.ignore_index).sum())
        total, tokens = total + loss.item() * count, tokens + count
    return total / max(tokens, 1)


def test_honest_work_and_a_noted_prediction_start_the_run():
    assert check.train_epoch_train_mode(train_epoch)
    assert check.train_epoch_follows_the_schedule(train_epoch)
    assert check.predicted_half_right_loss(lambda: 0.69)  # noted, scored when graded: not a failure
    check.before_the_long_run()  # raises nothing


def test_a_failing_check_stops_the_run_and_names_it_until_it_passes_again():
    assert check.train_epoch_train_mode(train_epoch_without_train_mode)  # the cell shows ✘ and carries on
    with pytest.raises(check.LongRunRefused) as refused:
        check.before_the_long_run()
    assert check.train_epoch_train_mode.check_title in str(refused.value)
    assert "TRAIN_ANYWAY" in str(refused.value)
    assert check.train_epoch_train_mode(train_epoch)  # repaired and run again: its latest outcome counts
    check.before_the_long_run()
