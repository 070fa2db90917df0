"""The shipped checkpoint: small enough, verified, loads into the course's Transformer, and its recorded
BLEU is reproduced by greedy decoding on test_2016_flickr (recipe in reference/translation.py)."""

import pytest

from conftest import ROOT
from transformer_course.data.download import sha256_of
from transformer_course.reference import Transformer
from transformer_course.reference import checkpoint as checkpoint_io

PATH = ROOT / "assets" / "checkpoint" / checkpoint_io.PRETRAINED_NAME


def test_checkpoint_is_committed_small_and_matches_its_checksum():
    assert PATH.exists()
    assert PATH.stat().st_size <= 25 * 1024 * 1024
    assert sha256_of(PATH) == checkpoint_io.PRETRAINED_SHA256, "update PRETRAINED_SHA256"


def test_checkpoint_loads_into_the_course_transformer_and_is_found_from_the_checkout(monkeypatch):
    monkeypatch.chdir(ROOT / "notebooks")
    monkeypatch.delenv(checkpoint_io.ENVIRONMENT_VARIABLE, raising=False)
    assert checkpoint_io.pretrained_path() == PATH
    model, source_vocab, target_vocab, metadata = checkpoint_io.load(PATH, Transformer)
    assert not model.training and len(source_vocab) > 1000 and len(target_vocab) > 1000
    for key in ("test_bleu", "val_bleu", "bleu_signature", "command", "training_minutes", "epochs"):
        assert key in metadata, key
    assert "tok:none" in metadata["bleu_signature"]


@pytest.mark.slow
def test_recorded_bleu_is_reproduced_on_test_2016_flickr(multi30k):
    """All 1,000 sentences (about half a minute on two CPU cores)."""
    from transformer_course.reference.translation import corpus_bleu, prepare_data, translate_ids

    model, source_vocab, target_vocab, metadata = checkpoint_io.load(PATH, Transformer)
    data = prepare_data(splits=("test_2016_flickr",), vocabs=(source_vocab, target_vocab))
    sources = [source for source, _ in data.splits["test_2016_flickr"]]
    hypotheses = [" ".join(t) for t in translate_ids(model, sources, source_vocab, target_vocab)]
    score, _ = corpus_bleu(hypotheses, data.references["test_2016_flickr"])
    assert abs(score - metadata["test_bleu"]) < 0.05, (score, metadata["test_bleu"])
    assert score >= 36.5, "the course promises at least 36.5 BLEU with greedy decoding"
