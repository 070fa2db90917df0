"""Stage 6: corpus BLEU (Papineni et al., 2002) computed from its definition, to be compared with sacreBLEU's.

BLEU counts the n-grams (n = 1 to 4) a hypothesis shares with its reference, each credited at most as often as
it occurs in the reference (clipping), sums the counts over the whole corpus before dividing (corpus BLEU is not
an average of sentence scores), takes the geometric mean of the four precisions and multiplies it by a brevity
penalty that punishes a corpus of hypotheses shorter than its references. Without smoothing: a precision of 0
gives BLEU 0. On token lists joined by single spaces, the result is sacreBLEU's corpus score with
tokenize="none" (and smooth_method="none", which equals its default wherever no precision is 0).
"""

from __future__ import annotations

import math
from collections import Counter


def compute_bleu(hypotheses: list[list[str]], references: list[list[str]]) -> tuple[float, list[float], float]:
    """Corpus BLEU of tokenised hypotheses, each against one tokenised reference.

    hypotheses[i] and references[i] are the tokens (strings) of sentence i; the corpus holds at least one
    hypothesis token. Returns (bleu, precisions, brevity_penalty): bleu on sacreBLEU's scale, 0 to 100;
    precisions, the corpus's modified n-gram precisions p_1 to p_4 as fractions from 0 to 1 (0 for an order
    of which the hypotheses hold no n-gram); brevity_penalty, from the corpus's total lengths, in (0, 1].
    """
    ### BEGIN SOLUTION
    matches, totals = [0] * 4, [0] * 4  # per order n = 1 .. 4
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        for n in range(1, 5):
            hypothesis_grams = Counter(tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1))
            reference_grams = Counter(tuple(reference[i:i + n]) for i in range(len(reference) - n + 1))
            matches[n - 1] += sum((hypothesis_grams & reference_grams).values())  # & keeps the smaller count
            totals[n - 1] += sum(hypothesis_grams.values())
    precisions = [m / t if t else 0.0 for m, t in zip(matches, totals, strict=True)]
    c, r = sum(len(h) for h in hypotheses), sum(len(h) for h in references)  # corpus lengths
    brevity_penalty = 1.0 if c > r else math.exp(1 - r / c)
    if min(precisions) == 0:
        bleu = 0.0  # the geometric mean of numbers one of which is 0
    else:
        bleu = 100 * brevity_penalty * math.exp(sum(math.log(p) for p in precisions) / 4)
    ### END SOLUTION
    return bleu, precisions, brevity_penalty
