"""Reference code of stages 5–6 on small synthetic data: batches, loss, schedule, training, greedy decoding."""

import math

import pytest
import torch

from transformer_course.reference import Transformer, make_source_mask, make_target_mask
from transformer_course.reference.decoding import attention_maps, greedy_decode
from transformer_course.reference.training import (
    collate,
    compute_loss,
    make_criterion,
    make_optimizer,
    noam_learning_rate,
    train_epoch,
)
from transformer_course.reference.translation import corpus_bleu

PAD, BOS, EOS = 3, 1, 2


def copy_task(count: int, seed: int = 0, vocab: int = 12) -> list[tuple[list[int], list[int]]]:
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(count):
        length = int(torch.randint(2, 7, (1,), generator=generator))
        tokens = torch.randint(4, vocab, (length,), generator=generator).tolist()
        pairs.append(([BOS, *tokens, EOS], [BOS, *tokens, EOS]))
    return pairs


def test_collate_pads_shifts_and_masks():
    batch = collate([([1, 5, 2], [1, 6, 7, 2]), ([1, 5, 5, 5, 2], [1, 8, 2])], PAD)
    assert batch.src.tolist() == [[1, 5, 2, PAD, PAD], [1, 5, 5, 5, 2]]
    assert batch.tgt_in.tolist() == [[1, 6, 7], [1, 8, 2]]
    assert batch.tgt_out.tolist() == [[6, 7, 2], [8, 2, PAD]], "the decoder predicts the next token"
    assert batch.src_mask.shape == (2, 1, 1, 5) and batch.tgt_mask.shape == (2, 1, 3, 3)
    assert batch.src_mask[0, 0, 0].tolist() == [True, True, True, False, False]
    assert batch.tgt_mask[0, 0, 1].tolist() == [True, True, False]


def test_loss_ignores_padding():
    torch.manual_seed(0)
    model = Transformer(12, 12, 16, 2, 1, 32, 20, 0.0).eval()
    criterion = make_criterion(PAD, label_smoothing=0.0)
    short = collate([([1, 5, 2], [1, 6, 2])], PAD)
    padded = collate([([1, 5, 2], [1, 6, 2]), ([1, 5, 5, 5, 5, 5, 2], [1, 6, 6, 6, 6, 6, 2])], PAD)
    single = compute_loss(model, short, criterion)
    logits = model(padded.src, padded.tgt_in, padded.src_mask, padded.tgt_mask)
    first_row = torch.nn.functional.cross_entropy(logits[0, :2], padded.tgt_out[0, :2])
    assert torch.allclose(single, first_row, atol=1e-5), "extra padding must not change a sentence's loss"


def test_noam_schedule_warms_up_then_decays():
    rates = [noam_learning_rate(step, 512, 4000) for step in (1, 2000, 4000, 8000, 16000)]
    assert rates[0] < rates[1] < rates[2] > rates[3] > rates[4]
    assert math.isclose(rates[2], 512 ** -0.5 * 4000 ** -0.5)


@pytest.mark.slow
def test_training_learns_to_copy_and_greedy_decoding_reproduces():
    torch.manual_seed(0)
    model = Transformer(12, 12, 32, 4, 2, 64, 20, 0.0)
    criterion = make_criterion(PAD, label_smoothing=0.0)
    optimizer, scheduler = make_optimizer(model, 32, warmup_steps=50, factor=0.5)
    pairs = copy_task(512)
    batches = [collate(pairs[i:i + 32], PAD) for i in range(0, 512, 32)]
    first = train_epoch(model, batches, criterion, optimizer, scheduler, progress=False)
    for _ in range(11):
        last = train_epoch(model, batches, criterion, optimizer, scheduler, progress=False)
    assert last < first / 4, (first, last)
    test = copy_task(32, seed=1)
    src = collate(test, PAD).src
    ys = greedy_decode(model, src, PAD, BOS, EOS, max_len=10)
    hypotheses = [" ".join(map(str, row[1:row.tolist().index(EOS)].tolist())) if EOS in row else "" for row in ys]
    references = [" ".join(map(str, target[1:-1])) for _, target in test]
    score, signature = corpus_bleu(hypotheses, references)
    assert score > 60, (score, hypotheses[:3], references[:3])
    assert "tok:none" in signature


def test_greedy_decoding_pads_finished_sentences_and_respects_max_len():
    class Scripted(torch.nn.Module):
        """Sentence 0 says <eos> at step 1, sentence 1 at step 3, sentence 2 never."""

        def encoder(self, src, mask):
            return torch.zeros(src.size(0), src.size(1), 4)

        def decoder(self, ys, enc_out, enc_mask, dec_mask):
            step = ys.size(1)
            logits = torch.zeros(ys.size(0), step, 8)
            script = [EOS if step >= 1 else 5, EOS if step >= 3 else 6, 7]
            for row in range(ys.size(0)):
                logits[row, -1, script[row]] = 1.0
            return logits

    ys = greedy_decode(Scripted(), torch.ones(3, 4, dtype=torch.long), PAD, BOS, EOS, max_len=5)
    assert ys.shape == (3, 6)
    assert ys[0].tolist() == [BOS, EOS, PAD, PAD, PAD, PAD]
    assert ys[1].tolist() == [BOS, 6, 6, EOS, PAD, PAD]
    assert ys[2].tolist() == [BOS, 7, 7, 7, 7, 7]
    early = greedy_decode(Scripted(), torch.ones(2, 4, dtype=torch.long), PAD, BOS, EOS, max_len=9)
    assert early.shape[1] == 4, "decoding stops as soon as every sentence is finished"


def test_attention_maps_stack_every_layer_after_a_forward_pass():
    torch.manual_seed(0)
    model = Transformer(12, 11, 16, 4, 3, 32, 20, 0.0).eval()
    src = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, PAD, PAD]])  # (2, 5), the second sentence padded
    tgt = torch.tensor([[1, 4, 5], [1, 6, PAD]])  # (2, 3)
    with torch.no_grad():
        model(src, tgt, make_source_mask(src, PAD), make_target_mask(tgt, PAD))
    maps = attention_maps(model)
    assert maps["encoder_self"].shape == (3, 2, 4, 5, 5)
    assert maps["decoder_self"].shape == (3, 2, 4, 3, 3)
    assert maps["cross"].shape == (3, 2, 4, 3, 5)
    assert torch.equal(maps["cross"][1], model.decoder.layers[1].cross_attn.attn_weights)
    assert torch.equal(maps["encoder_self"][2], model.encoder.layers[2].self_attn.attn_weights)
    for weights in maps.values():
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-6), "every row is a distribution"
    assert (maps["decoder_self"].triu(1) == 0).all(), "no position attends to a later one"
    assert (maps["cross"][:, 1, :, :, 3:] == 0).all(), "padded source keys get no weight"
