"""Stage 6 as the PyTorch translation tutorial's greedy decoder, for a batch: `argmax(dim=-1)` of the last
position's logits, finished sentences given `<pad>` with `torch.where`, `finished = finished | ...`; the batches
padded with `fill_(pad_idx)`; corpus BLEU after d2l.ai's `bleu` (n-grams by slicing into a defaultdict, matches
taken off the reference's counts as they are used), its exponent written with `math.pow`; the attention maps
collected in lists by a loop over the layers, then stacked."""

from quality.honest import Answer

ANSWERS = {
    "greedy_decode": Answer(stubs=(
        """
        for _ in range(max_len):
            tgt_mask = make_target_mask(ys, pad_idx)
            logits = model.decoder(ys, enc_out, src_mask, tgt_mask)  # (batch, len, vocab)
            next_token = logits[:, -1, :].argmax(dim=-1)  # (batch,)
            next_token = torch.where(finished, torch.full_like(next_token, pad_idx), next_token)
            ys = torch.cat((ys, next_token.reshape(-1, 1)), dim=1)
            finished = finished | (next_token == eos_idx)
            if finished.all():
                break
        """,
    )),
    "translate_batch": Answer(fixes=((
        "src = torch.zeros(len(chunk), longest, dtype=torch.long)",
        "src = torch.empty(len(chunk), longest, dtype=torch.long).fill_(source_vocab.pad_idx)"),)),
    "compute_bleu": Answer(stubs=(
        """
        num_matches = [0] * 4
        num_ngrams = [0] * 4
        len_pred, len_label = 0, 0
        for pred_tokens, label_tokens in zip(hypotheses, references):
            len_pred += len(pred_tokens)
            len_label += len(label_tokens)
            for n in range(1, 5):
                label_subs = collections.defaultdict(int)
                for i in range(len(label_tokens) - n + 1):
                    label_subs[" ".join(label_tokens[i: i + n])] += 1
                for i in range(len(pred_tokens) - n + 1):
                    num_ngrams[n - 1] += 1
                    key = " ".join(pred_tokens[i: i + n])
                    if label_subs[key] > 0:
                        num_matches[n - 1] += 1
                        label_subs[key] -= 1
        precisions = [num_matches[k] / num_ngrams[k] if num_ngrams[k] else 0.0 for k in range(4)]
        brevity_penalty = math.exp(min(0, 1 - len_label / len_pred))
        if min(precisions) > 0:
            bleu = brevity_penalty * math.pow(math.prod(precisions), 0.25) * 100
        else:
            bleu = 0.0
        """,
    ), helpers="import collections"),
    "attention_maps": Answer(stubs=(
        """
        enc, dec, crs = [], [], []
        for layer in model.encoder.layers:
            enc.append(layer.self_attn.attn_weights)
        for layer in model.decoder.layers:
            dec.append(layer.self_attn.attn_weights)
            crs.append(layer.cross_attn.attn_weights)
        encoder_self, decoder_self, cross = torch.stack(enc), torch.stack(dec), torch.stack(crs)
        """,
    )),
    "dec_predict_decoder_calls": Answer(stubs=("return int(9.0)",)),
    "dec_predict_brevity_penalty": Answer(stubs=("return 0.717",)),
}
