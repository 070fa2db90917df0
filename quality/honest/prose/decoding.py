"""Stage 6 from the lesson's prose, with the output allocated up front: a (batch, max_len + 1) tensor full
of `<pad>`, its first column `<bos>`, filled one column per step and cut to the steps taken; finished
sentences handled one sentence at a time; each batch row set to `<pad>` one position at a time; corpus BLEU
with plain dictionaries, every n-gram of every sentence looked up one by one, the geometric mean as a product
raised to 1/4; the attention maps written into preallocated tensors layer by layer."""

from quality.honest import Answer

ANSWERS = {
    "greedy_decode": Answer(stubs=(
        """
        batch = src.size(0)
        out = torch.full((batch, max_len + 1), pad_idx, dtype=torch.long, device=src.device)
        out[:, 0] = bos_idx
        length = 1  # columns of out written so far
        for step in range(max_len):
            prefix = out[:, :length]  # what has been written so far, <bos> first
            logits = model.decoder(prefix, enc_out, src_mask, make_target_mask(prefix, pad_idx))
            next_token = logits[:, -1].argmax(dim=-1)  # the prediction sits at the last position
            for b in range(batch):
                if finished[b]:
                    next_token[b] = pad_idx  # a finished sentence only gets padding
            out[:, length] = next_token
            length += 1
            finished = finished | (next_token == eos_idx)
            if bool(finished.all()):
                break
        ys = out[:, :length]
        """,
    )),
    "translate_batch": Answer(fixes=((
        "        src = torch.zeros(len(chunk), longest, dtype=torch.long)  # (batch, longest)\n",
        "        src = torch.zeros(len(chunk), longest, dtype=torch.long)  # (batch, longest)\n"
        "        for row in range(len(chunk)):\n"
        "            for position in range(longest):\n"
        "                src[row, position] = source_vocab.pad_idx  # padding, which the mask hides\n"),)),
    "compute_bleu": Answer(stubs=(
        """
        matched = [0, 0, 0, 0]  # clipped matches of each order, over the corpus
        counted = [0, 0, 0, 0]  # n-grams of each order in the hypotheses
        for s in range(len(hypotheses)):
            hypothesis, reference = hypotheses[s], references[s]
            for n in range(1, 5):
                in_reference = {}
                for start in range(len(reference) - n + 1):
                    gram = tuple(reference[start:start + n])
                    in_reference[gram] = in_reference.get(gram, 0) + 1
                in_hypothesis = {}
                for start in range(len(hypothesis) - n + 1):
                    gram = tuple(hypothesis[start:start + n])
                    in_hypothesis[gram] = in_hypothesis.get(gram, 0) + 1
                for gram in in_hypothesis:
                    counted[n - 1] += in_hypothesis[gram]
                    matched[n - 1] += min(in_hypothesis[gram], in_reference.get(gram, 0))
        precisions = []
        for n in range(4):
            precisions.append(matched[n] / counted[n] if counted[n] > 0 else 0.0)
        c = 0
        r = 0
        for s in range(len(hypotheses)):
            c += len(hypotheses[s])
            r += len(references[s])
        if c > r:
            brevity_penalty = 1.0
        else:
            brevity_penalty = math.exp(1 - r / c)
        product = 1.0
        for p in precisions:
            product *= p
        bleu = 100 * brevity_penalty * product ** (1 / 4)
        """,
    )),
    "attention_maps": Answer(stubs=(
        """
        first_encoder = model.encoder.layers[0].self_attn.attn_weights
        first_decoder = model.decoder.layers[0].self_attn.attn_weights
        first_cross = model.decoder.layers[0].cross_attn.attn_weights
        encoder_self = torch.zeros((len(model.encoder.layers),) + tuple(first_encoder.shape), dtype=first_encoder.dtype)
        decoder_self = torch.zeros((len(model.decoder.layers),) + tuple(first_decoder.shape), dtype=first_decoder.dtype)
        cross = torch.zeros((len(model.decoder.layers),) + tuple(first_cross.shape), dtype=first_cross.dtype)
        for i in range(len(model.encoder.layers)):
            encoder_self[i] = model.encoder.layers[i].self_attn.attn_weights
        for i in range(len(model.decoder.layers)):
            decoder_self[i] = model.decoder.layers[i].self_attn.attn_weights
            cross[i] = model.decoder.layers[i].cross_attn.attn_weights
        """,
    )),
    "dec_predict_decoder_calls": Answer(stubs=("return 12 - 3  # the 9-token sentence ends the loop before max_len",)),
    "dec_predict_brevity_penalty": Answer(stubs=("return 0.7165",)),
}
