"""Architecture diagrams of the course's Transformer, drawn with matplotlib boxes, arrows and text.

`draw(name)` returns the Figure, `show(name)` displays it, `save_all(folder)` writes one SVG per
diagram, byte for byte the same on every run with the same matplotlib. Regenerate the committed
copies with

    python -m transformer_course.visualisation.diagrams assets/diagrams

Every box is labelled with the attribute name it has in `transformer_course.reference`, so a
student can match the picture to the code. Colours: attention orange, feed-forward blue,
add & norm yellow, embeddings and positional encoding purple, output layers green.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.path import Path as DrawingPath

from transformer_course.visualisation.unseen import not_drawn_while_grading

NAMES: tuple[str, ...] = ("transformer", "encoder_block", "decoder_block", "head_splitting")

Point = tuple[float, float]

# (fill, edge) per kind of box: one colour per kind of layer, the same in every diagram.
COLOURS: dict[str, tuple[str, str]] = {
    "attention": ("#fcd9b0", "#c9731f"),
    "feed_forward": ("#c9ddf4", "#3b74b8"),
    "add_norm": ("#fff0a6", "#b39200"),
    "embedding": ("#e4d4f1", "#8558ab"),
    "output": ("#cfeac6", "#47913a"),
    "dropout": ("#ececec", "#8a8a8a"),
}
LEGEND: dict[str, str] = {
    "attention": "multi-head attention",
    "feed_forward": "position-wise feed-forward",
    "add_norm": "residual add & LayerNorm",
    "embedding": "embedding / positional encoding",
    "output": "output layers",
    "dropout": "dropout",
}
HEAD_COLOURS: tuple[str, ...] = ("#f4a582", "#92c5de", "#b8e186", "#c9b2dd")
INK = "#262626"
NOTE = "#5a5a5a"
MONO = "DejaVu Sans Mono"

# Settings that make the SVG files reproducible: fixed ids, glyphs drawn as paths (no font needed
# to view them), no creation date. The Creator field keeps the matplotlib version on purpose: the
# tests compare the committed files with a fresh run only under the version that wrote them.
SVG_SETTINGS: dict[str, object] = {"svg.hashsalt": "transformer-course-diagrams", "svg.fonttype": "path"}
STYLE: dict[str, object] = {"font.family": "DejaVu Sans", "font.size": 9, "path.simplify": False}


# --------------------------------------------------------------------------------------------------
# Drawing primitives
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """A drawn rectangle: centre (x, y) and size, with the points where arrows attach, in inches."""

    x: float
    y: float
    width: float
    height: float

    @property
    def top(self) -> Point:
        return (self.x, self.y + self.height / 2)

    @property
    def bottom(self) -> Point:
        return (self.x, self.y - self.height / 2)

    @property
    def left(self) -> Point:
        return (self.x - self.width / 2, self.y)

    @property
    def right(self) -> Point:
        return (self.x + self.width / 2, self.y)

    def along_bottom(self, fraction: float) -> Point:
        """Point on the bottom edge, `fraction` of the width from the left corner."""
        return (self.x - self.width / 2 + fraction * self.width, self.y - self.height / 2)


def _canvas(width: float, height: float) -> tuple[Figure, Axes]:
    """A blank figure whose data coordinates are inches from the bottom-left corner."""
    figure = plt.figure(figsize=(width, height))
    axis = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    axis.set_xlim(0, width)
    axis.set_ylim(0, height)
    axis.set_axis_off()
    return figure, axis


def _text(axis: Axes, point: Point, text: str, size: float = 8.5, colour: str = INK, **options: object) -> None:
    """Text centred on `point` unless `ha` / `va` say otherwise."""
    options = {"ha": "center", "va": "center", **options}
    axis.text(point[0], point[1], text, fontsize=size, color=colour, **options)


def _box(
    axis: Axes,
    centre: Point,
    size: tuple[float, float],
    kind: str,
    title: str,
    detail: str = "",
) -> Box:
    """Rounded box coloured by `kind`: `title` (a code name, monospace) and an optional `detail` line."""
    box = Box(centre[0], centre[1], size[0], size[1])
    fill, edge = COLOURS[kind]
    corner = (box.x - box.width / 2, box.y - box.height / 2)
    axis.add_patch(FancyBboxPatch(corner, box.width, box.height, boxstyle="round,pad=0,rounding_size=0.06",
                                  facecolor=fill, edgecolor=edge, linewidth=1.2))
    if detail:
        _text(axis, (box.x, box.y + box.height * 0.2), title, size=9, family=MONO, weight="bold")
        _text(axis, (box.x, box.y - box.height * 0.22), detail, size=7.5, colour=NOTE)
    else:
        _text(axis, centre, title, size=9, family=MONO, weight="bold")
    return box


def _adder(axis: Axes, centre: Point, radius: float = 0.13) -> Box:
    """The residual-connection sum: a circled plus sign."""
    x, y = centre
    axis.add_patch(Circle(centre, radius, facecolor="white", edgecolor=INK, linewidth=1.2))
    axis.plot([x - radius * 0.6, x + radius * 0.6], [y, y], color=INK, linewidth=1.2)
    axis.plot([x, x], [y - radius * 0.6, y + radius * 0.6], color=INK, linewidth=1.2)
    return Box(x, y, 2 * radius, 2 * radius)


def _arrow(axis: Axes, *points: Point, colour: str = INK, head: bool = True) -> None:
    """A line through `points` (straight segments) ending in an arrow head at the last point."""
    codes = [DrawingPath.MOVETO] + [DrawingPath.LINETO] * (len(points) - 1)
    style = "-|>,head_length=0.5,head_width=0.25" if head else "-"
    axis.add_patch(FancyArrowPatch(path=DrawingPath(points, codes), arrowstyle=style, mutation_scale=12,
                                   color=colour, linewidth=1.2, joinstyle="miter"))


def _junction(axis: Axes, point: Point) -> None:
    """A dot where one tensor is sent along two paths."""
    axis.add_patch(Circle(point, 0.035, facecolor=INK, edgecolor="none"))


def _legend(axis: Axes, corner: Point, kinds: Sequence[str], size: float = 8) -> None:
    """Colour key, one swatch per kind, listed downwards from the top-left `corner`."""
    x, y = corner
    for row, kind in enumerate(kinds):
        fill, edge = COLOURS[kind]
        top = y - row * 0.27
        axis.add_patch(Rectangle((x, top - 0.17), 0.3, 0.17, facecolor=fill, edgecolor=edge, linewidth=1))
        _text(axis, (x + 0.42, top - 0.085), LEGEND[kind], size=size, ha="left")


def _title(axis: Axes, point: Point, title: str, subtitle: str = "") -> None:
    """Bold title at `point` (top-left anchored) with an optional grey line below."""
    _text(axis, point, title, size=12, weight="bold", ha="left", va="top")
    if subtitle:
        _text(axis, (point[0], point[1] - 0.3), subtitle, size=8.5, colour=NOTE, ha="left", va="top")


def _frame(axis: Axes, bottom_left: Point, size: tuple[float, float], caption: str) -> None:
    """Dashed rounded frame around a stack of blocks, its `caption` inside the top-left corner."""
    x, y = bottom_left
    width, height = size
    axis.add_patch(FancyBboxPatch(bottom_left, width, height, boxstyle="round,pad=0,rounding_size=0.12",
                                  facecolor="#f7f7f7", edgecolor="#9a9a9a", linewidth=1.1, linestyle="--"))
    _text(axis, (x + 0.12, y + height - 0.08), caption, size=8, family=MONO, weight="bold",
          ha="left", va="top", linespacing=1.3)


def _residual(axis: Axes, start: Point, target: Box, side_x: float) -> None:
    """Skip connection: from the junction `start` sideways to `side_x`, up, into the side of `target`."""
    end = target.left if side_x < target.x else target.right
    _junction(axis, start)
    _arrow(axis, start, (side_x, start[1]), (side_x, end[1]), end)


# --------------------------------------------------------------------------------------------------
# The whole Transformer
# --------------------------------------------------------------------------------------------------

BOX = (2.7, 0.36)
STACK_START = 2.95  # y of the first box inside an N × frame
STACK_STEP = 0.72  # distance between boxes inside a frame


def _embedding_stack(axis: Axes, x: float, side: float, prefix: str, tokens: str) -> Box:
    """Tokens -> embedding × sqrt(d_model) -> + positional encoding; returns the adder.

    `side` is -1 when the PE box sits left of the column, +1 when it sits right.
    """
    _text(axis, (x, 0.4), tokens, size=8)
    embedding = _box(axis, (x, 1.15), BOX, "embedding", f"{prefix}.embedding", "lookup, then × √d_model")
    _arrow(axis, (x, 0.64), embedding.bottom)
    adder = _adder(axis, (x, 1.78))
    _arrow(axis, embedding.top, adder.bottom)
    encoding = _box(axis, (x + side * 0.95, 1.78), (0.9, 0.4), "embedding", "PE", "sin / cos")
    _arrow(axis, encoding.left if side > 0 else encoding.right, adder.right if side > 0 else adder.left)
    _text(axis, (x - side * 0.22, 1.78), f"{prefix}.positional_encoding\nadds PE, then dropout", size=7,
          colour=NOTE, ha="left" if side < 0 else "right")
    return adder


def _stack(axis: Axes, x: float, start: Box, rows: Sequence[tuple[str, str, str]], side: float) -> list[Box]:
    """Boxes stacked upwards from `start`, with a residual around every sublayer (`side`: -1 left, +1 right).

    Every "add_norm" row closes the sublayer just below it: the residual leaves the stream just
    under that sublayer, inside the frame.
    """
    boxes: list[Box] = []
    below = start
    for index, (kind, title, detail) in enumerate(rows):
        box = _box(axis, (x, STACK_START + STACK_STEP * index), BOX, kind, title, detail)
        _arrow(axis, below.top, box.bottom)
        if kind == "add_norm":
            branch = (x, boxes[-1].bottom[1] - 0.18)
            _residual(axis, branch, box, x + side * (BOX[0] / 2 + 0.22))
        boxes.append(box)
        below = box
    return boxes


def _encoder_column(axis: Axes, x: float) -> Box:
    """The encoder side of the overview; returns its last box (the top of the stack)."""
    adder = _embedding_stack(axis, x, -1, "encoder", "enc_in: source token ids\n(batch, src_len)")
    _frame(axis, (x - 1.68, 2.32), (3.36, 3.65), "encoder.layers:\nN × EncoderBlock")
    rows = [
        ("attention", "self_attn", "multi-head, mask = enc_mask"),
        ("add_norm", "norm1", "add residual, then LayerNorm"),
        ("feed_forward", "feed_forward", "position-wise network"),
        ("add_norm", "norm2", "add residual, then LayerNorm"),
    ]
    return _stack(axis, x, adder, rows, side=-1)[-1]


def _decoder_output(axis: Axes, x: float, below: Box) -> None:
    """pred_layer -> softmax -> probabilities, on top of the decoder stack."""
    prediction = _box(axis, (x, 7.95), BOX, "output", "decoder.pred_layer", "Linear d_model → dec_vocab_size")
    _arrow(axis, below.top, prediction.bottom)
    softmax = _box(axis, (x, 8.75), BOX, "output", "softmax", "in the loss / when decoding")
    _arrow(axis, prediction.top, softmax.bottom)
    _text(axis, (x + 0.1, 8.35), "logits (batch, tgt_len, dec_vocab_size)", size=7, colour=NOTE, ha="left")
    _arrow(axis, softmax.top, (x, 9.22))
    _text(axis, (x, 9.35), "next-token probabilities", size=8)


def _decoder_column(axis: Axes, x: float) -> list[Box]:
    """The decoder side of the overview; returns its boxes from the bottom of the stack upwards."""
    tokens = "dec_in: target ids shifted right\n<bos> y₁ y₂ …   (batch, tgt_len)"
    adder = _embedding_stack(axis, x, 1, "decoder", tokens)
    _frame(axis, (x - 1.68, 2.32), (3.36, 5.09), "decoder.layers:\nN × DecoderBlock")
    rows = [
        ("attention", "self_attn", "masked, mask = dec_mask"),
        ("add_norm", "norm1", "add residual, then LayerNorm"),
        ("attention", "cross_attn", "Q: decoder, K and V: enc_out"),
        ("add_norm", "norm2", "add residual, then LayerNorm"),
        ("feed_forward", "feed_forward", "position-wise network"),
        ("add_norm", "norm3", "add residual, then LayerNorm"),
    ]
    boxes = _stack(axis, x, adder, rows, side=1)
    _decoder_output(axis, x, boxes[-1])
    return boxes


def _draw_transformer() -> Figure:
    """Encoder on the left, decoder on the right, enc_out feeding every decoder block's cross_attn."""
    figure, axis = _canvas(9.2, 9.6)
    encoder_top = _encoder_column(axis, 2.15)
    decoder = _decoder_column(axis, 6.85)
    cross = decoder[2]
    gutter = 4.5
    _arrow(axis, encoder_top.top, (encoder_top.x, 6.2), (gutter, 6.2), (gutter, cross.y), cross.left)
    _text(axis, (encoder_top.x + 0.1, 6.28), "enc_out (batch, src_len, d_model),\nused by every DecoderBlock",
          size=7.5, colour=NOTE, ha="left", va="bottom")
    _title(axis, (0.25, 9.45), "Transformer", "encoder–decoder of “Attention Is All You Need” (post-LN)")
    _legend(axis, (0.3, 8.65), ["embedding", "attention", "add_norm", "feed_forward", "output"])
    return figure


