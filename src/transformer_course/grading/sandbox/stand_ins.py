"""Stand-ins, made of PyTorch's own built-ins, for the reference parts that the checks' experiments plug into a
student's objects when those parts are exercises of the notebook being graded (`build`: the grading build leaves
the reference solution of those exercises out of the sandbox). Each computes the reference's values
(tests/test_grading_build.py); none is the reference's code. They are in the student's reach anyway: torch is.
A function here is used in place of the reference definition of the same name (`build.stand_ins_for`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def scaled_dot_product_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, weights) of attention, from `F.scaled_dot_product_attention`: the weights are what it returns
    when the values are the identity (each key its own one-hot value). A mask is True where attention is allowed;
    a row with no allowed key is not the reference's (it is not met where this stands in)."""
    allowed = None if mask is None else mask.to(torch.bool)
    identity = torch.eye(K.size(-2), dtype=Q.dtype, device=Q.device).expand(*K.shape[:-1], K.size(-2))
    weights = F.scaled_dot_product_attention(Q, K, identity, attn_mask=allowed)
    return weights @ V, weights


def compute_loss(model: nn.Module, batch: Any, criterion: nn.Module) -> torch.Tensor:
    """The criterion (PyTorch's `nn.CrossEntropyLoss`) over every target token of the batch."""
    logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    return criterion(logits.flatten(0, -2), batch.tgt_out.flatten())


def collate(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_idx: int) -> Any:
    """A Batch from (source ids, target ids) pairs, padded by `nn.utils.rnn.pad_sequence`; the decoder reads the
    target without its last token and predicts it without its first (`narrow`)."""
    from transformer_course.reference.model import make_source_mask, make_target_mask
    from transformer_course.reference.training import Batch

    def padded(sequences: list[Sequence[int]]) -> torch.Tensor:
        return nn.utils.rnn.pad_sequence([torch.as_tensor(list(ids), dtype=torch.long) for ids in sequences],
                                         batch_first=True, padding_value=pad_idx)

    src = padded([source for source, _ in pairs])
    tgt = padded([target for _, target in pairs])
    steps = tgt.size(1) - 1
    tgt_in, tgt_out = tgt.narrow(1, 0, steps), tgt.narrow(1, 1, steps)
    return Batch(src, tgt_in, tgt_out, make_source_mask(src, pad_idx), make_target_mask(tgt_in, pad_idx))
