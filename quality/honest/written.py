"""The honest class's written answers: every graded question of every stage answered by each of the three students,
in their own words and style (see `quality.honest`): `annotated` writes terse notes with symbols, `tutorial`
explains step by step, `prose` says it in plain sentences with as few formulas as it can.

They measure what similarity honest answers to the same question reach (`quality.similarity`, the near-copies list
of the class report): written independently of the model answers and of each other, not copied from either. They
are not handed in by `student_notebook` (the honest class's notebooks leave their answer cells as released), so
the checks' tests are not changed by them.
"""

from __future__ import annotations

WRITTEN: dict[str, dict[str, str]] = {
    "annotated": {
        # stage 0
        "why_q_uniform": (
            "Uniform: c_t = mean of h_1..h_20, a blur of the whole sentence. Peaked: c_t ≈ h_j, the one encoder state "
            "(token j plus what the BiRNN mixed in around it). Uniform at every step → c_t identical for all t → "
            "no better than the fixed-vector seq2seq. Long inputs: each h_j weighs 1/n, so single words drown."),
        "why_q_softmax": (
            "Raw e_tj: unbounded, negative allowed, don't sum to 1 → c_t's scale drifts with n and with score size; "
            "masked pads (-1e9) would scale their h_j instead of vanishing. Argmax: piecewise constant → d/de = 0, "
            "no gradient to W_q, W_k, v; also only one source word per step."),
        # stage 1
        "pe_q_causal": (
            "Causal mask ⇒ no longer permutation-equivariant: token 1 sees {1}, token t sees {1..t}. Shuffling "
            "changes outputs, not just order. 'dog' vs 'man' at position 1 → different first outputs → sentences "
            "distinguishable. Position recoverable, e.g. weight on a fixed first token ~ 1/t."),
        "pe_q_buffer": (
            "Plain attribute ∉ parameters/buffers → .to() and .double() skip it. (a) pe stays on CPU, x on cuda → "
            "RuntimeError (devices differ) in forward. (b) no error: float64 + float32 promotes to float64; "
            "pe itself still float32."),
        "pe_q_scale": (
            "Sec. 6: emb entry ~0.014, PE entry ~0.57 (~40×). No √d: sum ≈ PE, words barely visible. ×√64 = 8: "
            "emb ~0.11 vs 0.57, gap 40× → 5×. Classmate's √d·(x+PE): both scaled, ratio stays ~1:40 → same as "
            "forgetting it, just 8× bigger. Paper scales the embedding only."),
        # stage 2
        "attn_q_scale": (
            "(a) d_k = 64, Var(q·k) = 64; /√512 → Var = 64/512 = 1/8, std ≈ 0.35 → softmax ≈ flat, weights "
            "nearly uniform. (b) h = 1 → d_k = d_model, identical. (c) only a constant 1/√h on the scores: W_Q, "
            "W_K can grow to absorb it → learns, just starts flatter/slower."),
        "attn_q_mask": (
            "End padding: row i sees keys 0..i, key 0 = <bos> always real → never fully masked (except an all-pad "
            "sentence). Start padding: first rows are pads seeing only pads → fully masked. -inf → 0/0 = NaN; "
            "-1e9 → uniform, finite. NaN leaks: next layer 0·NaN = NaN → loss NaN → grads NaN."),
        "attn_q_heads": (
            "(a) memory = [h0t0 h0t1 h0t2 h1t0 h1t1 h1t2]; reshape to 3 rows of 2·d_k: row0 = h0t0|h0t1, "
            "row1 = h0t2|h1t0, row2 = h1t1|h1t2 → tokens mixed. (b) num_heads = 1 or seq_len = 1: transposing a "
            "size-1 dim doesn't reorder memory."),
        # stage 3
        "block_q_residual": (
            "LN acts per position (own mean/var) → can't re-separate positions made equal by averaging; cos sim "
            "→ 1 in sec. 4 despite LN everywhere. Residual: x + attn(x) keeps each position's own vector; "
            "also ∂y/∂x = I + … for gradients."),
        "block_q_preln": (
            "Pass: shape, padding invariance, dropout train/eval, dropout placement (still on sublayer outputs). "
            "Fail: values, nn.TransformerEncoderLayer comparison (default norm_first=False = post-LN). Hook on block "
            "output: not normalised, ≈ input stats (mean ~2, std ~3) since output = x + corrections."),
        "block_q_cross": (
            "(a) look-ahead (1,1,6,6) vs scores (b,h,6,7) → broadcast error. (b) tgt_len = src_len → fits, no "
            "error, but query t sees src 0..t only; source is fully known, hiding its tail loses info (German "
            "verb-final) → worse translations silently."),
        # stage 4
        "model_q_lookahead": (
            "Training w/ teacher forcing: pos t can see input t+1 = its own label → copies it, loss ≈ 0. Never "
            "learned to predict from past. Inference: last pos has nothing ahead to copy → garbage. Also earlier "
            "positions' contexts ≠ training ones."),
        "model_q_modulelist": (
            "(a) [block]*2 = same object twice → parameters() dedups → count = 1 block (half). state_dict keeps "
            "both names layers.0.*, layers.1.*, equal tensors. (b) loads fine (keys/shapes match), same outputs "
            "(both blocks = same weights); further training: correct model's blocks diverge, classmate's stay tied."),
        "model_q_masks": (
            "(b,1,src,1) broadcasts over keys → masks queries, not keys. Real token: row all True → attends to "
            "pads too. Pad token: row all False → all -1e9 → uniform weights, no NaN. Padding-invariance test: "
            "fails, real outputs change when pads are added."),
        # stage 5
        "train_q_smoothing_padding": (
            "(a) Same. ignore_index removes pad positions from both the NLL term and the ε-term, and from the "
            "denominator N (real tokens) of the mean. Other batch: weight per token = 1/N, N bigger beside long "
            "sentences → each of its tokens counts less. (b) floor = H(q) ≈ -(0.9)ln 0.9 + 0.1·ln(K/0.1); K → 2K "
            "adds 0.1·ln 2 ≈ 0.069 nats (ε mass over twice the words)."),
        "train_q_resume": (
            "(a) Scheduler = step counter. Fresh one restarts warm-up → lr drops to ~step-1 value, 400 slow steps, "
            "schedule offset by 1000. (b) Optimizer = Adam moments m, v. Reset to 0 → bias-corrected update "
            "≈ lr·sign(g) per weight, at a big lr (~0.63 of peak) → jolt, loss may spike."),
        "train_q_averaging": (
            "Same run: checkpoints close in weight space, one basin → mean is fine. Separate runs: different "
            "solutions, hidden units/heads permuted → unit i ≠ unit i → average mixes unrelated features, loss "
            "barrier between them → much worse, possibly ~untrained."),
        # stage 6
        "dec_q_mask": (
            "1 layer: last pos attends to all previous anyway → same logits → same tokens. ≥2 layers: layer-1 "
            "outputs of earlier positions now include later tokens → layer 2's last pos reads different vectors "
            "than in training → argmax can change."),
        "dec_q_finished": (
            "Text: same — decode cuts at first <eos>, look-ahead keeps later tokens from touching earlier ones. "
            "Speed: same — whole batch runs every step anyway, stop rule unchanged. <pad>: keeps ys clean for code "
            "reading ys directly. finished: lets the loop stop before max_len."),
        "dec_q_attention": (
            "1) encoder output j ≠ word j: self-attention mixed the sentence into it. 2) one head/layer among "
            "many; residuals, FFN carry info around it; weight × small value vector ≈ nothing."),
        # stage 7
        "fast_q_cache": (
            "No mask → each new token changes every earlier position's output in layer 1 → all later layers too. "
            "Layer-1 K, V = proj(emb + PE) → still valid. Layers ≥ 2: K, V from changed inputs → recompute all. "
            "Cost per step ~ t positions per layer → total ~n(n+1)/2 again (N ≥ 2)."),
        "fast_q_length": (
            "lp(n) = ((5+n)/6)^α. α=1: lp(14)=3.17, lp(7)=2 → -7/3.17=-2.21 vs -4.5/2=-2.25 → 14-token wins. "
            "α=0.6: 2.00, 1.52 → -3.51 vs -2.97 → 7-token wins. α=0: -7 vs -4.5 → 7-token. Bigger α → bigger "
            "divisor for long → favours length."),
    },
    "tutorial": {
        "why_q_uniform": (
            "Let's look at the two cases. When all weights are 1/20, the context vector is just the average of "
            "the twenty encoder outputs, so it describes the sentence as a whole. When one weight is nearly 1, "
            "the context is basically that one encoder output, so the decoder reads one source word (with a bit "
            "of its neighbourhood). If every step used even weights, every step would get the same average, "
            "which is exactly the single summary vector of the model without attention. With long sentences "
            "that average has to hold many more words, each contributing only 1/n, so details get lost."),
        "why_q_softmax": (
            "First, raw scores: they can be negative and have any size, so the context would be a sum whose "
            "magnitude depends on the sentence length and on how big the scores happen to be. The padded "
            "positions, set to a huge negative score, would then be multiplied in instead of ignored. Second, "
            "argmax: picking the single best position is a jump, so tiny changes in the scores do not change "
            "anything and the gradient is zero. The projections that produce the scores would never learn, "
            "and the decoder could not mix several source words either."),
        "pe_q_causal": (
            "With a causal mask the first token can only attend to itself, the second to the first two, and so "
            "on. So the output at a position depends on which tokens came before it, and shuffling the input "
            "changes the outputs themselves. For 'dog bites man' the first output comes from 'dog' alone and for "
            "'man bites dog' from 'man' alone, so the model can tell them apart. It can even work out where a "
            "token is, for example from how spread out its attention has to be over the tokens before it."),
        "pe_q_buffer": (
            "The key point is that `to()` and `double()` only touch parameters and registered buffers. A plain "
            "tensor attribute is left alone. (a) After `model.to('cuda')` the table is still on the CPU while the "
            "batch is on the GPU, so adding them raises a device mismatch error. (b) After `model.double()` the "
            "table is still float32, but adding a float32 tensor to a float64 batch just promotes to float64, so "
            "it runs without error."),
        "pe_q_scale": (
            "From section 6, an embedding entry is around 0.014 and an encoding entry around 0.57. So without the "
            "scale the position part is roughly forty times bigger and words are almost invisible in the sum. "
            "Multiplying the embedding by the square root of 64, which is 8, brings it to about 0.11, still "
            "smaller than the encoding but only by a factor of about five. If instead both word and position are "
            "multiplied by 8, their ratio doesn't change at all, so that's just as unbalanced as forgetting the "
            "factor, only larger."),
        "attn_q_scale": (
            "Step by step: with 8 heads each head has d_k = 64, so q·k has variance 64. Dividing by sqrt(512) "
            "instead of sqrt(64) gives variance 64/512 = 0.125, a standard deviation of about 0.35. Such small "
            "scores make the softmax almost flat, so every key gets nearly the same weight. With one head the "
            "two square roots are the same, so nothing changes. The model can still learn, because a constant "
            "factor on the scores can be compensated by larger query and key weights; it just begins with "
            "blurry attention and takes longer."),
        "attn_q_mask": (
            "With padding at the end, each query can always see position 0, which is <bos>, so no row is ever "
            "completely masked unless the whole sentence is padding. With padding at the start, the first "
            "queries are <pad> tokens whose allowed keys are all <pad>, so those rows are fully masked. Then "
            "-inf gives exp(-inf) everywhere and 0 divided by 0, a NaN, while -1e9 just gives equal scores and "
            "uniform weights. The NaN doesn't stay put: in the next layer it gets multiplied by a weight of 0, "
            "and 0 times NaN is NaN, so it spreads to all outputs, the loss and the gradients."),
        "attn_q_heads": (
            "The tensor in memory is ordered head by head: head 0's three tokens, then head 1's three tokens. "
            "Reshaping to three positions of width 2·d_k just cuts that sequence into three pieces: position 0 "
            "gets head 0's tokens 0 and 1, position 1 gets head 0's token 2 and head 1's token 0, and position "
            "2 gets head 1's tokens 1 and 2. The shape is fine but tokens are mixed up. If there is only one "
            "head, or only one token, the transpose does nothing to the memory order, so no check could spot it."),
        "block_q_residual": (
            "LayerNorm only looks at one position at a time: it subtracts that position's mean and divides by its "
            "standard deviation. If attention has already made all positions nearly the same vector, normalising "
            "each of them still leaves them the same, which is why the curve in section 4 goes to a cosine "
            "similarity of 1. The residual connection adds each position's input back, so whatever made the "
            "positions different is kept, and gradients also get a direct path back through the addition."),
        "block_q_preln": (
            "Let's go through the checks. The shape check still passes since nothing changes shape. Padding "
            "invariance still passes because the mask and the per-position operations are the same. Both dropout "
            "checks pass: dropout is still on the sublayer outputs, off in eval mode and on in training mode. The "
            "value check and the comparison with nn.TransformerEncoderLayer fail, because PyTorch's layer is "
            "post-LN unless norm_first=True. For the hook on the block's output: it would not show mean 0 and "
            "std 1, since pre-LN adds corrections to the raw input, so it stays close to the input's mean 2 "
            "and spread 3."),
        "block_q_cross": (
            "(a) The look-ahead mask for 6 target tokens is 6 by 6, but the cross-attention scores are 6 by 7 "
            "(6 queries, 7 source keys). The last dimensions don't broadcast, so PyTorch raises an error. (b) If "
            "both lengths are equal, the mask fits and nothing complains, but target word t can only look at "
            "source words up to t. The source is completely available, so there is nothing to hide, and German "
            "often puts important words like the verb at the end, which the English words need early. The "
            "translations just get worse."),
        "model_q_lookahead": (
            "The problem is created during training. Because of teacher forcing, the token at position t+1 in the "
            "decoder input is the correct answer for position t. Without the look-ahead mask, position t can "
            "attend to it and simply copy it, which gives a tiny loss without learning to translate. When "
            "translating, the last position has nothing after it to copy, and the model never learned to predict "
            "from the source and the earlier words only, so it guesses badly."),
        "model_q_modulelist": (
            "(a) Multiplying a list repeats the same block object, so both entries share all their weights. "
            "count_parameters goes through parameters(), which lists each tensor once, so it reports only one "
            "block, half the correct number. The state_dict, however, lists modules by their names, so it has "
            "keys for layers.0 and layers.1 with the same values. (b) Those keys and shapes are exactly what a "
            "correct model expects, so it loads without error and gives the same outputs. Training it further, "
            "the two blocks are now separate and will start to differ."),
        "model_q_masks": (
            "A mask of shape (batch, 1, src_len, 1) is broadcast along the last (key) axis, so it now decides "
            "per query row instead of per key column. For a real token the whole row is allowed, so it also "
            "attends to the padding keys. For a padding token the whole row is masked, so all scores are -1e9 and "
            "the softmax gives equal weights, without NaN. A padding-invariance test would catch it: adding more "
            "padding changes what the real tokens attend to and therefore their outputs."),
        "train_q_smoothing_padding": (
            "(a) The loss is the same. Positions whose target is <pad> are ignored completely: they add nothing to "
            "the cross-entropy part, nothing to the smoothing part, and they are not counted when taking the mean. "
            "That count is also why the other batch differs: the mean divides by all real target tokens of the "
            "batch, so next to four long sentences there are more of them and each token of our sentence gets a "
            "smaller share of the loss and of the gradient. (b) The best model can only match the smoothed "
            "target, so the floor is its entropy, about -(1-ε)ln(1-ε) + ε·ln(K/ε). Doubling K only changes the "
            "second part, by ε·ln 2, so the floor goes up by about 0.07 nats."),
        "train_q_resume": (
            "It helps to think about what is stored. (a) The scheduler only stores how many steps were taken. A "
            "new scheduler starts at step 0, so after its first step the learning rate drops to the very "
            "beginning of the warm-up and climbs again over 400 steps, and the rest of the schedule is shifted. "
            "(b) The optimizer stores Adam's running averages of gradients and squared gradients. Starting them "
            "from zero makes the first updates about one learning rate in size in every weight, and the rate at "
            "step 1000 is still high, so the model gets a big, noisy kick."),
        "train_q_averaging": (
            "Checkpoints from the end of one run are all near the same point, so their average is also a good "
            "model. Two models trained from different initialisations usually end up with their hidden units and "
            "heads in different orders and with different features. Averaging them matches unit 1 with unit 1 "
            "even though they do unrelated things, so the average is a mix that works much worse than either "
            "model, often close to a random one."),
        "dec_q_mask": (
            "In greedy decoding we only use the last position. In the first layer the last position can already "
            "see everything before it, so a one-layer decoder gives the same tokens. With more layers, the earlier "
            "positions in layer 1 can now see tokens that come after them, so their outputs change, and the last "
            "position in layer 2 reads those changed outputs. These inputs are not what the model saw during "
            "training, so its predictions, and the tokens, can change."),
        "dec_q_finished": (
            "The printed translations would not change: decoding to text stops at the first <eos>, and thanks to "
            "the look-ahead mask the tokens after <eos> can't affect the ones before it. The speed would not "
            "change either, since the whole batch is computed every step and the loop still stops once every "
            "row is finished. The <pad> tokens are there so that ys itself only contains the real translation, "
            "which matters for anything that reads ys directly; the finished vector is what allows stopping "
            "before max_len."),
        "dec_q_attention": (
            "First, the encoder output at a source position is not just that word: encoder self-attention has "
            "blended in the rest of the sentence. Second, a single attention map is only one head in one layer; "
            "other heads and layers, the residual connections and the feed-forward layers also shape the "
            "output, and a big weight on a small value vector contributes little."),
        "fast_q_cache": (
            "Without a mask, adding token t lets every earlier position attend to it, so all their outputs in "
            "layer 1 change, and therefore the inputs of every later layer change too. The first layer's keys and "
            "values only depend on each token's own embedding and position, so they can stay cached. The keys "
            "and values of layer 2 onwards are computed from changed inputs and must all be recomputed. So each "
            "step costs work for all t positions again, and the total goes back to roughly n(n+1)/2."),
        "fast_q_length": (
            "With lp(n) = ((5 + n)/6)^alpha: for alpha = 1, lp(14) = 19/6 ≈ 3.17 and lp(7) = 12/6 = 2, giving "
            "-7/3.17 ≈ -2.21 and -4.5/2 = -2.25, so the 14-token one wins. For alpha = 0.6, lp(14) ≈ 2.00 and "
            "lp(7) ≈ 1.52, giving -3.51 and -2.97, so the 7-token one wins. With alpha = 0 there is no penalty and "
            "-4.5 beats -7. Log-probabilities only get more negative with length, and a larger alpha divides long "
            "hypotheses by more, which helps them."),
    },
    "prose": {
        "why_q_uniform": (
            "If every source word gets the same weight, the decoder receives the plain average of all the encoder "
            "vectors: a rough picture of the whole sentence, with no word standing out. If one word gets almost "
            "all the weight, the decoder receives essentially the vector of that single word. A model whose "
            "weights were always even would hand the decoder the same average at every step, so it would be no "
            "better than the old model that squeezes the sentence into one vector. The longer the sentence, the "
            "smaller each word's share of that average, so its information fades."),
        "why_q_softmax": (
            "Using the raw scores as weights would let them be negative or very large, and they would not add up "
            "to one, so the context would grow or shrink with the length of the sentence and with the size of "
            "the scores; the padding, marked by a huge negative number, would even be counted instead of "
            "dropped. Reading only the best position would be a hard choice that does not move when the scores "
            "move a little, so training would get no signal about where to look, and the decoder could never "
            "combine two source words."),
        "pe_q_causal": (
            "No. Because of the mask, each token only sees the ones before it, so the first word sees only "
            "itself and the last word sees everything. Changing the order changes what each position sees, and "
            "so the results are different, not merely rearranged. The two sentences about the dog and the man "
            "start with different words, so their first results already differ and the model can tell them "
            "apart. The model can also guess how far into the sentence it is, since the number of earlier "
            "tokens it averages over grows with the position."),
        "pe_q_buffer": (
            "Moving or converting a model only affects its parameters and its registered buffers; an ordinary "
            "attribute is not seen. In the first case the table stays in the computer's main memory while the "
            "batch is on the graphics card, and the addition fails with an error about different devices. In the "
            "second case the table stays in single precision while the batch is in double precision, but PyTorch "
            "simply converts the result to double precision, so nothing fails."),
        "pe_q_scale": (
            "The notebook showed that a word's numbers are about 0.014 while the position's numbers are about "
            "0.57, so without the scaling the sum is mostly position and different words hardly change it. "
            "Multiplying the word part by eight, the square root of 64, makes it about 0.11, which is still "
            "smaller than the position part but no longer tiny in comparison. The classmate's idea multiplies "
            "both parts by the same number, so the word is still forty times weaker than the position, exactly "
            "as if the scaling had been forgotten."),
        "attn_q_scale": (
            "With eight heads, each head's vectors have 64 entries, so the raw dot product has a variance of 64. "
            "Dividing by the square root of 512 leaves a variance of one eighth, so the scores are all close to "
            "zero and the attention weights are almost equal: the heads barely prefer any key at the start. With "
            "a single head the two divisors are the same number, so the mistake would not matter. The model is "
            "not broken, though: the weights that produce queries and keys can grow to make up for the extra "
            "factor, so it only starts out worse and trains more slowly."),
        "attn_q_mask": (
            "When the padding comes at the end, every query can still see the first token, the start marker, so "
            "no row is hidden entirely, unless a sentence consists only of padding. When the padding comes "
            "first, the first few queries are padding that may only look at padding, so their rows are hidden "
            "entirely. Minus infinity then makes the softmax divide zero by zero and produce NaN, while a large "
            "finite negative number just gives every key the same weight. Even if nobody reads that position, "
            "the next layer multiplies its value by a zero weight, and zero times NaN is still NaN, so the NaN "
            "reaches every output and finally the loss and the gradients."),
        "attn_q_heads": (
            "In memory the numbers lie head after head, each head listing its three tokens in turn. Reshaping "
            "without transposing simply slices that list into three equal parts, so the first output position "
            "holds the first head's first two tokens, the second holds the first head's last token together with "
            "the second head's first token, and the third holds the second head's last two tokens. The shape is "
            "right but the tokens are mixed. Nothing would catch it with a single head or a single token, because "
            "then swapping the two axes does not change the order of the numbers."),
        "block_q_residual": (
            "Layer normalisation rescales each position using only that position's own numbers. It cannot tell "
            "whether two positions have become alike, and if they are alike before it they are alike after it. "
            "That is why, in the figure without residual connections, the positions still end up pointing the "
            "same way although every layer ends with a normalisation. The residual connection keeps each "
            "position's original vector and only adds attention's result to it, so the differences between "
            "positions are never lost."),
        "block_q_preln": (
            "The shape would still be right, and padding would still have no effect, since the same mask and the "
            "same per-position layers are used. The two dropout tests would pass as well, because dropout is "
            "still applied only to what each sublayer returns. The test of the exact values and the comparison "
            "with PyTorch's own layer would fail, since PyTorch normalises after the addition by default and "
            "the order changes the result. The recorded output of the block would no longer look normalised: it "
            "is the input plus some corrections, so it would keep roughly the input's average of two and spread "
            "of three."),
        "block_q_cross": (
            "In the first case the mask is six by six while the attention scores are six by seven, so the two "
            "cannot be combined and the program stops with an error. In the second case the sizes match and "
            "nothing warns you, but each English word may now only look at the German words up to its own "
            "position. Since the whole German sentence is known before translating, hiding its end gains nothing "
            "and throws away information, and German often keeps the verb for the end, so the translations "
            "silently become worse."),
        "model_q_lookahead": (
            "The model learned the wrong thing while training. During training the decoder is given the correct "
            "sentence, so each position could simply look at the next word, which is the very word it must "
            "predict, and copy it. That makes the training loss tiny without any real translating. When the "
            "model translates on its own, the last position has no next word to look at, and since it never "
            "learned to guess from what came before, its choices are poor."),
        "model_q_modulelist": (
            "Repeating the list puts the very same block in both places. Counting the parameters visits each "
            "weight only once, so the count is that of a single block, half of what two separate blocks would "
            "have. The saved file, on the other hand, names the weights by their position in the list, so it "
            "contains entries for both layers, which happen to be identical. A correct model accepts that file "
            "without complaint and computes the same results, because both of its blocks receive the same "
            "weights; only if it is trained further do its two blocks start to differ."),
        "model_q_masks": (
            "With the one in the wrong place, the mask no longer says which words may be looked at but which "
            "words may look. Real words may then look at everything, padding included, while padding words may "
            "look at nothing and end up giving every word the same weight, which stays finite because the "
            "filler is a large finite number. A test that adds padding and checks that the real words' results "
            "stay the same would fail, because the real words now read the added padding."),
        "train_q_smoothing_padding": (
            "The loss would be the same in both cases. Padding positions are skipped entirely: they count "
            "neither in the part that rewards the right word nor in the part spread over the other words, and "
            "they are not included when the average is taken. But the average is taken over every real word of "
            "the batch, so when the sentence sits beside four long ones, its words are a smaller part of the "
            "total and each of them matters less. With smoothing the best loss is the entropy of the spread-out "
            "target. With twice as many words the spread-out tenth of the probability is shared by twice as many "
            "words, each half as likely, and that raises the floor by a tenth of the logarithm of two, about 0.07."),
        "train_q_resume": (
            "The scheduler remembers only how far training has come. If it is not restored, it believes training "
            "has just begun, so the learning rate falls back to almost nothing and slowly climbs again through "
            "the warm-up, and everything afterwards happens a thousand steps late. The optimiser remembers "
            "Adam's averages of past gradients. If those are lost, Adam starts them again from zero, and its "
            "first steps are large for every weight, taken at the fairly high learning rate of step one "
            "thousand, which can throw the model off for a while."),
        "train_q_averaging": (
            "The last checkpoints of one training run are small variations of the same model, so averaging them "
            "stays close to that model and can only smooth away noise. Two models trained separately may compute "
            "similar things, but they arrange their internal units differently, so the unit in a given place "
            "means something different in each. Averaging them blends unrelated pieces and produces a model "
            "that is far worse than either, often no better than an untrained one."),
        "dec_q_mask": (
            "Only the last position decides the next word. In the first layer that position can see every "
            "earlier word whether or not the mask is there, so with a single layer nothing changes. With more "
            "layers, the earlier positions in the first layer can now look at words that come after them, so "
            "they produce different results, and in the second layer the last position reads those different "
            "results. The model was never trained on such inputs, so it may pick different words."),
        "dec_q_finished": (
            "The translations shown would be unchanged: turning the tokens into text stops at the end marker, "
            "and because of the mask nothing written afterwards can alter the words before it. The speed would "
            "be unchanged too, because every sentence in the batch is processed at each step anyway and the loop "
            "still ends when all sentences are done. Writing padding keeps the stored output tidy for any code "
            "that reads it without looking for the end marker, and keeping track of which sentences are done is "
            "what lets the loop end early."),
        "dec_q_attention": (
            "The vector at a source position has already absorbed information from the whole sentence in the "
            "encoder, so looking at it does not mean looking at that word alone. Besides, one map shows one head "
            "of one layer, while the final choice also depends on the other heads and layers, on the paths that "
            "bypass attention and on the layers after it; a large weight can even multiply a vector too small to "
            "matter."),
        "fast_q_cache": (
            "If every position could look at every other, adding a new word would change what all the earlier "
            "positions compute in the first layer, and from there in all the following layers. What the first "
            "layer derives directly from each word and its position would stay the same and could be kept. "
            "Everything the later layers derive from the first layer's results would have to be computed again "
            "for all positions at every step, so the saving disappears and the total work grows with the square "
            "of the length again, about n(n+1)/2 as before."),
        "fast_q_length": (
            "The penalty is ((5 + n)/6) raised to alpha. With alpha one, the long hypothesis is divided by about "
            "3.17 and scores about -2.21, the short one is divided by 2 and scores -2.25, so the long one wins. "
            "With alpha 0.6 the divisors are about 2.00 and 1.52, the scores about -3.51 and -2.97, so the short "
            "one wins, and with alpha zero the short one wins as well, -4.5 against -7. Each "
            "extra word can only lower the total, so short answers are favoured unless the penalty, which grows "
            "faster for a larger alpha, lifts the long ones."),
    },
}
