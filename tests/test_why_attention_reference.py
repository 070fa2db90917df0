"""Stage 0's reference code on small synthetic data: the GRU encoder-decoder with and without attention,
its greedy decoding, the length buckets, and the quoted numbers matching the script's results file."""

import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from conftest import ROOT
from transformer_course.reference import bottleneck_results
from transformer_course.reference.additive_attention import AdditiveAttention
from transformer_course.reference.bottleneck import LENGTH_BUCKETS, bucket_of
from transformer_course.reference.rnn import GRUDecoder, GRUEncoder, Seq2Seq, greedy_decode_rnn
from transformer_course.visualisation.why_attention import plot_masked_softmax

PAD, BOS, EOS = 3, 1, 2


def model(attention: bool, seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    encoder = GRUEncoder(20, 8, 6, 0.0, PAD)
    decoder = GRUDecoder(15, 8, 12, 12, 0.0, PAD, AdditiveAttention(12, 12, 5) if attention else None)
    return Seq2Seq(encoder, decoder, PAD).eval()


SOURCES = torch.tensor([[BOS, 5, 6, 7, 8, EOS], [BOS, 9, 10, EOS, PAD, PAD]])  # (2, 6), the second one padded


def test_shapes_and_attention_weights():
    tgt_in = torch.tensor([[BOS, 4, 5], [BOS, 6, PAD]])
    for attention in (False, True):
        seq2seq = model(attention)
        logits = seq2seq(SOURCES, tgt_in)
        assert logits.shape == (2, 3, 15)
        assert (seq2seq.attn_weights is None) != attention
    weights = seq2seq.attn_weights  # (batch, tgt_len, src_len)
    assert weights.shape == (2, 3, 6)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3))
    assert (weights[1, :, 4:] == 0).all(), "padded source positions get exactly zero weight"


def test_padding_changes_nothing():
    """Packing makes the sentence vector and the outputs of a padded sentence those of the sentence alone."""
    tgt_in = torch.tensor([[BOS, 6]])
    for attention in (False, True):
        seq2seq = model(attention)
        outputs, sentence, _, _ = seq2seq.encode(SOURCES)
        alone_outputs, alone_sentence, _, _ = seq2seq.encode(SOURCES[1:, :4])
        assert torch.allclose(sentence[1], alone_sentence[0], atol=1e-6)
        assert torch.allclose(outputs[1, :4], alone_outputs[0], atol=1e-6)
        padded = seq2seq(SOURCES[1:], tgt_in)
        assert torch.allclose(padded, seq2seq(SOURCES[1:, :4], tgt_in), atol=1e-6)


def test_greedy_decoding_agrees_with_teacher_forcing_and_pads_after_eos():
    for attention in (False, True):
        seq2seq = model(attention, seed=3)
        ys = greedy_decode_rnn(seq2seq, SOURCES, PAD, BOS, EOS, max_len=7)
        assert (ys[:, 0] == BOS).all() and ys.size(1) <= 8
        with torch.no_grad():
            logits = seq2seq(SOURCES, ys[:, :-1])  # teacher forcing on its own output
        for row in range(2):
            produced = ys[row, 1:].tolist()
            end = produced.index(EOS) + 1 if EOS in produced else len(produced)
            assert logits[row, :end].argmax(-1).tolist() == produced[:end]
            assert all(token == PAD for token in produced[end:])


def test_length_buckets_cover_every_length_once():
    assert [bucket_of(length) for length in (1, 8, 9, 11, 12, 14, 15, 18, 19, 60)] == [
        "1–8", "1–8", "9–11", "9–11", "12–14", "12–14", "15–18", "15–18", "19+", "19+"]
    for (_, _, longest), (_, shortest, _) in zip(LENGTH_BUCKETS, LENGTH_BUCKETS[1:], strict=False):
        assert shortest == longest + 1


def test_readme_quotes_the_measured_numbers():
    """The measurements page's stage-0 table (website/authors/measurements.md, once the README's) is the one
    the script printed for the results file the notebook quotes."""
    readme = (ROOT / "website" / "authors" / "measurements.md").read_text(encoding="utf-8")
    assert bottleneck_results.COMMAND in readme
    for name, run in bottleneck_results.RUNS.items():
        row = re.search(rf"^\| {name} \|(.*)$", readme, re.MULTILINE)
        assert row, f"no row of the measurements page for the model {name}"
        for label, _, _ in LENGTH_BUCKETS:
            assert f" {run['bleu'][label]['bleu']:.1f} " in row.group(1), (name, label)


def test_the_masked_softmax_figure_names_the_shapes_it_was_given():
    """Stage 0's figure of one query draws what the student's attention returned: a `score` that keeps a
    trailing axis of 1 (a common mistake) is refused with the shapes, not with an error from inside matplotlib;
    the right shapes draw."""
    tokens = ["ein", "hund", "<pad>"]
    mask, weights = torch.tensor([True, True, False]), torch.tensor([0.4, 0.6, 0.0])
    with pytest.raises(ValueError, match=r"shape \(3,\) each, and got scores \(3, 1\), weights \(3,\), mask \(3,\)"):
        plot_masked_softmax(torch.randn(3, 1), weights, tokens, mask)
    plt.close(plot_masked_softmax(torch.randn(3), weights, tokens, mask))
