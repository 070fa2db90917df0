"""Stage 5 from the lesson's words: the shift with `narrow` (all but the last token, all but the first); the
scores and targets flattened with `torch.flatten`; the schedule's two regimes as an if/else; the five steps of
an update with `model.zero_grad()` and the clipping call with keyword arguments."""

from quality.honest import Answer

ANSWERS = {
    "collate": Answer(stubs=(
        """
        length = tgt.size(1) - 1  # tgt_len: the framed target has one token more than each half
        tgt_in = tgt.narrow(1, 0, length)  # without the last token
        tgt_out = tgt.narrow(1, 1, length)  # without the first token (<bos>)
        """,
    )),
    "compute_loss": Answer(stubs=(
        """
        logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (batch, tgt_len, vocab)
        scores = torch.flatten(logits, start_dim=0, end_dim=1)  # (batch * tgt_len, vocab)
        targets = torch.flatten(batch.tgt_out)  # (batch * tgt_len,), the same order
        loss = criterion(scores, targets)
        """,
    )),
    "noam_learning_rate": Answer(fixes=(("min(step ** -0.5, step * warmup_steps ** -0.5)",
                                         "min(step ** -0.5, step * warmup_steps ** -1.5)  # the paper's exponent"),)),
    "train_epoch": Answer(stubs=(
        """
        model.zero_grad()  # 1. clear the gradients of the previous batch
        loss = compute_loss(model, batch, criterion)  # 2.
        loss.backward()  # 3.
        nn.utils.clip_grad_norm_(parameters=model.parameters(), max_norm=clip_norm)  # 4.
        optimizer.step()  # 5.
        if scheduler is not None:
            scheduler.step()
        """,
    )),
    "train_predict_uniform_loss": Answer(stubs=(
        """
        right_word_probability = 1 / 2
        return math.log(1 / right_word_probability)
        """,
    )),
    "train_predict_peak_step": Answer(stubs=("return math.ceil(math.pow(4_000, 2 / 3))",)),
    "train_predict_peak_rate": Answer(stubs=("return 1 / math.sqrt(1024 * 4000)",)),
}
