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
    "tensor": ("#ffffff", "#666666"),
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


def _code(axis: Axes, corner: Point, lines: Sequence[str], size: float = 8) -> None:
    """Lines of Python in monospace, top-left anchored at `corner`."""
    _text(axis, corner, "\n".join(lines), size=size, family=MONO, ha="left", va="top", linespacing=1.5)


def _frame(axis: Axes, bottom_left: Point, size: tuple[float, float], caption: str) -> None:
    """Dashed rounded frame around a stack of blocks, its `caption` inside the top-left corner."""
    x, y = bottom_left
    width, height = size
    axis.add_patch(FancyBboxPatch(bottom_left, width, height, boxstyle="round,pad=0,rounding_size=0.12",
                                  facecolor="#f7f7f7", edgecolor="#9a9a9a", linewidth=1.1, linestyle="--"))
    _text(axis, (x + 0.12, y + height - 0.1), caption, size=8.5, family=MONO, weight="bold",
          ha="left", va="top")


def _residual(axis: Axes, start: Point, target: Box, side_x: float) -> None:
    """Skip connection: from the junction `start` sideways to `side_x`, up, into the side of `target`."""
    end = target.left if side_x < target.x else target.right
    _junction(axis, start)
    _arrow(axis, start, (side_x, start[1]), (side_x, end[1]), end)


# --------------------------------------------------------------------------------------------------
# The whole Transformer
# --------------------------------------------------------------------------------------------------

BOX = (2.7, 0.36)


def _embedding_stack(axis: Axes, x: float, side: float, prefix: str, tokens: str) -> Box:
    """Tokens -> embedding x sqrt(d_model) -> + positional encoding; returns the adder."""
    _text(axis, (x, 0.4), tokens, size=8)
    embedding = _box(axis, (x, 1.15), BOX, "embedding", f"{prefix}.embedding", "lookup  × √d_model")
    _arrow(axis, (x, 0.62), embedding.bottom)
    adder = _adder(axis, (x, 1.75))
    _arrow(axis, embedding.top, adder.bottom)
    encoding = _box(axis, (x + side * 2.05, 1.75), (1.1, 0.42), "embedding", "PE", "sin / cos table")
    _arrow(axis, encoding.left if side > 0 else encoding.right, adder.right if side > 0 else adder.left)
    _text(axis, (x + side * 1.15, 2.0), f"{prefix}.positional_encoding\n(adds PE, then dropout)",
          size=7, colour=NOTE)
    return adder


def _stack(axis: Axes, x: float, start: Box, rows: Sequence[tuple[str, str, str]], side: float) -> list[Box]:
    """Boxes stacked upwards from `start`, 0.75 in apart, with a residual around every sublayer."""
    boxes: list[Box] = []
    below = start
    for index, (kind, title, detail) in enumerate(rows):
        box = _box(axis, (x, 2.95 + 0.72 * index), BOX, kind, title, detail)
        _arrow(axis, below.top, box.bottom)
        if kind == "add_norm":
            branch = (x, (boxes[-2].top[1] + boxes[-1].bottom[1]) / 2 if len(boxes) > 1 else 2.45)
            _residual(axis, branch, box, x + side * (BOX[0] / 2 + 0.25))
        boxes.append(box)
        below = box
    return boxes


def _encoder_column(axis: Axes, x: float) -> Box:
    """The encoder side of the overview; returns its last box (the top of the stack)."""
    adder = _embedding_stack(axis, x, -1, "encoder", "enc_in: source token ids\n(batch, src_len)")
    _frame(axis, (x - 1.75, 2.3), (3.5, 3.55), "encoder.layers: N × EncoderBlock")
    rows = [
        ("attention", "self_attn", "multi-head, mask = enc_mask"),
        ("add_norm", "norm1", "add residual, then LayerNorm"),
        ("feed_forward", "feed_forward", "fc1 → ReLU → fc2"),
        ("add_norm", "norm2", "add residual, then LayerNorm"),
    ]
    return _stack(axis, x, adder, rows, side=-1)[-1]


def _decoder_column(axis: Axes, x: float) -> list[Box]:
    """The decoder side of the overview; returns its boxes from the bottom of the stack upwards."""
    adder = _embedding_stack(axis, x, 1, "decoder", "dec_in: target ids shifted right\n<sos> y₁ y₂ …  (batch, tgt_len)")
    _frame(axis, (x - 1.75, 2.3), (3.5, 4.99), "decoder.layers: N × DecoderBlock")
    rows = [
        ("attention", "self_attn", "masked, mask = dec_mask"),
        ("add_norm", "norm1", "add residual, then LayerNorm"),
        ("attention", "cross_attn", "Q from decoder, K, V = enc_out"),
        ("add_norm", "norm2", "add residual, then LayerNorm"),
        ("feed_forward", "feed_forward", "fc1 → ReLU → fc2"),
        ("add_norm", "norm3", "add residual, then LayerNorm"),
    ]
    boxes = _stack(axis, x, adder, rows, side=1)
    prediction = _box(axis, (x, 7.85), BOX, "output", "decoder.pred_layer", "Linear d_model → dec_vocab_size")
    _arrow(axis, boxes[-1].top, prediction.bottom)
    softmax = _box(axis, (x, 8.75), BOX, "output", "softmax", "in the loss / when decoding")
    _arrow(axis, prediction.top, softmax.bottom)
    _text(axis, (x + 0.1, 8.3), "logits (batch, tgt_len, dec_vocab_size)", size=7, colour=NOTE, ha="left")
    _arrow(axis, softmax.top, (x, 9.3))
    _text(axis, (x, 9.45), "next-token probabilities", size=8)
    return boxes


