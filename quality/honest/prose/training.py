"""Stage 5 from the lesson's words: the shift with `narrow` (what the decoder reads and what it must predict, worked
out on the lesson's example); the scores and targets flattened with `torch.flatten`; an update put together from
section 8's ingredients, with `model.zero_grad()` and the clipping call with keyword arguments; the bug hunt's `fit`
repaired so that the schedule moves on after every update, with a comment saying why."""

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
    "fit": Answer(fixes=(
        ("optimizer, device=device, clip_norm=clip_norm,",
         "optimizer,\n"
         "                                 scheduler,  # the schedule counts updates: train_epoch steps it\n"
         "                                 device=device, clip_norm=clip_norm,"),
        ("        scheduler.step()\n",
         "        # (no scheduler step here: once per epoch would make the schedule count epochs)\n"),
    )),
    "train_epoch": Answer(stubs=(
        "model.train(True)  # evaluate() may have left dropout off",
        """
        model.zero_grad()  # backward() adds to .grad: start from nothing
        loss = compute_loss(model, batch, criterion)  # this batch's loss
        loss.backward()  # its gradient
        nn.utils.clip_grad_norm_(parameters=model.parameters(), max_norm=clip_norm)  # cap the total norm
        optimizer.step()  # the update, at the rate the scheduler has set
        if scheduler is not None:
            scheduler.step()  # the rate of the next update
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