# --------------------------------------------------------------------------------------------------
# Encoder block and decoder block
# --------------------------------------------------------------------------------------------------

WIDE = (2.5, 0.5)
NORM = (2.5, 0.38)


def _fork(axis: Axes, box: Box, source: Point, inputs: Sequence[tuple[float, str]]) -> None:
    """One tensor from `source` fanned out to inputs on the bottom edge of `box` at (fraction, letter)."""
    fork_y = box.bottom[1] - 0.22
    xs = [box.along_bottom(fraction)[0] for fraction, _ in inputs]
    _arrow(axis, source, (source[0], fork_y), head=False)
    if len(xs) > 1:
        _arrow(axis, (min(xs), fork_y), (max(xs), fork_y), head=False)
    for (fraction, letter), x in zip(inputs, xs, strict=True):
        _arrow(axis, (x, fork_y), box.along_bottom(fraction))
        _text(axis, (x + 0.1, fork_y + 0.11), letter, size=7.5, colour=NOTE)


def _side_input(axis: Axes, box: Box, side: float, label: str, length: float = 0.45) -> None:
    """An extra argument (a mask) entering `box` from the left (side -1) or the right (side +1)."""
    end = box.right if side > 0 else box.left
    start = (end[0] + side * length, end[1])
    _arrow(axis, start, end)
    _text(axis, (start[0] + side * 0.08, start[1]), label, size=7.5, colour=NOTE,
          ha="left" if side > 0 else "right")


