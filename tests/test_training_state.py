"""Stage 5 to 6 for a student's own model: a training run saved after every epoch, interrupted,
resumed into the same objects (bit for bit the run that was never interrupted), its model saved,
then chosen, loaded and scored the way notebook 6 does; and where the checkpoints go (a local
folder, or Google Drive in Colab)."""

import sys
import types

import pytest
import torch

from transformer_course import runtime
from transformer_course.data.vocab import Vocab
from transformer_course.reference import Transformer
from transformer_course.reference import checkpoint as checkpoint_io
from transformer_course.reference.training import (
    collate,
    make_criterion,
    make_optimizer,
    resume_training,
    save_training_state,
    train_epoch,
)
from transformer_course.reference.translation import corpus_bleu, translate_ids

CONFIG = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, max_seq_length=16, dropout=0.2)
WORDS = ["ein", "hund", "katze", "läuft", "schläft", "mann", "frau", "sieht"]
VOCAB = Vocab(["<unk>", "<bos>", "<eos>", "<pad>", *WORDS])
PAD = VOCAB.pad_idx


def copy_batches(seed: int = 0, count: int = 6):
    """A copy task over the toy vocabulary: every target equals its source."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        pairs = []
        for _ in range(4):
            words = torch.randint(4, len(VOCAB), (int(torch.randint(2, 6, (1,), generator=generator)),),
                                  generator=generator).tolist()
            pairs.append(([1, *words, 2], [1, *words, 2]))
        batches.append(collate(pairs, PAD))
    return batches


def fresh_run():
    """What the notebook's cells create: model, optimiser, scheduler and an empty history."""
    torch.manual_seed(0)
    model = Transformer(len(VOCAB), len(VOCAB), **CONFIG)
    optimizer, scheduler = make_optimizer(model, CONFIG["d_model"], warmup_steps=4, factor=1.0)
    return model, optimizer, scheduler, []


def run_epochs(model, optimizer, scheduler, history, first, last, path=None):
    for epoch in range(first, last + 1):
        loss = train_epoch(model, copy_batches(seed=epoch), make_criterion(PAD), optimizer, scheduler,
                           progress=False)
        history.append({"epoch": epoch, "train_loss": loss})
        if path is not None:
            save_training_state(path, model, optimizer, scheduler, history, CONFIG)


def test_resumed_run_continues_in_the_same_objects_and_equals_an_uninterrupted_run(tmp_path):
    straight = fresh_run()
    run_epochs(*straight, 1, 3)

    path = tmp_path / "training_state.pt"
    interrupted = fresh_run()
    run_epochs(*interrupted, 1, 2, path)
    torch.manual_seed(1234)  # a new session: whatever the random generators hold now is lost

    model, optimizer, scheduler, history = fresh_run()  # the notebook's cells, run again from the top
    assert resume_training(path, model, optimizer, scheduler, history, CONFIG) == 2
    assert [record["epoch"] for record in history] == [1, 2]  # the caller's own list, filled in place
    assert scheduler.last_epoch == 12  # two epochs of six batches
    run_epochs(model, optimizer, scheduler, history, 3, 3, path)

    reference_model, reference_optimizer, reference_scheduler, reference_history = straight
    assert history == reference_history
    assert scheduler.last_epoch == reference_scheduler.last_epoch == 18
    for name, tensor in reference_model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    for state, reference in zip(optimizer.state.values(), reference_optimizer.state.values(), strict=True):
        assert all(torch.equal(state[key], reference[key]) for key in ("exp_avg", "exp_avg_sq"))


