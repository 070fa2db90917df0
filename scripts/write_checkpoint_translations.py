"""Write the shipped checkpoint's greedy translations of test_2016_flickr (not a test).

    python scripts/write_checkpoint_translations.py --data ../shared/data/multi30k [--threads 1] [--bug-hunt]

Decodes the 1,000 German test sentences with the course's checkpoint exactly as notebook 6 scores it (greedy
decoding, batches of 256 sorted by length, max_len 80, the cached decoder of stage 7, which writes the same token
ids) and writes src/transformer_course/reference/checkpoint_translations.py: the translations and the references
as the course's BLEU recipe sees them (lowercased spaCy tokens joined by single spaces), with the command and
sacreBLEU's score of them. Stage 6's check of the student's corpus BLEU compares it with sacreBLEU on these real
translations (tokenize="none": both count the same tokens), so it needs no model and no Multi30k while grading.

--bug-hunt also measures notebook 6's bug hunt on the checkpoint: the test set translated with its batches padded
by torch.zeros (id 0, <unk>) instead of <pad>, in sorted batches of 256 as the notebook makes them and in batches
of 256 in the test set's order, and prints BLEU and how many translations change (nothing is written).
"""

from __future__ import annotations

import argparse
import pprint
import sys
from pathlib import Path

import torch

from transformer_course.reference import Transformer
from transformer_course.reference.checkpoint import load, pretrained_path
from transformer_course.reference.kv_cache import cached_greedy_decode
from transformer_course.reference.translation import corpus_bleu, prepare_data, translate_ids

RESULTS = Path(__file__).resolve().parents[1] / "src" / "transformer_course" / "reference" / \
    "checkpoint_translations.py"


def padded_with(fill: int, model, sources: list[list[int]], source_vocab, target_vocab, sort: bool = True,
                batch_size: int = 256) -> list[list[str]]:
    """Greedy translations in batches whose padding is `fill` (translate_batch with another padding id)."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i])) if sort else list(range(len(sources)))
    translations = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        src = torch.full((len(chunk), max(len(sources[i]) for i in chunk)), fill, dtype=torch.long)
        for row, index in enumerate(chunk):
            src[row, :len(sources[index])] = torch.tensor(sources[index])
        ys = cached_greedy_decode(model, src, source_vocab.pad_idx, target_vocab.bos_idx, target_vocab.eos_idx, 80)
        for row, index in enumerate(chunk):
            translations[index] = target_vocab.decode(ys[row].tolist())
    return [translations[i] for i in range(len(sources))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--bug-hunt", action="store_true", help="also measure notebook 6's padding bug")
    arguments = parser.parse_args()
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    model, source_vocab, target_vocab, _ = load(pretrained_path(), Transformer)
    data = prepare_data(arguments.data, splits=("test_2016_flickr",), vocabs=(source_vocab, target_vocab))
    sources = [source for source, _ in data.splits["test_2016_flickr"]]
    translations = translate_ids(model, sources, source_vocab, target_vocab, max_len=80, batch_size=256,
                                 decode=cached_greedy_decode)
    hypotheses = [" ".join(tokens) for tokens in translations]
    references = data.references["test_2016_flickr"]
    score, signature = corpus_bleu(hypotheses, references)
    text = ('"""The shipped checkpoint\'s greedy translations of test_2016_flickr and their references (lowercased\n'
            'spaCy tokens joined by single spaces), written by scripts/write_checkpoint_translations.py (rerun it;\n'
            'do not edit by hand). Stage 6\'s check of corpus BLEU compares the student\'s function with sacreBLEU\n'
            'on them."""\n'
            "# ruff: noqa: E501  (generated)\n\n"
            f"COMMAND = {('python scripts/write_checkpoint_translations.py ' + ' '.join(sys.argv[1:])).strip()!r}\n"
            f"BLEU = {round(score, 2)!r}  # sacreBLEU, tokenize='none'\n"
            f"SIGNATURE = {signature!r}\n"
            f"HYPOTHESES = {pprint.pformat(hypotheses, width=110)}\n"
            f"REFERENCES = {pprint.pformat(references, width=110)}\n")
    RESULTS.write_text(text, encoding="utf-8")
    print(f"wrote {RESULTS}: {len(hypotheses)} translations, BLEU {score:.2f} ({signature})")
    if arguments.bug_hunt:
        for sort in (True, False):
            broken = padded_with(0, model, sources, source_vocab, target_vocab, sort=sort)
            right = padded_with(source_vocab.pad_idx, model, sources, source_vocab, target_vocab, sort=sort)
            changed = sum(a != b for a, b in zip(broken, right, strict=True))
            bleu = corpus_bleu([" ".join(tokens) for tokens in broken], references)[0]
            print(f"padded with zeros, batches {'sorted by length' if sort else 'in test-set order'}: BLEU "
                  f"{bleu:.2f} (with <pad>: {corpus_bleu([' '.join(t) for t in right], references)[0]:.2f}); "
                  f"{changed} of {len(sources)} translations change")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