def _sublayer_end(axis: Axes, sublayer: Box, residual: Point, side: float, norm: str) -> Box:
    """An "Add & Norm" box above `sublayer`, as the paper's Figure 1 draws it: the sublayer's output and the
    residual (from `residual`) go in, and the LayerNorm it holds is `norm`. Where dropout goes is said in words
    (the paper's section 5.4), not drawn. Returns the box."""
    x = sublayer.x
    add_norm = _box(axis, (x, sublayer.y + 0.66), NORM, "add_norm", f"Add & Norm ({norm})", "LayerNorm(d_model)")
    _arrow(axis, sublayer.top, add_norm.bottom)
    _residual(axis, residual, add_norm, x + side * (WIDE[0] / 2 + 0.3))
    return add_norm


def _between(lower: Box, upper_y: float) -> float:
    """Height halfway between the top of `lower` and `upper_y`."""
    return (lower.top[1] + upper_y) / 2


def _draw_encoder_block() -> Figure:
    """x -> self_attn -> Add & Norm (norm1) -> feed_forward -> Add & Norm (norm2), as in the paper's Figure 1."""
    figure, axis = _canvas(7.4, 5.4)
    x = 2.5
    _text(axis, (x, 0.3), "x  (batch, src_len, d_model)", size=8.5)
    attention = _box(axis, (x, 1.3), WIDE, "attention", "self_attn", "MultiHeadAttention(d_model, num_heads)")
    _fork(axis, attention, (x, 0.45), [(0.25, "Q"), (0.5, "K"), (0.75, "V")])
    _side_input(axis, attention, 1, "mask (batch, 1, 1, src_len)\nTrue = may attend")
    norm1 = _sublayer_end(axis, attention, (x, 0.68), -1, "norm1")
    forward = _box(axis, (x, norm1.y + 0.95), WIDE, "feed_forward", "feed_forward", "position-wise network")
    _arrow(axis, norm1.top, forward.bottom)
    norm2 = _sublayer_end(axis, forward, (x, _between(norm1, forward.bottom[1])), -1, "norm2")
    _arrow(axis, norm2.top, (x, norm2.top[1] + 0.45))
    _text(axis, (x, norm2.top[1] + 0.6), "output (batch, src_len, d_model) → next EncoderBlock", size=8.5)
    _title(axis, (0.25, 5.25), "EncoderBlock", "one encoder layer, drawn as the paper's Figure 1 draws it")
    _legend(axis, (4.3, 3.3), ["attention", "add_norm", "feed_forward"])
    return figure