def _draw_transformer() -> Figure:
    """Encoder on the left, decoder on the right, enc_out feeding every decoder block's cross_attn."""
    figure, axis = _canvas(9.4, 9.7)
    encoder_top = _encoder_column(axis, 2.15)
    decoder = _decoder_column(axis, 7.05)
    cross = decoder[2]
    gutter = 4.65
    _arrow(axis, encoder_top.top, (encoder_top.x, 6.2), (gutter, 6.2), (gutter, cross.y), cross.left)
    _text(axis, (3.3, 6.38), "enc_out (batch, src_len, d_model)", size=7.5, colour=NOTE)
    _title(axis, (0.25, 9.5), "Transformer", "encoder–decoder of “Attention Is All You Need” (post-LN)")
    _legend(axis, (0.3, 8.6), ["embedding", "attention", "add_norm", "feed_forward", "output"])
    return figure


# --------------------------------------------------------------------------------------------------
# Encoder block and decoder block
# --------------------------------------------------------------------------------------------------

WIDE = (2.5, 0.5)
NORM = (2.5, 0.38)
PILL = (1.2, 0.28)


def _attention_inputs(axis: Axes, box: Box, source: Point, letters: str = "QKV") -> None:
    """One tensor fanned out to the query, key and value inputs on the bottom edge of `box`."""
    fractions = (0.25, 0.5, 0.75)
    fork_y = box.bottom[1] - 0.25
    _arrow(axis, source, (box.x, fork_y), head=False)
    left, right = box.along_bottom(fractions[0])[0], box.along_bottom(fractions[-1])[0]
    _arrow(axis, (left, fork_y), (right, fork_y), head=False)
    for fraction, letter in zip(fractions, letters, strict=True):
        end = box.along_bottom(fraction)
        _arrow(axis, (end[0], fork_y), end)
        _text(axis, (end[0] + 0.1, fork_y + 0.12), letter, size=7.5, colour=NOTE)


def _side_input(axis: Axes, box: Box, side: float, label: str) -> None:
    """A mask (or other extra argument) entering `box` from the left (side -1) or right (+1)."""
    end = box.right if side > 0 else box.left
    start = (end[0] + side * 0.45, end[1])
    _arrow(axis, start, end)
    _text(axis, (start[0] + side * 0.08, start[1]), label, size=7.5, colour=NOTE,
          ha="left" if side > 0 else "right")


def _sublayer_end(axis: Axes, x: float, below: Box, y: float, residual: Point, side: float,
                  norm: str) -> Box:
    """dropout -> add the residual -> LayerNorm, stacked upwards from `below`; returns the norm box."""
    dropout = _box(axis, (x, y), PILL, "dropout", "dropout")
    _arrow(axis, below.top, dropout.bottom)
    adder = _adder(axis, (x, y + 0.55))
    _arrow(axis, dropout.top, adder.bottom)
    _residual(axis, residual, adder, x + side * (WIDE[0] / 2 + 0.3))
    normalise = _box(axis, (x, y + 1.15), NORM, "add_norm", norm, "LayerNorm(d_model)")
    _arrow(axis, adder.top, normalise.bottom)
    return normalise


def _draw_encoder_block() -> Figure:
    """x -> self_attn -> dropout -> + x -> norm1 -> feed_forward -> dropout -> + -> norm2 (post-LN)."""
    figure, axis = _canvas(7.4, 8.6)
    x = 2.5
    _text(axis, (x, 0.3), "x  (batch, src_len, d_model)", size=8.5)
    attention = _box(axis, (x, 1.3), WIDE, "attention", "self_attn", "MultiHeadAttention(d_model, num_heads)")
    _attention_inputs(axis, attention, (x, 0.45))
    _junction(axis, (x, 0.72))
    _side_input(axis, attention, 1, "mask (batch, 1, 1, src_len)\nTrue = may attend")
    norm1 = _sublayer_end(axis, x, attention, 2.0, (x, 0.72), -1, "norm1")
    forward = _box(axis, (x, 4.25), WIDE, "feed_forward", "feed_forward", "fc1 → ReLU → fc2 (d_ff hidden)")
    _arrow(axis, norm1.top, forward.bottom)
    norm2 = _sublayer_end(axis, x, forward, 4.95, (x, 3.78), -1, "norm2")
    _junction(axis, (x, 3.78))
    _arrow(axis, norm2.top, (x, 6.9))
    _text(axis, (x, 7.05), "output (batch, src_len, d_model) → next EncoderBlock", size=8.5)
    _title(axis, (0.25, 8.4), "EncoderBlock", "post-LN: each sublayer is wrapped as LayerNorm(x + Dropout(sublayer(x)))")
    _code(axis, (4.1, 5.6), ["x = norm1(x + dropout(", "      self_attn(x, x, x, mask)))", "x = norm2(x + dropout(",
                             "      feed_forward(x)))"])
    _legend(axis, (4.3, 3.6), ["attention", "dropout", "add_norm", "feed_forward"])
    return figure


def _draw_decoder_block() -> Figure:
    """Masked self_attn -> add & norm1 -> cross_attn over enc_out -> add & norm2 -> feed_forward -> add & norm3."""
    figure, axis = _canvas(7.4, 9.6)
    return figure


# --------------------------------------------------------------------------------------------------
# Splitting into heads and combining them
# --------------------------------------------------------------------------------------------------


def _draw_head_splitting() -> Figure:
    """(batch, seq_len, d_model) -> view -> transpose -> attention per head -> combine_heads -> W_o."""
    figure, axis = _canvas(10, 6.2)
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
