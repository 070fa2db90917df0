"""Data layer: Multi30k files (local folder, cache, download over loopback HTTP), tokenisers, Vocab, batching."""

from __future__ import annotations

import functools
import http.server
import os
import random
import shutil
import threading

import pytest

from transformer_course.data import multi30k
from transformer_course.data.batching import BucketBatchSampler
from transformer_course.data.tokenize import Tokenizer
from transformer_course.data.vocab import SPECIALS, Vocab


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(multi30k.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "transformer_course" / "multi30k"


@pytest.fixture
def server(tmp_path):
    """A loopback HTTP server over a folder we can fill with good, truncated or corrupted files."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_local_folder_gives_the_published_sizes(multi30k_folder):
    sizes = {split: len(multi30k.load_pairs(split, multi30k_folder)) for split in multi30k.SPLITS}
    assert sizes == {"train": 29000, "val": 1014, "test_2016_flickr": 1000}


def test_environment_variable_names_the_folder(multi30k_folder, monkeypatch):
    monkeypatch.setenv(multi30k.ENVIRONMENT_VARIABLE, str(multi30k_folder))
    german, english = multi30k.load_pairs("val")[0]
    assert german and english


def test_download_verifies_and_caches(multi30k_folder, server, empty_cache):
    served, url = server
    for name in ("val.de.gz", "val.en.gz"):
        shutil.copy(multi30k_folder / name, served / name)
    pairs = multi30k.load_pairs("val", base_url=url)
    assert len(pairs) == 1014
    assert sorted(p.name for p in empty_cache.iterdir()) == ["val.de.gz", "val.en.gz"]
    for name in ("val.de.gz", "val.en.gz"):
        (served / name).unlink()  # the second call must not need the network
    assert multi30k.load_pairs("val", base_url=url) == pairs


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
def test_bad_download_is_refused_and_leaves_no_file(multi30k_folder, server, empty_cache, damage):
    served, url = server
    data = (multi30k_folder / "val.de.gz").read_bytes()
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
    (served / "val.de.gz").write_bytes(data)
    with pytest.raises(multi30k.ChecksumMismatch, match=r"val\.de\.gz"):
        multi30k.file_path("val", "de", base_url=url)
    assert not empty_cache.exists() or not any(empty_cache.iterdir()), "a partial file was left behind"


def test_offline_without_cache_says_what_to_do(empty_cache):
    with pytest.raises(multi30k.DataUnavailable, match=multi30k.ENVIRONMENT_VARIABLE):
        multi30k.file_path("val", "en", base_url="http://127.0.0.1:9", timeout=2)
    assert not empty_cache.exists() or not any(empty_cache.iterdir())


def test_corrupt_file_in_a_given_folder_is_named(multi30k_folder, tmp_path):
    for name in multi30k.SHA256:
        shutil.copy(multi30k_folder / name, tmp_path / name)
    os.chmod(tmp_path / "test_2016_flickr.en.gz", 0o644)
    with open(tmp_path / "test_2016_flickr.en.gz", "ab") as handle:
        handle.write(b"junk")
    with pytest.raises(multi30k.ChecksumMismatch, match=r"test_2016_flickr\.en\.gz"):
        multi30k.load_pairs("test_2016_flickr", tmp_path)


def test_missing_file_in_a_given_folder_is_named(tmp_path):
    with pytest.raises(multi30k.DataUnavailable, match=r"train\.de\.gz"):
        multi30k.file_path("train", "de", tmp_path)


def test_tokenizers_lowercase_and_split_punctuation():
    assert Tokenizer("de")("Ein Hund läuft im Park.") == ["ein", "hund", "läuft", "im", "park", "."]
    assert Tokenizer("en")("Two dogs aren't running!") == ["two", "dogs", "are", "n't", "running", "!"]
    assert Tokenizer("en").many(["A dog.", "Cats"]) == [["a", "dog", "."], ["cats"]]


def test_vocab_specials_min_freq_unknown_and_round_trip(tmp_path):
    vocab = Vocab.build([["a", "b", "a"], ["b", "c", "a"]], min_freq=2)
    assert vocab.itos == [*SPECIALS, "a", "b"]
    assert (vocab.unk_idx, vocab.bos_idx, vocab.eos_idx, vocab.pad_idx) == (0, 1, 2, 3)
    assert vocab["c"] == vocab.unk_idx and "c" not in vocab
    ids = vocab.encode(["a", "c", "b"])
    assert ids == [1, 4, 0, 5, 2]
    assert vocab.decode(ids + [3, 3]) == ["a", "<unk>", "b"]
    assert vocab.decode([1, 4, 2, 5]) == ["a"], "decoding stops at <eos>"
    vocab.save(tmp_path / "vocab.json")
    assert Vocab.load(tmp_path / "vocab.json") == vocab


def test_bucketed_batches_cover_every_example_once_and_waste_little_padding():
    rng = random.Random(0)
    lengths = [rng.randint(3, 40) for _ in range(3000)]
    sampler = BucketBatchSampler(lengths, max_tokens=600, seed=1)
    batches = list(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(3000))
    assert all(max(lengths[i] for i in b) * len(b) <= 600 for b in batches)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    assert sum(lengths) / padded > 0.9, "bucketing should keep padding under 10%"
    sampler.set_epoch(1)
    assert list(sampler) != batches, "a new epoch gives a new order"


# --- the tokenised corpus kept on disk (data/token_cache.py) ---------------------------------------------------


@pytest.fixture
def small_cache(tmp_path, monkeypatch):
    """A private cache folder, and entries kept from 3 texts on (the real threshold is 5,000)."""
    from transformer_course.data import token_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(token_cache.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setattr(token_cache, "SMALLEST", 3)
    return token_cache


TEXTS = ["Ein Hund läuft.", "Zwei Männer, ein Boot!", "Eine Frau liest ein Buch.", "Kinder spielen im Park."]


def test_tokens_are_computed_once_then_read_back(small_cache, monkeypatch):
    tokenizer = Tokenizer("de")
    first = small_cache.tokenise(tokenizer, TEXTS)
    assert first == tokenizer.many(TEXTS)
    entries = list(small_cache.folders()[-1].glob("de-4-*.json.gz"))
    assert len(entries) == 1
    monkeypatch.setattr(Tokenizer, "many", lambda self, texts: pytest.fail("tokenised again"))
    assert small_cache.tokenise(tokenizer, TEXTS) == first
    # other texts, or another language, are another entry
    assert small_cache.entry_name(TEXTS[:3], "de") != small_cache.entry_name(TEXTS[1:], "de")
    assert small_cache.entry_name(TEXTS, "de") != small_cache.entry_name(TEXTS, "en")


@pytest.mark.parametrize("damage", [b"", b"not gzip", b"\x1f\x8b\x08\x00garbage"])
def test_a_corrupt_or_foreign_entry_is_ignored(small_cache, damage):
    import gzip
    import json

    tokenizer = Tokenizer("de")
    folder = small_cache.folders()[-1]
    folder.mkdir(parents=True)
    name = small_cache.entry_name(TEXTS, "de")
    (folder / name).write_bytes(damage)
    assert small_cache.tokenise(tokenizer, TEXTS) == tokenizer.many(TEXTS)
    for wrong in ([["ein"]] * 3, [[1, 2]] * 4, {"a": 1}):  # wrong length, not strings, not a list
        (folder / name).write_bytes(gzip.compress(json.dumps(wrong).encode()))
        assert small_cache.tokenise(tokenizer, TEXTS) == tokenizer.many(TEXTS)


def test_no_writable_folder_still_tokenises(small_cache, monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where a folder should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert small_cache.tokenise(Tokenizer("en"), TEXTS) == Tokenizer("en").many(TEXTS)


def test_the_grader_prepares_the_training_split_for_the_kernels(multi30k_folder, small_cache, monkeypatch, tmp_path):
    monkeypatch.setattr(small_cache, "SMALLEST", 5000)
    folder = small_cache.prepare(multi30k_folder)
    assert folder == small_cache.folders()[-1]
    names = sorted(path.name.split("-")[0] + "-" + path.name.split("-")[1] for path in folder.glob("*.json.gz"))
    assert names == ["de-29000", "en-29000"]  # val and test are small: tokenised where they are read
    # a notebook given that folder read-only reads the entries and writes nothing
    monkeypatch.setenv(small_cache.ENVIRONMENT_VARIABLE, str(folder))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    texts = [german for german, _ in multi30k.load_pairs("train", multi30k_folder)]
    monkeypatch.setattr(Tokenizer, "many", lambda self, texts: pytest.fail("tokenised again"))
    assert len(small_cache.tokenise(Tokenizer("de"), texts)) == 29000
    assert not (tmp_path / "elsewhere").exists()
