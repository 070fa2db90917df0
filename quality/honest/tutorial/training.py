"""Stage 5 as d2l.ai and the TensorFlow/PyTorch tutorials write it: contiguous slices for the shift; the
cross-entropy on logits permuted to (batch, vocab, steps) as d2l's `MaskedSoftmaxCELoss` does; `net.train()` and
d2l's hand-written `grad_clipping`; the bug hunt's `fit` repaired with the scheduler passed by keyword, as the
tutorials' training functions take it."""

from quality.honest import Answer

ANSWERS = {
    "collate": Answer(stubs=(
        """
        tgt_in, tgt_out = tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()
        """,
    )),
    "compute_loss": Answer(stubs=(
        """
        Y_hat = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (batch, steps, vocab)
        loss = criterion(Y_hat.permute(0, 2, 1), batch.tgt_out)  # classes on axis 1, as CrossEntropyLoss wants
        """,
    )),
    "fit": Answer(fixes=(
        ("optimizer, device=device, clip_norm=clip_norm,",
         "optimizer, scheduler=scheduler, device=device,\n                                 clip_norm=clip_norm,"),
        ("        scheduler.step()\n", ""),
    )),
    "train_epoch": Answer(stubs=(
        """
        if isinstance(model, torch.nn.Module):  # as d2l's train_epoch_ch3 starts
            model.train()
        """,
        """
        optimizer.zero_grad()
        loss = compute_loss(model, batch, criterion)
        loss.backward()
        # d2l's grad_clipping: scale every gradient by clip_norm / norm when the total norm exceeds clip_norm
        params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
        norm = torch.sqrt(sum(torch.sum(p.grad ** 2) for p in params))
        if norm > clip_norm:
            for param in params:
                param.grad[:] *= clip_norm / norm
        optimizer.step()
        if scheduler:
            scheduler.step()
        """,
    )),
    "train_predict_uniform_loss": Answer(stubs=("return math.log(2.0)",)),
    "train_predict_peak_step": Answer(stubs=("return 4e3 ** (2 / 3)",)),
    "train_predict_peak_rate": Answer(stubs=("return 4.9e-4",)),
}
