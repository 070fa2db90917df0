"""Stage 5 mistakes: the shifted batch, the loss, the training loop and the bug hunt's loop over epochs (`fit`)."""

from quality.mistakes import Alternative, Mistake

STAGE = "05_training"

_SHIFT = "tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # shift by one: predict the next token"
_LOSS = "loss = criterion(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1))"
_FIT = (
    "        train_loss = train_epoch(model, train_batches, criterion, optimizer, scheduler, device, clip_norm,\n"
    "                                 max_steps, progress)\n"
    "        val_loss = evaluate(model, val_batches, plain, device, progress)\n"
)

_STEPS = (
    "        optimizer.zero_grad()\n"
    "        loss = compute_loss(model, batch, criterion)\n"
    "        loss.backward()\n"
    "        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n"
    "        optimizer.step()\n"
)

MISTAKES: list[Mistake] = [
    Mistake(
        STAGE, "loss summed over the tokens and divided by the number of sentences",
        _LOSS,
        "loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1),\n"
        "                                       ignore_index=criterion.ignore_index, reduction=\"sum\",\n"
        "                                       label_smoothing=criterion.label_smoothing) / batch.src.size(0)",
        fails="train_loss_values", cause="summed over the real tokens and divided by the batch size",
    ),
    Mistake(
        STAGE, "optimizer.step() before loss.backward()",
        _STEPS,
        "        optimizer.zero_grad()\n"
        "        loss = compute_loss(model, batch, criterion)\n"
        "        optimizer.step()\n"
        "        loss.backward()\n"
        "        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n",
        fails="train_epoch_zero_grad", cause="optimizer.step() runs before loss.backward()",
    ),
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
        STAGE, "fit steps the scheduler once per epoch and gives train_epoch none (the bug hunt's planted bug)",
        _FIT,
        "        train_loss = train_epoch(model, train_batches, criterion, optimizer, device=device, "
        "clip_norm=clip_norm,\n"
        "                                 max_steps=max_steps, progress=progress)\n"
        "        val_loss = evaluate(model, val_batches, plain, device, progress)\n"
        "        scheduler.step()\n",
        fails="train_fit_schedule", cause="moves on once per epoch",
    ),
    Mistake(
        STAGE, "fit half repaired: the scheduler passed to train_epoch, fit's own per-epoch step kept",
        _FIT,
        _FIT + "        if scheduler is not None:\n"
        "            scheduler.step()\n",
        fails="train_fit_schedule", cause="moves on once more after each epoch",
    ),
    Mistake(
        STAGE, "fit half repaired the other way: the per-epoch step deleted, train_epoch still given no scheduler",
        "optimizer, scheduler, device, clip_norm,",
        "optimizer, None, device, clip_norm,",
        fails="train_fit_schedule", cause="never moves on",
    ),
    Mistake(
        STAGE, "fit measures the validation loss with the label-smoothed training criterion",
        "val_loss = evaluate(model, val_batches, plain, device, progress)",
        "val_loss = evaluate(model, val_batches, criterion, device, progress)",
        fails="train_fit_history", cause="without label smoothing",
    ),
    Mistake(
        STAGE, "gradients not clipped (the paper never mentions clipping)",
        "        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n",
        "",
        fails="train_epoch_clips", cause="unclipped",
    ),
    Mistake(
        STAGE, "scheduler stepped before optimizer.step(): every update uses the next step's rate",
        "        optimizer.step()\n"
        "        if scheduler is not None:\n"
        "            scheduler.step()\n",
        "        if scheduler is not None:\n"
        "            scheduler.step()\n"
        "        optimizer.step()\n",
        fails="train_epoch_scheduler", cause="moved on once before the first update",
    ),
    Mistake(
        STAGE, "the update written in one chain, and `loss` for the given lines computed again after it",
        _STEPS + "        if scheduler is not None:\n"
        "            scheduler.step()\n",
        "        optimizer.zero_grad()\n"
        "        compute_loss(model, batch, criterion).backward()\n"
        "        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n"
        "        optimizer.step()\n"
        "        if scheduler is not None:\n"
        "            scheduler.step()\n"
        "        loss = compute_loss(model, batch, criterion)  # the given lines read `loss`\n",
        fails="train_epoch_mean_loss", cause="measured after the update",
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
    Alternative(
        STAGE, "shifted target made with narrow and clone",
        _SHIFT,
        "tgt_in = tgt.narrow(1, 0, tgt.size(1) - 1).clone()  # all but the last token\n"
        "    tgt_out = tgt.narrow(1, 1, tgt.size(1) - 1).clone()  # all but <bos>",
    ),
    Alternative(
        STAGE, "loss with the class axis second, (batch, vocab, tgt_len), as CrossEntropyLoss also accepts",
        _LOSS,
        "loss = criterion(logits.transpose(1, 2), batch.tgt_out)  # (batch, vocab, tgt_len) vs (batch, tgt_len)",
    ),
    Alternative(
        STAGE, "loss with functional cross-entropy and the criterion's settings",
        _LOSS,
        "loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(),\n"
        "                                       ignore_index=criterion.ignore_index,\n"
        "                                       label_smoothing=criterion.label_smoothing)",
    ),
    Alternative(
        STAGE, "fit repaired with keyword arguments and the validation criterion built in place",
        _FIT,
        "        train_loss = train_epoch(model, train_batches, criterion, optimizer, scheduler=scheduler,\n"
        "                                 device=device, clip_norm=clip_norm, max_steps=max_steps, progress=progress)\n"
        "        unsmoothed = make_criterion(criterion.ignore_index, label_smoothing=0.0)\n"
        "        val_loss = evaluate(model, val_batches, unsmoothed, device, progress)\n",
    ),
    Alternative(
        STAGE, "model.train() called at the start of every batch instead of once before the loop",
        "    model.train()  # dropout on: evaluate() leaves the model in eval mode\n"
        "    ### END SOLUTION\n"
        "    for step, batch in enumerate(tqdm(batches, desc=\"train\", leave=False, disable=not progress)):\n"
        "        if max_steps is not None and step >= max_steps:\n"
        "            break\n"
        "        batch = batch.to(device)\n"
        "        ### BEGIN SOLUTION\n",
        "    pass\n"
        "    ### END SOLUTION\n"
        "    for step, batch in enumerate(tqdm(batches, desc=\"train\", leave=False, disable=not progress)):\n"
        "        if max_steps is not None and step >= max_steps:\n"
        "            break\n"
        "        batch = batch.to(device)\n"
        "        ### BEGIN SOLUTION\n"
        "        model.train()  # dropout on for this batch\n",
    ),
    Alternative(
        STAGE, "gradients zeroed after the step (set to None) instead of before the loss",
        _STEPS,
        "        loss = compute_loss(model, batch, criterion)\n"
        "        loss.backward()\n"
        "        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad(set_to_none=True)\n",
    ),
]

