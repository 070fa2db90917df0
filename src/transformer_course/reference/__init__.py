"""Reference solutions: the one source of the code students write.

Each file is plain, importable Python. The `### BEGIN SOLUTION` / `### END SOLUTION`
comments mark what nbgrader replaces with a stub in the student notebooks; the
lesson sources in `lessons/` splice these definitions into the notebooks.
"""

from transformer_course.reference.attention import (
    MultiHeadAttention,
    make_look_ahead_mask,
    make_padding_mask,
    scaled_dot_product_attention,
)
from transformer_course.reference.blocks import (
    DecoderBlock,
    EncoderBlock,
    PositionWiseFeedForward,
    PreLNEncoderBlock,
)
from transformer_course.reference.model import (
    Decoder,
    Encoder,
    Transformer,
    count_parameters,
    make_source_mask,
    make_target_mask,
)
from transformer_course.reference.positional_encoding import PositionalEncoding

__all__ = [
    "Decoder",
    "DecoderBlock",
    "Encoder",
    "EncoderBlock",
    "MultiHeadAttention",
    "PositionWiseFeedForward",
    "PositionalEncoding",
    "PreLNEncoderBlock",
    "Transformer",
    "count_parameters",
    "make_look_ahead_mask",
    "make_padding_mask",
    "make_source_mask",
    "make_target_mask",
    "scaled_dot_product_attention",
]
