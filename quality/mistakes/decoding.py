"""Stage 6 mistakes: batched greedy decoding, translating in batches (a bug hunt), corpus BLEU and the attention
maps."""

from quality.mistakes import Alternative, Mistake

STAGE = "06_decoding"

_PAD_FINISHED = "next_token = next_token.masked_fill(finished, pad_idx)  # finished sentences only get padding"
_ARGMAX = "next_token = logits[:, -1].argmax(dim=-1)  # (batch,) prediction after the last position"
_LOOP = (
    "    for _ in range(max_len):\n"
    "        logits = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx))  # (batch, len, vocab)\n"
    "        next_token = logits[:, -1].argmax(dim=-1)  # (batch,) prediction after the last position\n"
    "        next_token = next_token.masked_fill(finished, pad_idx)  # finished sentences only get padding\n"
    "        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)\n"
    "        finished |= next_token == eos_idx\n"
    "        if finished.all():\n"
    "            break\n"
)

_CLIPPED = "matches[n - 1] += sum((hypothesis_grams & reference_grams).values())  # & keeps the smaller count"
_PENALTY = "brevity_penalty = 1.0 if c > r else math.exp(1 - r / c)"
_MEAN = "bleu = 100 * brevity_penalty * math.exp(sum(math.log(p) for p in precisions) / 4)"
_BLEU = (
    "    matches, totals = [0] * 4, [0] * 4  # per order n = 1 .. 4\n"
    "    for hypothesis, reference in zip(hypotheses, references, strict=True):\n"
    "        for n in range(1, 5):\n"
    "            hypothesis_grams = Counter(tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1))\n"
    "            reference_grams = Counter(tuple(reference[i:i + n]) for i in range(len(reference) - n + 1))\n"
    "            matches[n - 1] += sum((hypothesis_grams & reference_grams).values())  # & keeps the smaller count\n"
    "            totals[n - 1] += sum(hypothesis_grams.values())\n"
    "    precisions = [m / t if t else 0.0 for m, t in zip(matches, totals, strict=True)]\n"
)
_PADDING = "src = torch.full((len(chunk), longest), source_vocab.pad_idx)  # (batch, longest)"