# --- held out ---------------------------------------------------------------------------------------------
# Written before the checks were reworked for issue 10 and never tuned to (see grading/mistakes/blocks.py
# and scripts/measure_held_out.py): `cause` lists phrases separated by " | ".

HELD_OUT: list[Mistake] = [
    Mistake(
        STAGE, "collate slices the batch axis instead of the time axis",
        _SHIFT,
        "tgt_in, tgt_out = tgt[:-1], tgt[1:]",
        fails="train_collate_shapes", cause="batch axis | first axis | axis 0 | dim 0 | rows instead",
    ),
    Mistake(
        STAGE, "loss averaged per sentence, then over the sentences",
        _LOSS,
        "per_token = nn.functional.cross_entropy(\n"
        "        logits.transpose(1, 2), batch.tgt_out, ignore_index=criterion.ignore_index,\n"
        "        label_smoothing=criterion.label_smoothing, reduction=\"none\")  # (batch, tgt_len)\n"
        "    lengths = (batch.tgt_out != criterion.ignore_index).sum(dim=1)  # real tokens per sentence\n"
        "    loss = (per_token.sum(dim=1) / lengths).mean()",
        fails="train_loss_values", cause="per sentence | per-sentence | each sentence",
    ),
    Mistake(
        STAGE, "softmax applied to the logits before the criterion",
        _LOSS,
        "loss = criterion(logits.softmax(dim=-1).reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1))",
        fails="train_loss_values", cause="softmax",
    ),
    Mistake(
        STAGE, "loss divided by the batch size once more",
        _LOSS,
        "loss = criterion(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1)) / batch.src.size(0)",
        fails="train_loss_values", cause="batch size | divided by",
    ),
    Mistake(
        STAGE, "model called with the source and target masks swapped",
        "logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (batch, tgt_len, vocab)",
        "logits = model(batch.src, batch.tgt_in, batch.tgt_mask, batch.src_mask)  # (batch, tgt_len, vocab)",
        fails="train_loss_values", cause="masks are swapped | swapped masks | src_mask and tgt_mask | "
                                          "tgt_mask and src_mask",
    ),
    Mistake(
        STAGE, "model.train() left out: epochs after an evaluation train without dropout",
        "    model.train()  # dropout on: evaluate() leaves the model in eval mode\n",
        "    pass\n",
        fails="train_epoch_mode", cause="model.train() | train mode",
    ),
    Mistake(
        STAGE, "gradients clipped after optimizer.step()",
        _STEPS,
        "        optimizer.zero_grad()\n"
        "        loss = compute_loss(model, batch, criterion)\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n",
        fails="train_epoch_clips", cause="before optimizer.step | unclipped",
    ),
    Mistake(
        STAGE, "loss computed under torch.no_grad()",
        "        loss = compute_loss(model, batch, criterion)\n",
        "        with torch.no_grad():\n"
        "            loss = compute_loss(model, batch, criterion)\n",
        fails="train_epoch_learns", cause="no_grad | detach",
    ),
    Mistake(
        STAGE, "gradients zeroed between backward and the optimizer step",
        _STEPS,
        "        loss = compute_loss(model, batch, criterion)\n"
        "        loss.backward()\n"
        "        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n"
        "        optimizer.zero_grad()\n"
        "        optimizer.step()\n",
        fails="train_epoch_zero_grad", cause="between | never changed | before loss.backward",
    ),
]
