"""Stage 7 reference code on small models: the cached step equals the full decoder, cached greedy decoding and
beam search of size 1 equal stage 6's greedy decoding (float32, as students run it), and the hand-made bigram
model the checks use is exactly its table. (The whole test set on the shipped checkpoint: scripts/benchmark.py, whose
recorded figures are checked for consistency here, with the table of website/authors/measurements.md.)"""

import math

import pytest
import torch

from conftest import ROOT
from transformer_course.checks.fast_decoding import MISSED_TABLE, PATIENT_TABLE, bigram_model
from transformer_course.reference import Transformer, make_source_mask, make_target_mask
from transformer_course.reference import fast_decoding_results as measured
from transformer_course.reference.beam_search import beam_search, length_penalty, sequence_log_probs
from transformer_course.reference.decoding import greedy_decode
from transformer_course.reference.kv_cache import cached_greedy_decode, decoder_step, start_cache

PAD, BOS, EOS = 3, 1, 2


def small_model(seed: int, eos_bias: float = 0.0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(23, 21, 32, 4, 2, 64, 60, 0.1).eval()
    with torch.no_grad():
        model.decoder.pred_layer.bias[PAD] = -1e4
        model.decoder.pred_layer.bias[EOS] += eos_bias
    return model


def padded_source(seed: int, batch: int = 6, length: int = 9) -> torch.Tensor:
    src = torch.randint(4, 23, (batch, length), generator=torch.Generator().manual_seed(seed))
    for row in range(1, batch):
        src[row, max(2, length - row):] = PAD
    return src


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_step_gives_the_full_decoders_last_position(seed):
    model, src = small_model(seed), padded_source(seed)
    tgt = torch.randint(4, 21, (src.size(0), 8), generator=torch.Generator().manual_seed(seed + 1))
    tgt[:, 0] = BOS
    src_mask = make_source_mask(src, PAD)
    with torch.no_grad():
        enc_out = model.encoder(src, src_mask)
        full = model.decoder(tgt, enc_out, src_mask, make_target_mask(tgt, PAD))  # (batch, 8, vocab)
        cache = start_cache(model, enc_out, src_mask)
        for t in range(tgt.size(1)):
            torch.testing.assert_close(decoder_step(model, cache, tgt[:, t:t + 1]), full[:, t], atol=1e-5, rtol=1e-5)
            assert cache.steps == t + 1


@pytest.mark.parametrize("seed, eos_bias", [(0, 0.0), (1, 1.0), (2, 2.0), (3, 1.5)])
def test_cached_greedy_and_beam_of_one_equal_greedy(seed, eos_bias):
    model, src = small_model(seed, eos_bias), padded_source(seed)
    expected = greedy_decode(model, src, PAD, BOS, EOS, 15)
    assert torch.equal(cached_greedy_decode(model, src, PAD, BOS, EOS, 15), expected)
    assert torch.equal(beam_search(model, src, PAD, BOS, EOS, 15, beam_size=1, alpha=0.6), expected)


def test_sequence_log_probs_sums_the_steps_of_the_decoded_tokens():
    model, src = small_model(4, 1.0), padded_source(4)
    ys = beam_search(model, src, PAD, BOS, EOS, 12, beam_size=3, alpha=0.0)
    src_mask = make_source_mask(src, PAD)
    with torch.no_grad():
        cache, total = start_cache(model, model.encoder(src, src_mask), src_mask), torch.zeros(src.size(0))
        for t in range(ys.size(1) - 1):
            step = torch.log_softmax(decoder_step(model, cache, ys[:, t:t + 1]), dim=-1)
            token = ys[:, t + 1]
            total += torch.where(token == PAD, 0.0, step.gather(1, token.unsqueeze(1)).squeeze(1))
    torch.testing.assert_close(sequence_log_probs(model, src, ys, PAD), total, atol=1e-4, rtol=1e-5)


def test_bigram_model_is_its_table_and_beam_search_beats_greedy_on_it():
    model = bigram_model(MISSED_TABLE)
    src = torch.full((1, 3), 4)
    with torch.no_grad():
        cache = start_cache(model, model.encoder(src, make_source_mask(src, PAD)), make_source_mask(src, PAD))
        step = torch.log_softmax(decoder_step(model, cache, torch.tensor([[BOS]])), dim=-1)[0].exp()
    for word, probability in MISSED_TABLE[BOS].items():
        assert math.isclose(float(step[word]), probability, rel_tol=1e-4)
    assert greedy_decode(model, src, PAD, BOS, EOS, 6).tolist() == [[BOS, 4, 6, EOS]]  # "the dog"
    assert beam_search(model, src, PAD, BOS, EOS, 6, beam_size=2, alpha=0.0).tolist() == [[BOS, 5, 7, EOS]]  # a cat
    patient = bigram_model(PATIENT_TABLE)
    assert beam_search(patient, src, PAD, BOS, EOS, 8, 2, alpha=0.0).tolist()[0][:3] == [BOS, 4, EOS]
    assert beam_search(patient, src, PAD, BOS, EOS, 8, 2, alpha=1.0).tolist()[0] == [BOS, 5, 9, 10, 11, 7, EOS]


def test_length_penalty_is_one_at_length_one_and_without_alpha():
    lengths = torch.arange(1, 10)
    assert torch.allclose(length_penalty(lengths, 0.0), torch.ones(9))
    assert float(length_penalty(torch.tensor(1), 0.6)) == 1.0
    assert bool((length_penalty(lengths, 1.0).diff() > 0).all())


def test_recorded_benchmark_is_consistent_and_the_readme_quotes_it():
    """The figures notebook 7 reads (written by scripts/benchmark.py --write) hang together, and the
    stage-7 table of the measurements page (website/authors/measurements.md, once the README's) is theirs."""
    grid = {name: score for name, score in measured.CHOICE["val_bleu"].items() if name != "greedy"}
    chosen = f"beam {measured.CHOICE['beam_size']}, alpha {measured.CHOICE['alpha']}"
    assert measured.CHOICE["chosen_on"] == "val" and grid[chosen] == max(grid.values())
    assert math.isclose(measured.BLEU["gain"], measured.BLEU["test_beam"] - measured.BLEU["test_greedy"], abs_tol=0.01)
    assert measured.CACHE["sentences"] == measured.SETTINGS["test_sentences"]
    assert measured.CACHE["identical_token_ids"] == (not measured.CACHE["sentences_that_differ"])
    for example in measured.BEAM_FIXES:  # beam search's sentence is more probable and closer to the reference
        assert 0 <= example["index"] < measured.SETTINGS["test_sentences"]
        assert example["log_prob"][1] > example["log_prob"][0]
        assert example["sentence_bleu"][1] > example["sentence_bleu"][0]
    readme = (ROOT / "website" / "authors" / "measurements.md").read_text(encoding="utf-8")
    assert measured.COMMAND in readme
    for figure in (measured.CACHE["sentences_per_s"]["without_cache"], measured.CACHE["sentences_per_s"]["with_cache"],
                   measured.CHOICE["val_bleu"]["greedy"], grid[chosen], measured.BLEU["test_greedy"],
                   measured.BLEU["test_beam"], measured.BLEU["gain"], measured.BEAM["sentences_per_s"]):
        assert f"{figure:.2f}".rstrip("0").rstrip(".") in readme, figure