MISTAKES: list[Mistake] = [
    Mistake(
        STAGE, "decoder input starts with <pad> instead of the start token <bos>",
        "ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long, device=src.device)",
        "ys = torch.full((src.size(0), 1), pad_idx, dtype=torch.long, device=src.device)",
        fails="dec_greedy_starts_with_bos", cause="the decoder's first input is <bos>",
    ),
    Mistake(
        STAGE, "finished sentences are not padded after their <eos>",
        "        " + _PAD_FINISHED + "\n",
        "",
        fails="dec_greedy_stops_at_eos", cause="keep producing words after their <eos>",
    ),
    Mistake(
        STAGE, "finished sentences are filled with <eos> instead of <pad>",
        _PAD_FINISHED,
        "next_token = next_token.masked_fill(finished, eos_idx)",
        fails="dec_greedy_stops_at_eos", cause="filled with <eos> instead of <pad>",
    ),
    Mistake(
        STAGE, "finished flags overwritten each step instead of accumulated",
        "finished |= next_token == eos_idx",
        "finished = next_token == eos_idx",
        fails="dec_greedy_stops_at_eos", cause="`finished` forgets earlier sentences",
    ),
    Mistake(
        STAGE, "decoding never stops at <eos>: runs on to max_len",
        "        if finished.all():\n            break\n",
        "",
        fails="dec_greedy_all_finished", cause="decoding never stops early",
    ),
    Mistake(
        STAGE, "decoding stops when the first sentence is finished",
        "if finished.all():",
        "if finished.any():",
        fails="dec_greedy_all_finished", cause="as soon as ONE sentence is finished",
    ),
    Mistake(
        STAGE, "argmax taken at the first position instead of the last",
        _ARGMAX,
        "next_token = logits[:, 0].argmax(dim=-1)  # (batch,)",
        fails="dec_greedy_last_position", cause="the model predicts at position 0",
    ),
    Mistake(
        STAGE, "decoder called without the target (look-ahead) mask",
        "logits = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx))",
        "logits = model.decoder(ys, enc_out, src_mask, None)",
        fails="dec_greedy_masks", cause="gets no target mask",
    ),
    Mistake(
        STAGE, "corpus BLEU: n-gram matches not clipped to the reference's counts",
        _CLIPPED,
        "matches[n - 1] += sum(count for gram, count in hypothesis_grams.items() if gram in reference_grams)",
        fails="dec_bleu_clipping", cause="the counts are not clipped",
    ),
    Mistake(
        STAGE, "corpus BLEU: each different n-gram counted once (sets instead of counts)",
        "            " + _CLIPPED + "\n"
        "            totals[n - 1] += sum(hypothesis_grams.values())\n",
        "            matches[n - 1] += len(set(hypothesis_grams) & set(reference_grams))\n"
        "            totals[n - 1] += len(set(hypothesis_grams))\n",
        fails="dec_bleu_clipping", cause="count each different n-gram once",
    ),
    Mistake(
        STAGE, "corpus BLEU: the last n-gram of every sentence left out (range one too short)",
        "for i in range(len(hypothesis) - n + 1))\n"
        "            reference_grams = Counter(tuple(reference[i:i + n]) for i in range(len(reference) - n + 1))",
        "for i in range(len(hypothesis) - n))\n"
        "            reference_grams = Counter(tuple(reference[i:i + n]) for i in range(len(reference) - n))",
        fails="dec_bleu_clipping", cause="the last n-gram of every sentence is left out",
    ),
    Mistake(
        STAGE, "corpus BLEU: brevity penalty with the ratio turned round, exp(1 - c/r)",
        _PENALTY,
        "brevity_penalty = 1.0 if c > r else math.exp(1 - c / r)",
        fails="dec_bleu_brevity", cause="the ratio is turned round",
    ),
    Mistake(
        STAGE, "corpus BLEU: brevity penalty applied to hypotheses that are too long",
        _PENALTY,
        "brevity_penalty = 1.0 if c < r else math.exp(1 - r / c)",
        fails="dec_bleu_brevity", cause="falls on the corpus that is too LONG",
    ),
    Mistake(
        STAGE, "corpus BLEU: the brevity penalty is the average of the sentences' penalties",
        _PENALTY,
        "brevity_penalty = sum(1.0 if len(h) > len(r) else math.exp(1 - len(r) / len(h))\n"
        "                          for h, r in zip(hypotheses, references)) / len(hypotheses)",
        fails="dec_bleu_brevity", cause="the average of the sentences' penalties",
    ),
    Mistake(
        STAGE, "corpus BLEU: arithmetic mean of the precisions instead of the geometric mean",
        _MEAN,
        "bleu = 100 * brevity_penalty * sum(precisions) / 4",
        fails="dec_bleu_geometric", cause="the arithmetic mean of the precisions",
    ),
    Mistake(
        STAGE, "corpus BLEU: the brevity penalty left out of the score",
        _MEAN,
        "bleu = 100 * math.exp(sum(math.log(p) for p in precisions) / 4)",
        fails="dec_bleu_geometric", cause="without the brevity penalty",
    ),
    Mistake(
        STAGE, "corpus BLEU: the score on a scale of 0 to 1",
        _MEAN,
        "bleu = brevity_penalty * math.exp(sum(math.log(p) for p in precisions) / 4)",
        fails="dec_bleu_geometric", cause="on a scale of 0 to 1",
    ),
    Mistake(
        STAGE, "corpus BLEU: the precisions returned as percentages",
        "    precisions = [m / t if t else 0.0 for m, t in zip(matches, totals, strict=True)]\n",
        "    precisions = [100 * m / t if t else 0.0 for m, t in zip(matches, totals, strict=True)]\n",
        fails="dec_bleu_returns", cause="the precisions are percentages",
    ),
    Mistake(
        STAGE, "corpus BLEU: the average of the sentences' scores instead of one corpus score",
        _BLEU,
        "    scores = []\n"
        "    for hypothesis, reference in zip(hypotheses, references, strict=True):\n"
        "        found, made = [], []\n"
        "        for n in range(1, 5):\n"
        "            hypothesis_grams = Counter(tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1))\n"
        "            reference_grams = Counter(tuple(reference[i:i + n]) for i in range(len(reference) - n + 1))\n"
        "            found.append(sum((hypothesis_grams & reference_grams).values()))\n"
        "            made.append(sum(hypothesis_grams.values()))\n"
        "        scores.append([m / t if t else 0.0 for m, t in zip(found, made, strict=True)])\n"
        "    precisions = [sum(score[n] for score in scores) / len(scores) for n in range(4)]\n",
        fails="dec_bleu_corpus", cause="the average of the sentences' precisions",
    ),
    Mistake(
        STAGE, "corpus BLEU computed by sacreBLEU instead of by the student's code",
        _BLEU,
        "    import sacrebleu\n"
        "    score = sacrebleu.metrics.BLEU(tokenize='none', smooth_method='none', force=True).corpus_score(\n"
        "        [' '.join(h) for h in hypotheses], [[' '.join(r) for r in references]])\n"
        "    precisions = [p / 100 for p in score.precisions]\n",
        fails="dec_bleu_sacrebleu", cause="calls sacreBLEU",
    ),
    Mistake(
        STAGE, "translate_batch pads its batches with zeros (<unk>) instead of <pad>",
        _PADDING,
        "src = torch.zeros(len(chunk), longest, dtype=torch.long)  # (batch, longest)",
        fails="dec_batch_independent", cause="where <pad> (id 3) belongs",
    ),
    Mistake(  # the bug hunt "fixed" by telling greedy_decode that <unk> is the padding (a student helper's first fix)
        STAGE, "translate_batch pads with zeros and tells greedy_decode that id 0 (<unk>) is the padding",
        _PADDING + "\n        for row, index in enumerate(chunk):\n"
        "            src[row, :len(sources[index])] = torch.tensor(sources[index])  # each sentence from the left\n"
        "        ys = greedy_decode(model, src.to(device), source_vocab.pad_idx,",
        "src = torch.zeros(len(chunk), longest, dtype=torch.long)  # (batch, longest)\n"
        "        for row, index in enumerate(chunk):\n"
        "            src[row, :len(sources[index])] = torch.tensor(sources[index])  # each sentence from the left\n"
        "        ys = greedy_decode(model, src.to(device), 0,",
        fails="dec_batch_matches", cause="told that the padding is <unk> (id 0)",
    ),
    Mistake(
        STAGE, "translate_batch puts each sentence at the right end of its row (padding first)",
        "src[row, :len(sources[index])] = torch.tensor(sources[index])",
        "src[row, longest - len(sources[index]):] = torch.tensor(sources[index])",
        fails="dec_batch_independent", cause="sits at the right end of its row",
    ),
    Mistake(
        STAGE, "translate_batch returns the translations in the sorted order, not the input order",
        "    return [translations[i] for i in range(len(sources))]",
        "    return [translations[i] for i in order]",
        fails="dec_batch_matches", cause="come back in another order",
    ),
    Mistake(
        STAGE, "cross-attention map taken from the decoder's self-attention",
        "cross = torch.stack([layer.cross_attn.attn_weights for layer in model.decoder.layers])",
        "cross = torch.stack([layer.self_attn.attn_weights for layer in model.decoder.layers])",
        fails="dec_maps_shapes", cause="this is the shape of 'decoder_self'",
    ),
    Mistake(
        STAGE, "encoder maps collected from the last layer to the first",
        "encoder_self = torch.stack([layer.self_attn.attn_weights for layer in model.encoder.layers])",
        "encoder_self = torch.stack([layer.self_attn.attn_weights for layer in reversed(model.encoder.layers)])",
        fails="dec_maps_values", cause="the layers are in reverse order",
    ),
    Mistake(
        STAGE, "cross-attention maps of the first layer stacked once per layer",
        "cross = torch.stack([layer.cross_attn.attn_weights for layer in model.decoder.layers])",
        "cross = torch.stack([model.decoder.layers[0].cross_attn.attn_weights for _ in model.decoder.layers])",
        fails="dec_maps_values", cause="every entry holds layer 0's weights",
    ),
    Mistake(
        STAGE, "encoder map holds only the last layer",
        "encoder_self = torch.stack([layer.self_attn.attn_weights for layer in model.encoder.layers])",
        "encoder_self = model.encoder.layers[-1].self_attn.attn_weights",
        fails="dec_maps_shapes", cause="only one layer's weights",
    ),
]

