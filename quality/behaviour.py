"""What a stage's code does, observed on random inputs: the yardstick that tells an equivalent mutant
(same outputs as the reference for every public function and class of the stage) from a mistake.

`observe(assignment, module)` calls the functions and classes its stage's probe names (`_stage0` ... `_stage7`,
written by hand: a new exercise must be added to its stage's probe, or every mutant of it looks equivalent),
with and without masks, in eval and train mode (dropout seeded), on several sizes, and returns what came out
(tensors, numbers, or the kind of error raised). Two modules behave the same when their observations agree.
"""

from __future__ import annotations

import math
import signal
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from quality.mutations import STAGE_MODULES, Mutant, module_source
from transformer_course.reference import Transformer
from transformer_course.reference.training import collate as reference_collate

Observations = dict[str, Any]


class TimedOut(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TimedOut after `seconds` (main thread only; elsewhere no limit)."""
    def expire(signum: int, frame: Any) -> None:  # noqa: ARG001
        raise TimedOut(f"no result within {seconds} s")

    try:
        previous = signal.signal(signal.SIGALRM, expire)
    except ValueError:  # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load(source: str, name: str) -> types.ModuleType:
    """Execute a module's source as a fresh module (registered while it runs, for dataclasses)."""
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    try:
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102
    finally:
        sys.modules.pop(name, None)
    return module


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _randomised(module: nn.Module) -> nn.Module:
    """Every parameter drawn at random (seeded), so that layers built alike (LayerNorms start as 1 and 0)
    are told apart."""
    with torch.no_grad():
        for index, (_, parameter) in enumerate(sorted(module.named_parameters())):
            parameter.copy_(_randn(*parameter.shape, seed=100 + index) / math.sqrt(parameter.shape[-1])
                            + (1.0 if parameter.dim() == 1 and index % 2 else 0.0))
    return module


def _record(observations: Observations, key: str, action: Callable[[], Any]) -> Any:
    """Run `action`; store its result (or the kind of error it raised) under `key`."""
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            value = action()
    except TimedOut:
        raise
    except Exception as error:  # what the mutant raises is an observation too
        observations[key] = f"raised {type(error).__name__}"
        return None
    observations[key] = _freeze(value)
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return tuple(_freeze(item) for item in value)
    if isinstance(value, dict):
        return {key: _freeze(item) for key, item in value.items()}
    if isinstance(value, nn.Module):
        return {name: tensor.detach().clone() for name, tensor in value.state_dict().items()}
    if hasattr(value, "__dataclass_fields__"):
        return {name: _freeze(getattr(value, name)) for name in value.__dataclass_fields__}
    return value


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape \
                or a.dtype != b.dtype or a.device != b.device:
            return False
        if a.dtype == torch.bool or not a.is_floating_point():
            return torch.equal(a, b)
        return bool(torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6, equal_nan=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


# --- the stages ----------------------------------------------------------------------------------------


def _stage1(module: Any, observations: Observations) -> None:
    for d_model, length in ((16, 50), (6, 5), (34, 23)):
        encoding = _record(observations, f"build {d_model}", lambda d=d_model, n=length:
                           module.PositionalEncoding(d, n, 0.5))
        if encoding is None:
            continue
        _record(observations, f"buffers {d_model}", lambda e=encoding: tuple(sorted(dict(e.named_buffers()))))
        _record(observations, f"pe {d_model}", lambda e=encoding: e.pe)
        for seq_len in (1, min(7, length), length):
            x = _randn(3, seq_len, d_model, seed=seq_len)
            _record(observations, f"eval {d_model} {seq_len}", lambda e=encoding, x=x: e.eval()(x))
            _record(observations, f"train {d_model} {seq_len}", lambda e=encoding, x=x: e.train()(x))
    for k, d_model in ((3, 16), (1, 6), (0, 6), (-4, 12), (47, 12)):  # the offset as a matrix
        _record(observations, f"offset_matrix {k} {d_model}", lambda k=k, d=d_model: module.offset_matrix(k, d))
    table = 1.0 + torch.rand(10, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    matrix = -torch.eye(6, dtype=torch.float64) + 0.1 * _randn(6, 6, seed=6).double()
    for k in (3, 0, -2, 9):
        _record(observations, f"largest_offset_error {k}",
                lambda k=k: module.largest_offset_error(table.clone(), matrix.clone(), k))


def _attention_inputs(seed: int, leading: tuple[int, ...], q_len: int, k_len: int, d_k: int
                      ) -> tuple[torch.Tensor, ...]:
    return (_randn(*leading, q_len, d_k, seed=seed) * 1.5, _randn(*leading, k_len, d_k, seed=seed + 1) * 1.5,
            _randn(*leading, k_len, d_k + 1, seed=seed + 2))


def _stage2(module: Any, observations: Observations) -> None:
    for leading, q_len, k_len in (((2, 3), 4, 6), ((2,), 5, 5), ((1, 2), 6, 6)):
        Q, K, V = _attention_inputs(7, leading, q_len, k_len, 4)
        mask = torch.rand(leading[0], 1, q_len, k_len, generator=torch.Generator().manual_seed(3)) > 0.4
        mask[..., 0] = True
        mask = mask if len(leading) == 2 else mask[:, 0]
        causal = torch.ones(q_len, k_len, dtype=torch.bool).tril()
        for name, used in (("none", None), ("bool", mask), ("int", mask.int()), ("long", mask.long()),
                           ("causal", causal)):
            _record(observations, f"sdpa {leading} {name}",
                    lambda used=used, Q=Q, K=K, V=V: module.scaled_dot_product_attention(Q, K, V, used))
    tokens = torch.tensor([[5, 0, 7, 1, 1], [2, 3, 4, 9, 8], [1, 1, 1, 1, 1], [0, 6, 1, 2, 0]])
    for pad in (0, 1, 9):
        _record(observations, f"padding {pad}", lambda pad=pad: module.make_padding_mask(tokens, pad))
    for size in (1, 2, 5):
        _record(observations, f"look-ahead {size}", lambda size=size: module.make_look_ahead_mask(size))
        _record(observations, f"look-ahead cpu {size}",
                lambda size=size: module.make_look_ahead_mask(size, device=torch.device("cpu")))
    for d_model, heads, q_len, k_len in ((16, 4, 5, 7), (12, 3, 4, 4), (6, 1, 3, 2)):
        torch.manual_seed(d_model)
        attention = _record(observations, f"mha {d_model}",
                            lambda d=d_model, h=heads: _randomised(module.MultiHeadAttention(d, h)))
        if attention is None:
            continue
        attention.eval()
        q, k, v = (_randn(2, length, d_model, seed=seed) for seed, length in ((1, q_len), (2, k_len), (3, k_len)))
        padding = (torch.arange(k_len) < torch.tensor([k_len, max(1, k_len - 2)])[:, None]).view(2, 1, 1, k_len)
        causal = torch.ones(q_len, q_len, dtype=torch.bool).tril().view(1, 1, q_len, q_len)
        with torch.no_grad():
            _record(observations, f"mha cross {d_model}", lambda a=attention, q=q, k=k, v=v, m=padding: (
                a(q, k, v, m), a.attn_weights))
            _record(observations, f"mha self {d_model}", lambda a=attention, q=q, m=causal: (
                a(q, q, q, m), a.attn_weights))
            _record(observations, f"mha nomask {d_model}", lambda a=attention, q=q, k=k, v=v: a(q, k, v))
            _record(observations, f"split {d_model}", lambda a=attention, q=q: a.split_heads(q))
            _record(observations, f"combine {d_model}", lambda a=attention, d=d_model, h=heads:
                    a.combine_heads(_randn(2, h, 3, d // h, seed=9)))


def _stage3(module: Any, observations: Observations) -> None:
    d_model, heads, d_ff = 12, 3, 20
    x, memory = _randn(2, 5, d_model, seed=1), _randn(2, 6, d_model, seed=2)
    padding = (torch.arange(6) < torch.tensor([6, 4])[:, None]).view(2, 1, 1, 6)
    self_padding = (torch.arange(5) < torch.tensor([5, 3])[:, None]).view(2, 1, 1, 5)
    causal = torch.ones(5, 5, dtype=torch.bool).tril().view(1, 1, 5, 5)
    torch.manual_seed(0)
    feed_forward = _record(observations, "ffn", lambda: _randomised(module.PositionWiseFeedForward(d_model, d_ff)))
    if feed_forward is not None:
        _record(observations, "ffn forward", lambda: feed_forward(x))
    for mode in ("eval", "train"):
        torch.manual_seed(1)
        encoder = _record(observations, "encoder", lambda: _randomised(module.EncoderBlock(d_model, heads, d_ff, 0.3)))
        if encoder is not None:
            getattr(encoder, mode)()
            _record(observations, f"encoder {mode}", lambda e=encoder: e(x, self_padding))
            _record(observations, f"encoder nomask {mode}", lambda e=encoder: e(x, None))
        torch.manual_seed(2)
        decoder = _record(observations, "decoder", lambda: _randomised(module.DecoderBlock(d_model, heads, d_ff, 0.3)))
        if decoder is not None:
            getattr(decoder, mode)()
            _record(observations, f"decoder {mode}", lambda d=decoder: d(x, memory, padding, causal))
            _record(observations, f"decoder weights {mode}", lambda d=decoder: (
                d.self_attn.attn_weights, d.cross_attn.attn_weights))


def _tokens(batch: int, length: int, vocab: int, pad: int, seed: int) -> torch.Tensor:
    tokens = torch.randint(4, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    for row in range(1, batch):
        tokens[row, length - row:] = pad
    return tokens


def _tiny_transformer(module: Any, seed: int) -> Any:
    torch.manual_seed(seed)
    return _randomised(module.Transformer(13, 11, 16, 2, 2, 24, 30, 0.2))


def _stage4(module: Any, observations: Observations) -> None:
    pad = 1
    src, tgt = _tokens(3, 6, 13, pad, 1), _tokens(3, 5, 11, pad, 2)
    for name, tokens in (("tgt", tgt), ("src", src), ("one", tgt[:1, :1])):
        _record(observations, f"target mask {name}", lambda tokens=tokens: module.make_target_mask(tokens, pad))
    source_mask = (src != pad).view(3, 1, 1, 6)
    memory = None
    target_mask = torch.ones(5, 5, dtype=torch.bool).tril().view(1, 1, 5, 5) & (tgt != pad).view(3, 1, 1, 5)
    for mode in ("eval", "train"):
        torch.manual_seed(3)
        encoder = _record(observations, "encoder", lambda: _randomised(module.Encoder(13, 16, 2, 2, 24, 30, 0.2)))
        if encoder is not None:
            getattr(encoder, mode)()
            memory = _record(observations, f"encoder {mode}", lambda e=encoder: e(src, source_mask))
        torch.manual_seed(4)
        decoder = _record(observations, "decoder", lambda: _randomised(module.Decoder(11, 16, 2, 2, 24, 30, 0.2)))
        if decoder is not None and isinstance(memory, torch.Tensor):
            getattr(decoder, mode)()
            _record(observations, f"decoder {mode}", lambda d=decoder, m=memory: d(tgt, m, source_mask, target_mask))
        model = _record(observations, "transformer", lambda: _tiny_transformer(module, 5))
        if model is not None:
            getattr(model, mode)()
            _record(observations, f"transformer {mode}", lambda m=model: m(src, tgt, source_mask, target_mask))


def _pairs(count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for index in range(count):
        source = torch.randint(4, 13, (3 + index % 4,), generator=generator).tolist()
        target = [2, *torch.randint(4, 11, (2 + (index * 3) % 5,), generator=generator).tolist(), 3]
        pairs.append((source, target))
    return pairs


def _stage5(module: Any, observations: Observations) -> None:
    pad = 1
    for seed in range(3):
        _record(observations, f"collate {seed}", lambda seed=seed: module.collate(_pairs(4, seed), pad))
    criterion = nn.CrossEntropyLoss(ignore_index=pad, label_smoothing=0.1)
    reference_batches = [reference_collate(_pairs(4, seed), pad) for seed in range(3)]  # one property, one place
    torch.manual_seed(6)
    model = _randomised(Transformer(13, 11, 16, 2, 1, 24, 30, 0.0))
    for index, batch in enumerate(reference_batches):
        def loss_and_gradient(batch: Any = batch) -> tuple[Any, ...]:
            model.zero_grad()
            loss = module.compute_loss(model, batch, criterion)
            loss.backward()
            return loss, model.decoder.pred_layer.weight.grad
        _record(observations, f"loss {index}", loss_and_gradient)
    for d_model, warmup, factor in ((512, 4000, 1.0), (16, 3, 2.0)):
        for step in (0, 1, 2, 3, 4, 10, 3999, 4000, 4001, 10**5):
            _record(observations, f"noam {d_model} {step}", lambda s=step, d=d_model, w=warmup, f=factor:
                    module.noam_learning_rate(s, d, w, f))

    def one_epoch(clip: float, with_scheduler: bool) -> tuple[Any, ...]:
        torch.manual_seed(7)
        model = _randomised(Transformer(13, 11, 16, 2, 1, 24, 30, 0.3))
        optimizer, scheduler = module.make_optimizer(model, 16, warmup_steps=2, factor=3.0)
        model.eval()
        loss = module.train_epoch(model, list(reference_batches), criterion, optimizer,
                                  scheduler if with_scheduler else None,
                                  clip_norm=clip, progress=False)
        return loss, model, scheduler.get_last_lr(), model.training

    _record(observations, "epoch", lambda: one_epoch(1.0, with_scheduler=True))
    _record(observations, "epoch clipped", lambda: one_epoch(0.05, with_scheduler=True))
    _record(observations, "epoch without a scheduler", lambda: one_epoch(1.0, with_scheduler=False))


def _stage6(module: Any, observations: Observations) -> None:
    pad, bos, eos = 1, 2, 3
    src = _tokens(4, 6, 13, pad, 8)
    for bias in (0.0, 1.5, 3.0):
        torch.manual_seed(9)
        model = _randomised(Transformer(13, 11, 16, 2, 2, 24, 40, 0.2))
        with torch.no_grad():
            model.decoder.pred_layer.bias[eos] += bias  # some sentences end early, some never
        for max_len in (1, 6, 12):
            _record(observations, f"greedy {bias} {max_len}", lambda m=model, n=max_len: (
                module.greedy_decode(m, src, pad, bos, eos, n), m.training))
        model.eval()
        with torch.no_grad():
            tgt = _tokens(4, 5, 11, pad, 10)
            model(src, tgt, (src != pad).view(4, 1, 1, 6),
                  torch.ones(5, 5, dtype=torch.bool).tril().view(1, 1, 5, 5))
        _record(observations, f"maps {bias}", lambda m=model: module.attention_maps(m))


def _stage0(module: Any, observations: Observations) -> None:
    for query_size, key_size, size, q_len, k_len in ((5, 7, 6, 3, 4), (4, 4, 3, 1, 6), (6, 3, 8, 2, 2)):
        torch.manual_seed(query_size)
        attention = _record(observations, f"additive {query_size}",
                            lambda q=query_size, k=key_size, a=size: _randomised(module.AdditiveAttention(q, k, a)))
        if attention is None:
            continue
        query, keys = _randn(3, q_len, query_size, seed=1), _randn(3, k_len, key_size, seed=2)
        mask = torch.arange(k_len) < torch.tensor([k_len, max(1, k_len - 1), max(1, k_len - 2)])[:, None]
        _record(observations, f"score {query_size}", lambda a=attention, q=query, k=keys: a.score(q, k))
        _record(observations, f"forward {query_size}", lambda a=attention, q=query, k=keys, m=mask: a(q, k, m))
        _record(observations, f"forward int {query_size}", lambda a=attention, q=query, k=keys, m=mask:
                a(q, k, m.int()))


def _cache_fields(cache: Any) -> tuple[Any, ...]:
    return tuple(getattr(cache, name, None) for name in ("self_keys", "self_values", "cross_keys", "cross_values"))


def _stage7(module: Any, observations: Observations) -> None:
    pad, bos, eos = 1, 2, 3
    src = _tokens(3, 6, 13, pad, 8)
    source_mask = (src != pad).view(3, 1, 1, 6)
    for bias in (0.0, 2.5):
        torch.manual_seed(11)
        model = _randomised(Transformer(13, 11, 16, 2, 2, 24, 40, 0.0)).eval()
        with torch.no_grad():
            model.decoder.pred_layer.bias[eos] += bias
            memory = model.encoder(src, source_mask)
        cache = _record(observations, f"start {bias}", lambda m=model, e=memory: module.start_cache(m, e, source_mask))
        if cache is not None:
            _record(observations, f"start fields {bias}", lambda c=cache: _cache_fields(c))
            tokens = torch.full((3, 1), bos)
            for step in range(3):
                logits = _record(observations, f"step {bias} {step}", lambda m=model, c=cache, t=tokens:
                                 module.decoder_step(m, c, t))
                _record(observations, f"step fields {bias} {step}", lambda c=cache: _cache_fields(c))
                if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
                    break
                tokens = logits.argmax(dim=-1, keepdim=True)
        for max_len in (1, 7):
            _record(observations, f"cached greedy {bias} {max_len}", lambda m=model, n=max_len:
                    module.cached_greedy_decode(m, src, pad, bos, eos, n))
            for beam, alpha in ((1, 0.0), (3, 0.6), (2, 1.0)):
                _record(observations, f"beam {bias} {max_len} {beam} {alpha}", lambda m=model, n=max_len, b=beam,
                        a=alpha: module.beam_search(m, src, pad, bos, eos, n, beam_size=b, alpha=a))
    lengths = torch.tensor([[1, 2, 3], [4, 1, 2]])
    for alpha in (0.0, 0.6, 1.0):
        _record(observations, f"penalty {alpha}", lambda a=alpha: module.length_penalty(lengths.float(), a))
    generator = torch.Generator().manual_seed(4)
    scores = -torch.rand(2, 3, generator=generator) * 3
    log_probs = torch.log_softmax(torch.randn(2, 3, 7, generator=generator), dim=-1)
    for finished in (torch.zeros(2, 3, dtype=torch.bool), torch.tensor([[False, True, False], [True, False, True]])):
        for beam, alpha in ((3, 0.0), (2, 0.6), (3, 1.0)):
            _record(observations, f"select {finished.sum()} {beam} {alpha}", lambda f=finished, b=beam, a=alpha:
                    module.select_beams(scores, log_probs, f, lengths, b, a, pad))


STAGES: dict[str, Callable[[Any, Observations], None]] = {
    "00_why_attention": _stage0, "01_positional_encoding": _stage1, "02_attention": _stage2, "03_blocks": _stage3,
    "04_transformer": _stage4, "05_training": _stage5, "06_decoding": _stage6, "07_fast_and_better_decoding": _stage7,
}


def observe(assignment: str, module: Any, seconds: float = 60.0) -> Observations:
    observations: Observations = {}
    with time_limit(seconds), torch.no_grad() if assignment not in ("05_training",) else _nothing():
        STAGES[assignment](module, observations)
    return observations


@contextmanager
def _nothing() -> Iterator[None]:
    yield


_REFERENCE: dict[str, Observations] = {}


def stage_code(assignment: str, replaced: dict[str, str] | None = None) -> types.SimpleNamespace:
    """What a stage's exercises define, from all its reference modules (one of them replaced by a mutant's
    source): each module loaded afresh, and the names each one defines gathered in one namespace."""
    names: dict[str, Any] = {}
    for module_name in STAGE_MODULES[assignment]:
        source = (replaced or {}).get(module_name) or module_source(module_name)
        loaded = load(source, f"{module_name.rpartition('.')[2]}_{assignment}")
        names |= {name: value for name, value in vars(loaded).items()
                  if getattr(value, "__module__", None) == loaded.__name__}
    return types.SimpleNamespace(**names)


def reference_observations(assignment: str) -> Observations:
    if assignment not in _REFERENCE:
        _REFERENCE[assignment] = observe(assignment, stage_code(assignment))
    return _REFERENCE[assignment]


def equivalent(mutant: Mutant, seconds: float = 60.0) -> bool:
    """Whether the mutant behaves like the reference on every observation (then it is no mistake)."""
    expected = reference_observations(mutant.assignment)
    try:
        module = stage_code(mutant.assignment, {mutant.module or STAGE_MODULES[mutant.assignment][0]:
                                                mutant.module_source})
        got = observe(mutant.assignment, module, seconds)
    except Exception:  # a module that cannot even load, or runs past its time, is a mistake
        return False
    return got.keys() == expected.keys() and all(same(got[key], expected[key]) for key in expected)
