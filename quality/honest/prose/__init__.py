"""The careful student who wrote every exercise from the lesson's prose alone, formula by formula.

Habits: explicit loops where the formula has an index (positions and column pairs, heads, key positions,
layers, sentences of a batch, beams); hand-written softmax (max subtracted first); masks turned into 0/1
numbers and applied as `scores * keep - 1e9 * (1 - keep)`; tensors allocated first and filled in place;
intermediate results kept in named variables, one step per line; keyword arguments where a call has many.
"""