ALTERNATIVES: list[Alternative] = [
    Alternative(
        STAGE, "one sentence at a time in a Python loop, padded at the end",
        _LOOP,
        "    rows = []\n"
        "    for row in range(src.size(0)):\n"
        "        one = ys[row:row + 1]  # (1, 1): <bos>\n"
        "        for _ in range(max_len):\n"
        "            mask = make_target_mask(one, pad_idx)\n"
        "            logits = model.decoder(one, enc_out[row:row + 1], src_mask[row:row + 1], mask)  # (1, len, V)\n"
        "            token = logits[0, -1].argmax()\n"
        "            one = torch.cat([one, token.view(1, 1)], dim=1)\n"
        "            if token.item() == eos_idx:\n"
        "                break\n"
        "        rows.append(one[0])\n"
        "    longest = max(len(tokens) for tokens in rows)\n"
        "    ys = torch.full((src.size(0), longest), pad_idx, dtype=torch.long, device=src.device)\n"
        "    for row, tokens in enumerate(rows):\n"
        "        ys[row, :len(tokens)] = tokens\n",
    ),
    Alternative(
        STAGE, "preallocated output tensor filled column by column, argmax via topk, padding via torch.where",
        _LOOP,
        "    out = torch.full((src.size(0), max_len + 1), pad_idx, dtype=torch.long, device=src.device)\n"
        "    out[:, 0] = bos_idx\n"
        "    length = 1\n"
        "    while length <= max_len and not bool(finished.all()):\n"
        "        current = out[:, :length]  # (batch, length)\n"
        "        logits = model.decoder(current, enc_out, src_mask, make_target_mask(current, pad_idx))\n"
        "        best = logits[:, -1].topk(1, dim=-1).indices.squeeze(-1)  # (batch,) the single best token\n"
        "        out[:, length] = torch.where(finished, torch.full_like(best, pad_idx), best)\n"
        "        finished = finished | (out[:, length] == eos_idx)\n"
        "        length += 1\n"
        "    ys = out[:, :length]\n",
    ),
    Alternative(
        STAGE, "the full model called at every step (the encoder runs again each time)",
        "logits = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx))",
        "logits = model(src, ys, src_mask, make_target_mask(ys, pad_idx))",
    ),
    Alternative(
        STAGE, "argmax over the vocabulary first, then the last position; padding with torch.where and a scalar",
        _ARGMAX + "\n        " + _PAD_FINISHED,
        "next_token = logits.argmax(dim=-1)[:, -1]  # (batch,)\n"
        "        next_token = torch.where(finished, pad_idx, next_token)",
    ),
    Alternative(
        STAGE, "only the sentences still running are decoded at each step",
        _LOOP,
        "    for _ in range(max_len):\n"
        "        running = (~finished).nonzero().squeeze(1)  # indices of unfinished sentences\n"
        "        part = ys[running]\n"
        "        logits = model.decoder(part, enc_out[running], src_mask[running], make_target_mask(part, pad_idx))\n"
        "        next_token = torch.full_like(ys[:, 0], pad_idx)  # (batch,) padding for finished sentences\n"
        "        next_token[running] = logits[:, -1].argmax(dim=-1)\n"
        "        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)\n"
        "        finished |= next_token == eos_idx\n"
        "        if finished.all():\n"
        "            break\n",
    ),
    Alternative(
        STAGE, "corpus BLEU with dictionaries and loops, n-grams by zip, the geometric mean as a product's root",
        _BLEU + "    c, r = sum(len(h) for h in hypotheses), sum(len(h) for h in references)  # corpus lengths\n",
        "    matches, totals = [0, 0, 0, 0], [0, 0, 0, 0]\n"
        "    c = r = 0\n"
        "    for hypothesis, reference in zip(hypotheses, references, strict=True):\n"
        "        c, r = c + len(hypothesis), r + len(reference)\n"
        "        for n in (1, 2, 3, 4):\n"
        "            available = {}\n"
        "            for gram in zip(*[reference[k:] for k in range(n)]):\n"
        "                available[gram] = available.get(gram, 0) + 1\n"
        "            for gram in zip(*[hypothesis[k:] for k in range(n)]):\n"
        "                totals[n - 1] += 1\n"
        "                if available.get(gram, 0) > 0:\n"
        "                    available[gram] -= 1\n"
        "                    matches[n - 1] += 1\n"
        "    precisions = [matches[k] / totals[k] if totals[k] else 0.0 for k in range(4)]\n",
    ),
    Alternative(
        STAGE, "corpus BLEU: the geometric mean as the fourth root of the product",
        _MEAN,
        "bleu = 100 * brevity_penalty * math.prod(precisions) ** 0.25",
    ),
    Alternative(
        STAGE, "corpus BLEU: clipping written with min over the hypothesis's n-grams",
        _CLIPPED,
        "matches[n - 1] += sum(min(count, reference_grams[gram]) for gram, count in hypothesis_grams.items())",
    ),
    Alternative(
        STAGE, "translate_batch pads its batches with torch.nn.utils.rnn.pad_sequence",
        "        longest = max(len(sources[i]) for i in chunk)\n"
        "        " + _PADDING + "\n"
        "        for row, index in enumerate(chunk):\n"
        "            src[row, :len(sources[index])] = torch.tensor(sources[index])  # each sentence from the left\n",
        "        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(sources[i]) for i in chunk], batch_first=True,\n"
        "                                              padding_value=source_vocab.pad_idx)  # (batch, longest)\n",
    ),
    Alternative(
        STAGE, "attention maps collected in a loop and stacked along dim=0",
        "encoder_self = torch.stack([layer.self_attn.attn_weights for layer in model.encoder.layers])",
        "weights = []\n"
        "    for block in model.encoder.layers:\n"
        "        weights.append(block.self_attn.attn_weights)\n"
        "    encoder_self = torch.stack(weights, dim=0)",
    ),
]