def _encoder_output_inputs(axis: Axes, cross: Box, norm1: Box) -> None:
    """enc_out arriving from the left as K and V of `cross`; Q comes straight up from `norm1`."""
    line_y = cross.bottom[1] - 0.24
    key, value = cross.along_bottom(0.14), cross.along_bottom(0.3)
    start = (cross.left[0] - 0.55, line_y)
    _arrow(axis, start, (value[0], line_y), value)
    _junction(axis, (key[0], line_y))
    _arrow(axis, (key[0], line_y), key)
    _text(axis, (key[0] + 0.09, line_y + 0.12), "K", size=7.5, colour=NOTE)
    _text(axis, (value[0] + 0.09, line_y + 0.12), "V", size=7.5, colour=NOTE)
    _text(axis, (start[0] - 0.08, line_y), "enc_out from the encoder\n(batch, src_len, d_model)",
          size=7.5, colour=NOTE, ha="right")
    _arrow(axis, norm1.top, cross.bottom)
    _text(axis, (cross.x + 0.1, cross.bottom[1] - 0.11), "Q", size=7.5, colour=NOTE)


def _draw_decoder_block() -> Figure:
    """Masked self_attn -> Add & Norm (norm1) -> cross_attn over enc_out -> Add & Norm (norm2) -> feed_forward ->
    Add & Norm (norm3), as in the paper's Figure 1."""
    figure, axis = _canvas(7.6, 6.9)
    x = 3.45
    _text(axis, (x, 0.3), "x  (batch, tgt_len, d_model)", size=8.5)
    attention = _box(axis, (x, 1.3), WIDE, "attention", "self_attn", "masked: no peeking at later tokens")
    _fork(axis, attention, (x, 0.45), [(0.25, "Q"), (0.5, "K"), (0.75, "V")])
    _side_input(axis, attention, -1, "dec_mask\n(batch, 1, tgt_len, tgt_len)\nlook-ahead and padding")
    norm1 = _sublayer_end(axis, attention, (x, 0.68), 1, "norm1")
    cross = _box(axis, (x, norm1.y + 1.05), WIDE, "attention", "cross_attn", "queries look at the source")
    _encoder_output_inputs(axis, cross, norm1)
    _side_input(axis, cross, -1, "enc_mask\n(batch, 1, 1, src_len)")
    norm2 = _sublayer_end(axis, cross, (x, _between(norm1, cross.bottom[1] - 0.24)), 1, "norm2")
    forward = _box(axis, (x, norm2.y + 0.95), WIDE, "feed_forward", "feed_forward", "position-wise network")
    _arrow(axis, norm2.top, forward.bottom)
    norm3 = _sublayer_end(axis, forward, (x, _between(norm2, forward.bottom[1])), 1, "norm3")
    _arrow(axis, norm3.top, (x, norm3.top[1] + 0.45))
    _text(axis, (x, norm3.top[1] + 0.6), "output (batch, tgt_len, d_model) → next DecoderBlock", size=8.5)
    _title(axis, (0.25, 6.75), "DecoderBlock", "one decoder layer, drawn as the paper's Figure 1 draws it")
    _legend(axis, (5.3, 1.5), ["attention", "add_norm", "feed_forward"], size=7.5)
    return figure


