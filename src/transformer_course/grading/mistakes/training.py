"""Stage 5 mistakes: the shifted batch, the loss, the warm-up schedule and the training loop."""

from transformer_course.grading.mistakes import Alternative, Mistake

STAGE = "05_training"

_SHIFT = "tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # shift by one: predict the next token"
_LOSS = "loss = criterion(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1))"
_RATE = "return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)"

MISTAKES: list[Mistake] = [
    Mistake(
        STAGE, "target not shifted: teacher-forcing input equals the output",
        _SHIFT,
        "tgt_in, tgt_out = tgt, tgt  # the decoder reads and predicts the whole target",
        fails="train_collate_shapes", cause="not shifted",
    ),
    Mistake(
        STAGE, "decoder input and labels swapped (the input loses <bos>)",
        _SHIFT,
        "tgt_in, tgt_out = tgt[:, 1:], tgt[:, :-1]",
        fails="train_collate_shift", cause="tgt_in and tgt_out are swapped",
    ),
    Mistake(
        STAGE, "loss compares the logits with the decoder input",
        _LOSS,
        "loss = criterion(logits.reshape(-1, logits.size(-1)), batch.tgt_in.reshape(-1))",
        fails="train_loss_values", cause="compares the predictions with tgt_in",
    ),
    Mistake(
        STAGE, "loss counts pad tokens (own cross-entropy without ignore_index)",
        _LOSS,
        "loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1),\n"
        "                                       label_smoothing=criterion.label_smoothing)",
        fails="train_loss_ignores_padding", cause="counts <pad> positions",
    ),
    Mistake(
        STAGE, "label smoothing dropped (own cross-entropy with ignore_index only)",
        _LOSS,
        "loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1),\n"
        "                                       ignore_index=criterion.ignore_index)",
        fails="train_loss_values", cause="no label smoothing",
    ),
    Mistake(
        STAGE, "warm-up branch uses warmup_steps ** -0.5",
        _RATE,
        "return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -0.5)",
        fails="train_noam_values", cause="warmup_steps^-0.5 instead of warmup_steps^-1.5",
    ),
    Mistake(
        STAGE, "schedule divides by zero at step 0",
        "step = max(step, 1)\n    ",
        "",
        fails="train_noam_step_zero", cause="divides by zero",
    ),
    Mistake(
        STAGE, "optimizer.zero_grad missing: gradients accumulate",
        "optimizer.zero_grad()\n        ",
        "",
        fails="train_epoch_zero_grad", cause="gradients accumulate",
    ),
]

ALTERNATIVES: list[Alternative] = [
    Alternative(
        STAGE, "label-smoothed loss written by hand with log_softmax and gather",
        _LOSS,
        "log_probs = logits.reshape(-1, logits.size(-1)).log_softmax(dim=-1)  # (batch * tgt_len, vocab)\n"
        "    targets = batch.tgt_out.reshape(-1)  # (batch * tgt_len,)\n"
        "    epsilon = criterion.label_smoothing\n"
        "    nll = -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)  # -log p(correct token)\n"
        "    smooth = -log_probs.mean(dim=-1)  # cross-entropy with the uniform distribution\n"
        "    real = targets != criterion.ignore_index  # <pad> targets do not count\n"
        "    loss = ((1 - epsilon) * nll + epsilon * smooth)[real].mean()",
    ),
]