# --- held out ---------------------------------------------------------------------------------------------
# Written before the checks were reworked for issue 10 and never tuned to (see grading/mistakes/blocks.py
# and scripts/measure_held_out.py): `cause` lists phrases separated by " | ".

HELD_OUT: list[Mistake] = [
    Mistake(
        STAGE, "greedy decoding written for one sentence: .item() and break at the first <eos>",
        _LOOP,
        "    for _ in range(max_len):\n"
        "        logits = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx))\n"
        "        next_token = logits[:, -1].argmax(dim=-1)\n"
        "        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)\n"
        "        if next_token.item() == eos_idx:\n"
        "            break\n",
        fails="dec_greedy_matches_reference_batch", cause="one sentence | single sentence | batch size 1 | "
                                                            "more than one sentence",
    ),
    Mistake(
        STAGE, "@torch.no_grad() removed from greedy_decode",
        "@torch.no_grad()\ndef greedy_decode",
        "def greedy_decode",
        fails="dec_greedy_mode", cause="no_grad",
    ),
    Mistake(
        STAGE, "the given model.eval() removed from greedy_decode",
        "    model.eval()\n    src_mask = make_source_mask(src, pad_idx)",
        "    src_mask = make_source_mask(src, pad_idx)",
        fails="dec_greedy_deterministic", cause="model.eval() | eval mode",
    ),
    Mistake(
        STAGE, "decoder fed only the last token at every step",
        "logits = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx))",
        "logits = model.decoder(ys[:, -1:], enc_out, src_mask, make_target_mask(ys[:, -1:], pad_idx))",
        fails="dec_greedy_matches_reference", cause="last token | whole prefix | only the last | all of ys | "
                                                      "length 1",
    ),
    Mistake(
        STAGE, "finished updated before padding: the <eos> itself becomes <pad>",
        "        next_token = next_token.masked_fill(finished, pad_idx)  # finished sentences only get padding\n"
        "        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)\n"
        "        finished |= next_token == eos_idx\n",
        "        finished |= next_token == eos_idx\n"
        "        next_token = next_token.masked_fill(finished, pad_idx)\n"
        "        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)\n",
        fails="dec_greedy_stops_at_eos", cause="before padding | after padding | overwritten | replaced",
    ),
    Mistake(
        STAGE, "new token put in front of ys instead of after it",
        "ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)",
        "ys = torch.cat([next_token.unsqueeze(1), ys], dim=1)",
        fails="dec_greedy_starts_with_bos", cause="prepend | in front | at the front | at the beginning | reversed",
    ),
    Mistake(
        STAGE, "new token concatenated without unsqueeze",
        "ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)",
        "ys = torch.cat([ys, next_token], dim=1)",
        fails="dec_greedy_starts_with_bos", cause="unsqueeze",
    ),
    Mistake(
        STAGE, "attention maps averaged over the heads",
        "encoder_self = torch.stack([layer.self_attn.attn_weights for layer in model.encoder.layers])",
        "encoder_self = torch.stack([layer.self_attn.attn_weights.mean(dim=1) for layer in model.encoder.layers])",
        fails="dec_maps_shapes", cause="averaged over the heads | mean over | head axis | heads axis | over the heads",
    ),
    Mistake(
        STAGE, "argmax over the batch axis",
        _ARGMAX,
        "next_token = logits[:, -1].argmax(dim=0)  # (batch,)",
        fails="dec_greedy_starts_with_bos", cause="batch axis | dim=0 | axis 0",
    ),
    Mistake(
        STAGE, "the full model called at every step without the source mask",
        "logits = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx))",
        "logits = model(src, ys, None, make_target_mask(ys, pad_idx))",
        fails="dec_greedy_masks", cause="no source mask | without the source mask | source mask is missing | "
                                          "gets no source",
    ),
]