def test_resume_without_a_file_touches_nothing_and_a_different_configuration_is_refused(tmp_path):
    model, optimizer, scheduler, history = fresh_run()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert resume_training(tmp_path / "none.pt", model, optimizer, scheduler, history, CONFIG) == 0
    assert history == [] and all(torch.equal(before[n], t) for n, t in model.state_dict().items())

    path = tmp_path / "training_state.pt"
    run_epochs(model, optimizer, scheduler, history, 1, 1, path)
    with pytest.raises(ValueError, match="different|configuration"):
        resume_training(path, *fresh_run(), config={**CONFIG, "d_model": 32})
    assert not list(tmp_path.glob("*.part")), "a temporary file was left behind"


def test_own_checkpoint_is_chosen_loaded_and_scored_as_in_notebook_6(tmp_path):
    model, optimizer, scheduler, history = fresh_run()
    run_epochs(model, optimizer, scheduler, history, 1, 2)
    checkpoint_io.save(tmp_path / checkpoint_io.PRETRAINED_NAME, model, CONFIG, VOCAB, VOCAB, {"epochs": 2})

    path, note = checkpoint_io.select("mine", tmp_path)
    assert path == tmp_path / checkpoint_io.PRETRAINED_NAME and "your checkpoint" in note
    loaded, source_vocab, target_vocab, metadata = checkpoint_io.load(path, Transformer)
    assert metadata["epochs"] == 2 and source_vocab.itos == VOCAB.itos
    sources = [[1, 5, 7, 2], [1, 9, 10, 6, 2]]
    hypotheses = [" ".join(tokens) for tokens in translate_ids(loaded, sources, source_vocab, target_vocab, max_len=8)]
    score, signature = corpus_bleu(hypotheses, ["ein hund läuft", "frau sieht hund"])
    assert 0.0 <= score <= 100.0 and "tok:none" in signature
    assert checkpoint_io.read_metadata(checkpoint_io.pretrained_path())["test_bleu"] > 30  # what it is compared with


def test_choosing_mine_without_a_checkpoint_falls_back_to_the_shipped_one_and_says_so(tmp_path):
    path, note = checkpoint_io.select("mine", tmp_path)
    assert path == checkpoint_io.pretrained_path() and "no checkpoint of yours" in note
    assert checkpoint_io.select("shipped", None)[0] == checkpoint_io.pretrained_path()
    with pytest.raises(ValueError):
        checkpoint_io.select("best", tmp_path)


def test_checkpoint_folder_local_by_default_and_google_drive_in_colab_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv(runtime.RUNS_VARIABLE, raising=False)
    monkeypatch.setattr(runtime, "LOCAL_FOLDER", tmp_path / "home" / "transformers_from_scratch")
    monkeypatch.setattr(runtime, "DRIVE_MOUNT", tmp_path / "drive")
    monkeypatch.setattr(runtime, "DRIVE_FOLDER", tmp_path / "drive" / "MyDrive" / "transformers_from_scratch")
    assert runtime.checkpoint_folder() == runtime.LOCAL_FOLDER
    assert runtime.checkpoint_folder(use_google_drive=True) == runtime.LOCAL_FOLDER  # not in Colab
    assert "only available in Colab" in capsys.readouterr().out

    mounted = []
    drive = types.SimpleNamespace(mount=lambda where: mounted.append(where) or (tmp_path / "drive" / "MyDrive").mkdir(
        parents=True))
    colab = types.ModuleType("google.colab")
    colab.drive = drive
    google = types.ModuleType("google")
    google.colab = colab
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    assert runtime.checkpoint_folder() == runtime.LOCAL_FOLDER  # Drive is opt-in
    assert runtime.checkpoint_folder(use_google_drive=True) == runtime.DRIVE_FOLDER
    assert runtime.checkpoint_folder(use_google_drive=True) == runtime.DRIVE_FOLDER  # mounted once
    assert mounted == [str(tmp_path / "drive")] and runtime.DRIVE_FOLDER.is_dir()

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")  # grading never touches a student's folders
    graded = runtime.checkpoint_folder(use_google_drive=True)
    assert graded not in (runtime.DRIVE_FOLDER, runtime.LOCAL_FOLDER) and graded.is_dir()
