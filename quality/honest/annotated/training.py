"""Stage 5 after the Annotated Transformer's `Batch`, `SimpleLossCompute` and `run_epoch`: the shift as
`tgt[:, :-1]` / `tgt[:, 1:]`, the loss on `.contiguous().view(-1, ...)`, the update with
`zero_grad(set_to_none=True)` and `model.train()` as `run_epoch`'s caller does it; the bug hunt's `fit` repaired by
handing the scheduler to the epoch, as `run_epoch(..., scheduler)` takes it."""

from quality.honest import Answer

ANSWERS = {
    "collate": Answer(stubs=(
        """
        tgt_in = tgt[:, :-1]
        tgt_out = tgt[:, 1:]
        """,
    )),
    "compute_loss": Answer(stubs=(
        """
        out = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
        loss = criterion(out.contiguous().view(-1, out.size(-1)), batch.tgt_out.contiguous().view(-1))
        """,
    )),
    "fit": Answer(fixes=(("optimizer, device=device,",
                                  "optimizer, scheduler,\n                                 device=device,"),
                         ("        scheduler.step()\n", ""))),
    "train_epoch": Answer(stubs=(
        "model.train(mode=True)",
        """
        optimizer.zero_grad(set_to_none=True)
        loss = compute_loss(model, batch, criterion)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        """,
    )),
    "train_predict_uniform_loss": Answer(stubs=("return -math.log(0.5)  # only p(right word) counts",)),
    "train_predict_peak_step": Answer(stubs=("return 252  # step^1.5 = warmup: 4000^(2/3) = 251.98",)),
    "train_predict_peak_rate": Answer(stubs=("return 1024 ** -0.5 * 4000 ** -0.5  # d_model^-0.5 * warmup^-0.5",)),
}
