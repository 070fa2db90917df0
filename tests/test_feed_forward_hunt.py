"""Stage 3's bug hunt, measured as the notebook measures it: the lesson's own training cell (lessons/03_blocks.py,
section 3) run with the classmate's network (a ReLU after `fc2`), with the correct one, and with the fix a student
might try first (no ReLU at all). Only the correct network fits the targets; the classmate's never outputs a
negative value; the network without its ReLU, a single linear map, stalls near the loss of predicting 0."""

import re

import matplotlib
import pytest
import torch

from conftest import ROOT
from transformer_course.reference.blocks import PositionWiseFeedForward

matplotlib.use("Agg")


class Classmates(PositionWiseFeedForward):
    def forward(self, x):
        return self.relu(self.fc2(self.fc1(x)))


class WithoutReLU(PositionWiseFeedForward):
    def forward(self, x):
        return self.fc2(self.fc1(x))


def training_cell() -> str:
    cells = re.split(r"^# %%.*$", (ROOT / "lessons" / "03_blocks.py").read_text(encoding="utf-8"), flags=re.MULTILINE)
    (cell,) = [cell for cell in cells if "classmates_network = PositionWiseFeedForward" in cell]
    return cell


def trained(network_class) -> dict:
    import matplotlib.pyplot as plt

    from transformer_course.visualisation import blocks as figures

    namespace = {"torch": torch, "plt": plt, "figures": figures, "PositionWiseFeedForward": network_class}
    torch.set_num_threads(1)
    exec(training_cell(), namespace)  # noqa: S102  (the lesson's given cell, as a notebook runs it)
    plt.close("all")
    return namespace


@pytest.mark.parametrize("network", ["correct", "classmates", "without ReLU"])
def test_only_the_correct_network_fits_the_lessons_targets(network):
    run = trained({"correct": PositionWiseFeedForward, "classmates": Classmates, "without ReLU": WithoutReLU}[network])
    zero_loss, last = run["targets"].pow(2).mean().item(), run["losses"][-1]
    assert 0.4 < (run["targets"] < 0).float().mean().item() < 0.6  # "positive and negative in about equal numbers"
    if network == "correct":
        assert last < 0.01 * zero_loss, (last, zero_loss)  # "drives the loss close to 0 within these 300 steps"
    elif network == "classmates":
        assert last > 0.5 * zero_loss and (run["predictions"] < 0).sum() == 0, last  # stalls; never below 0
    else:
        assert last > 0.8 * zero_loss, (last, zero_loss)  # a linear map cannot fit it
