"""Save and load a trained translation model with its configuration and vocabularies.

The weights are stored in float16 (half the size) and load into any `Transformer` class with the
course's parameter names, the student's own included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_course.data.vocab import Vocab
from transformer_course.reference.model import Transformer

CONFIG_KEYS = ("d_model", "num_heads", "num_layers", "d_ff", "max_seq_length", "dropout")


def save(path: str | Path, model: nn.Module, config: dict[str, Any], source_vocab: Vocab, target_vocab: Vocab,
         metadata: dict[str, Any] | None = None) -> None:
    state = {name: tensor.detach().to("cpu", torch.float16) if tensor.is_floating_point() else tensor.cpu()
             for name, tensor in model.state_dict().items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(path).with_suffix(".part")
    torch.save({"config": {key: config[key] for key in CONFIG_KEYS}, "state_dict": state,
                "source_vocab": source_vocab.itos, "target_vocab": target_vocab.itos,
                "metadata": metadata or {}}, temporary)
    temporary.replace(path)


def load(path: str | Path, model_class: type[nn.Module] = Transformer, device: torch.device | str = "cpu",
         ) -> tuple[nn.Module, Vocab, Vocab, dict[str, Any]]:
    """(model in eval mode, source vocab, target vocab, metadata); model_class may be the student's Transformer."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    source_vocab, target_vocab = Vocab(saved["source_vocab"]), Vocab(saved["target_vocab"])
    model = model_class(len(source_vocab), len(target_vocab), **saved["config"])
    model.load_state_dict({name: tensor.float() if tensor.is_floating_point() else tensor
                           for name, tensor in saved["state_dict"].items()})
    return model.to(device).eval(), source_vocab, target_vocab, saved["metadata"]
