"""The student who learnt from Harvard NLP's "The Annotated Transformer" (Rush et al., 2018).

Habits: a module-level attention helper that returns the output and the probabilities (its `attention()`,
renamed: see the stage-2 module); sublayers passed as lambdas to one residual helper; projections applied in one
comprehension over zip(layers, inputs); `scores.masked_fill(mask == 0, -1e9)`; `.contiguous().view(...)`; einsum
where it reads naturally; the `rate` function of the paper's optimiser; greedy decoding with
`torch.max(prob, dim=1)`. Written for the course's API (its constructors are given, so `clones` has no place).
"""
