"""The student who learnt from the PyTorch tutorials and d2l.ai (Dive into Deep Learning).

Habits: `import torch.nn.functional as F` and functional calls (`F.softmax`, `F.relu`, `F.dropout`,
`F.log_softmax`); reshape and permute rather than view and transpose; masks applied with `torch.where` and
-inf; d2l's multi-head attention that folds the heads into the batch axis (`transpose_qkv`) and runs a batched
matrix product (`torch.bmm`); d2l's add & norm; d2l's hand-written gradient clipping; the cross-entropy over a
(batch, vocab, steps) tensor as in d2l's `MaskedSoftmaxCELoss`; the rsqrt form of the learning-rate schedule.
"""