# --------------------------------------------------------------------------------------------------
# Splitting into heads and combining them
# --------------------------------------------------------------------------------------------------

SEQ_LEN, D_MODEL, NUM_HEADS = 4, 8, 4
D_K = D_MODEL // NUM_HEADS
CELL = 0.15  # side of one number's square, inches
HEAD_GAP = 0.07  # space between heads once a row is cut into num_heads pieces
DECK_SHIFT = (0.13, 0.11)  # offset between the stacked per-head matrices
TOP, BOTTOM = 4.6, 1.85  # centre heights of the two rows
COLUMNS = (0.95, 3.35, 5.8, 8.1)  # centre x of the four tensors in each row


def _head_colours() -> list[str]:
    """Colour of every feature column of a (seq_len, d_model) matrix: the head it belongs to."""
    return [HEAD_COLOURS[column // D_K] for column in range(D_MODEL)]


def _cells(axis: Axes, corner: Point, colours: Sequence[str], gap_every: int = 0) -> None:
    """SEQ_LEN rows of squares from the bottom-left `corner`, one colour per column."""
    for column, colour in enumerate(colours):
        gap = HEAD_GAP * (column // gap_every) if gap_every else 0.0
        for row in range(SEQ_LEN):
            origin = (corner[0] + column * CELL + gap, corner[1] + row * CELL)
            axis.add_patch(Rectangle(origin, CELL, CELL, facecolor=colour, edgecolor="white", linewidth=0.8))


def _matrix(axis: Axes, centre: Point, colours: Sequence[str], gap_every: int = 0) -> Box:
    """A (seq_len, features) matrix of coloured squares centred on `centre`; returns its outline."""
    gaps = (len(colours) // gap_every - 1) * HEAD_GAP if gap_every else 0.0
    box = Box(centre[0], centre[1], len(colours) * CELL + gaps, SEQ_LEN * CELL)
    _cells(axis, (box.left[0], box.bottom[1]), colours, gap_every)
    return box


def _deck(axis: Axes, centre: Point) -> Box:
    """NUM_HEADS matrices of shape (seq_len, d_k), head 0 in front, the others stacked behind it."""
    width = D_K * CELL + (NUM_HEADS - 1) * DECK_SHIFT[0]
    height = SEQ_LEN * CELL + (NUM_HEADS - 1) * DECK_SHIFT[1]
    box = Box(centre[0], centre[1], width, height)
    for head in reversed(range(NUM_HEADS)):
        corner = (box.left[0] + head * DECK_SHIFT[0], box.bottom[1] + head * DECK_SHIFT[1])
        axis.add_patch(Rectangle(corner, D_K * CELL, SEQ_LEN * CELL, facecolor="none", edgecolor=INK,
                                 linewidth=0.8, zorder=2 + 2 * (NUM_HEADS - head)))
        _cells(axis, corner, [HEAD_COLOURS[head]] * D_K)
    _text(axis, (box.right[0] + 0.08, box.top[1] - 0.05), "head 3", size=6.5, colour=NOTE, ha="left")
    _text(axis, (box.left[0] - 0.06, box.bottom[1] + 0.06), "head 0", size=6.5, colour=NOTE, ha="right")
    return box


def _caption(axis: Axes, box: Box, name: str, shape: str, above: bool) -> None:
    """Name and shape of a tensor, under it (`above` False) or over it."""
    direction = 1 if above else -1
    edge = box.top[1] if above else box.bottom[1]
    lines = [name, shape] if not above else [shape, name]
    _text(axis, (box.x, edge + direction * 0.2), lines[0], size=8, weight="bold" if not above else "normal",
          family="DejaVu Sans" if not above else MONO)
    _text(axis, (box.x, edge + direction * 0.42), lines[1], size=8 if above else 7.5,
          family=MONO if not above else "DejaVu Sans", weight="bold" if above else "normal")


def _step(axis: Axes, start: Box, end: Box, label: str, above: bool) -> float:
    """Horizontal arrow between two tensors with the operation written over (or under) it; returns its x."""
    leftwards = end.x < start.x
    begin = (start.left[0] - 0.12, start.y) if leftwards else (start.right[0] + 0.12, start.y)
    finish = (end.right[0] + 0.12, end.y) if leftwards else (end.left[0] - 0.12, end.y)
    _arrow(axis, begin, finish)
    middle = (begin[0] + finish[0]) / 2
    offset = 0.62 if above else -0.62
    _text(axis, (middle, start.y + offset), label, size=7.5, family=MONO, va="bottom" if above else "top")
    return middle


def _bracket(axis: Axes, left: float, right: float, y: float, label: str, above: bool) -> None:
    """A square bracket from `left` to `right` at height `y` naming the steps it spans."""
    tip = -0.08 if above else 0.08
    axis.plot([left, left, right, right], [y + tip, y, y, y + tip], color=INK, linewidth=1)
    _text(axis, ((left + right) / 2, y - tip * 1.6), label, size=9, family=MONO, weight="bold",
          va="bottom" if above else "top")


def _split_row(axis: Axes) -> Box:
    """Top row: x -> Q = W_q(x) -> split_heads -> one matrix per head; returns the per-head deck. The arrow says
    what split_heads must give (the contract, by colour), not how."""
    tensor = _matrix(axis, (COLUMNS[0], TOP), ["#e6e6e6"] * D_MODEL)
    query = _matrix(axis, (COLUMNS[1], TOP), _head_colours())
    deck = _deck(axis, (COLUMNS[3], TOP))
    _text(axis, (query.left[0] + D_K * CELL / 2, query.top[1] + 0.1), "d_k", size=7, colour=NOTE)
    _text(axis, (tensor.x, tensor.top[1] + 0.1), "d_model", size=7, colour=NOTE)
    _text(axis, (tensor.left[0] - 0.1, tensor.y), "seq_len", size=7, colour=NOTE, rotation=90)
    _caption(axis, tensor, "x", "(batch, seq_len, d_model)", above=False)
    _caption(axis, query, "Q = W_q(x)", "(batch, seq_len, d_model)", above=False)
    _caption(axis, deck, "one matrix per head", "(batch, num_heads, seq_len, d_k)", above=False)
    _step(axis, tensor, query, "W_q\n(K: W_k, V: W_v)", above=True)
    middle = _step(axis, query, deck, "split_heads", above=True)
    _text(axis, (middle, TOP - 0.55), "head h gets features h·d_k … (h+1)·d_k − 1\nof every token, "
          "each token in its own row", size=7.5, colour=NOTE, va="top")
    return deck


def _combine_row(axis: Axes) -> Box:
    """Bottom row, right to left: per-head outputs -> combine_heads -> heads side by side -> W_o; returns the
    per-head deck."""
    deck = _deck(axis, (COLUMNS[3], BOTTOM))
    joined = _matrix(axis, (COLUMNS[1], BOTTOM), _head_colours())
    output = _matrix(axis, (COLUMNS[0], BOTTOM), ["#b9b9b9"] * D_MODEL)
    _caption(axis, deck, "attention output per head", "(batch, num_heads, seq_len, d_k)", above=True)
    _caption(axis, joined, "heads concatenated", "(batch, seq_len, d_model)", above=True)
    _caption(axis, output, "W_o mixes the heads", "(batch, seq_len, d_model)", above=True)
    middle = _step(axis, deck, joined, "combine_heads", above=False)
    _text(axis, (middle, BOTTOM - 0.95), "the exact inverse of split_heads: head h's output for\ntoken t "
          "goes back to features h·d_k … (h+1)·d_k − 1 of token t", size=7.5, colour=NOTE, va="top")
    _step(axis, joined, output, "W_o", above=False)
    return deck


def _pitfall(axis: Axes, corner: Point) -> None:
    """The classic trap, written under the combine row, without the code that avoids it."""
    _text(axis, corner, "Pitfall: a tensor of the right shape can still hold the wrong numbers. Check the colours: "
          "head h of token t\nmust hold features h·d_k … (h+1)·d_k − 1 of token t, and combine_heads(split_heads(x)) "
          "must give x back.", size=7.5, colour="#a8321e", ha="left", va="top", linespacing=1.4)


def _draw_head_splitting() -> Figure:
    """(batch, seq_len, d_model) -> split_heads -> attention per head -> combine_heads -> W_o."""
    figure, axis = _canvas(10, 6.9)
    top = _split_row(axis)
    bottom = _combine_row(axis)
    turn = 9.4
    _arrow(axis, (top.right[0] + 0.15, top.y), (turn, top.y), (turn, bottom.y), (bottom.right[0] + 0.15, bottom.y))
    _text(axis, (turn - 0.12, (TOP + BOTTOM) / 2 - 0.05), "scaled dot-product attention, each head alone:\n"
          "softmax(Q_h K_hᵀ / √d_k) V_h", size=8, ha="right", colour=COLOURS["attention"][1], weight="bold")
    _pitfall(axis, (0.25, 0.4))
    _title(axis, (0.25, 6.75), "Splitting d_model into heads, and joining them back",
           f"example sizes: seq_len = {SEQ_LEN}, d_model = {D_MODEL}, num_heads = {NUM_HEADS}, "
           f"d_k = d_model / num_heads = {D_K}; one batch element shown; colour = head")
    return figure


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------

_DRAWERS: dict[str, Callable[[], Figure]] = {
    "transformer": _draw_transformer,
    "encoder_block": _draw_encoder_block,
    "decoder_block": _draw_decoder_block,
    "head_splitting": _draw_head_splitting,
}


def draw(name: str) -> Figure:
    """Draw the diagram `name` (one of NAMES) and return its Figure."""
    if name not in _DRAWERS:
        raise ValueError(f"unknown diagram {name!r}; choose one of {NAMES}")
    with plt.style.context("default"), plt.rc_context(STYLE):
        return _DRAWERS[name]()


@not_drawn_while_grading
def show(name: str) -> None:
    """Draw the diagram `name` and display it."""
    draw(name)
    plt.show()


def save_all(folder: Path) -> list[Path]:
    """Write `<name>.svg` for every diagram into `folder`; the same bytes on every run."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in NAMES:
        figure = draw(name)
        path = folder / f"{name}.svg"
        with plt.rc_context(SVG_SETTINGS):
            figure.savefig(path, format="svg", metadata={"Date": None})
        plt.close(figure)
        written.append(path)
    return written


def main(arguments: Sequence[str] | None = None) -> None:
    """Command line: `python -m transformer_course.visualisation.diagrams FOLDER` (default assets/diagrams)."""
    arguments = sys.argv[1:] if arguments is None else list(arguments)
    folder = Path(arguments[0]) if arguments else Path("assets/diagrams")
    for path in save_all(folder):
        print(f"wrote {path}")


if __name__ == "__main__":
    matplotlib.use("Agg")
    main()
