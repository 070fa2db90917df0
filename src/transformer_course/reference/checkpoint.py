"""Save and load a trained translation model with its configuration and vocabularies.

The weights are stored in float16 (half the size) and load into any `Transformer` class with the
course's parameter names, the student's own included.
"""

from __future__ import annotations

import json
import os
import urllib.error
from importlib import metadata as package_metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_course import __version__
from transformer_course.data.download import download_atomically, sha256_of
from transformer_course.data.vocab import Vocab
from transformer_course.reference.model import Transformer

PRETRAINED_NAME = "transformer_de_en.pt"
# sha256 of assets/checkpoint/transformer_de_en.pt; tests/test_checkpoint.py keeps it equal to the committed file.
PRETRAINED_SHA256 = "76319fa515633d3625cf76b20f93073554255bc8d6613735a9748a938f8e8ece"
ENVIRONMENT_VARIABLE = "TRANSFORMER_COURSE_CHECKPOINT"


class CheckpointUnavailable(RuntimeError):
    """The pretrained checkpoint is neither on disk nor downloadable; the message says what to do."""


def _repository_url() -> str:
    try:
        for entry in package_metadata.metadata("transformer-course").get_all("Project-URL") or []:
            label, _, url = entry.partition(", ")
            if label.lower() == "repository":
                return url.strip()
    except package_metadata.PackageNotFoundError:
        pass
    raise CheckpointUnavailable("the course package is not installed, so the repository address is unknown")


def release_tag() -> str:
    """The git tag of this package's release ('v' + its version): downloads come from it, never from main."""
    return f"v{__version__}"


def pretrained_url() -> str:
    """Where the checkpoint of this release is downloaded from (the tagged file on GitHub)."""
    raw = _repository_url().replace("https://github.com/", "https://raw.githubusercontent.com/")
    return f"{raw}/{release_tag()}/assets/checkpoint/{PRETRAINED_NAME}"


def pretrained_path(timeout: float = 60.0) -> Path:
    """Where the pretrained checkpoint is: $TRANSFORMER_COURSE_CHECKPOINT, else assets/checkpoint/ of a
    course checkout at or above the working directory or holding this (editable) package, else the user
    cache (downloaded there once from this release's tag in the repository, verified by sha256, written
    atomically)."""
    if os.environ.get(ENVIRONMENT_VARIABLE):
        path = Path(os.environ[ENVIRONMENT_VARIABLE])
        if not path.exists():
            raise CheckpointUnavailable(f"{ENVIRONMENT_VARIABLE} names {path}, which does not exist")
        return path
    package_checkout = Path(__file__).resolve().parents[3]  # src/transformer_course/reference -> checkout
    for folder in [Path.cwd(), *Path.cwd().parents, package_checkout]:  # nbgrader runs in a class folder
        candidate = folder / "assets" / "checkpoint" / PRETRAINED_NAME
        if candidate.exists():
            return candidate
    cached = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transformer_course" / PRETRAINED_NAME
    if cached.exists() and (not PRETRAINED_SHA256 or sha256_of(cached) == PRETRAINED_SHA256):
        return cached
    url = pretrained_url()

    def verify(path: Path) -> None:
        if PRETRAINED_SHA256 and sha256_of(path) != PRETRAINED_SHA256:
            raise CheckpointUnavailable(f"the download of {url} is corrupt (sha256 mismatch); run again")

    try:
        download_atomically(url, cached, verify, timeout)
    except (urllib.error.URLError, OSError, TimeoutError) as error:
        raise CheckpointUnavailable(
            f"Could not download the pretrained checkpoint from {url} ({error}). Connect to the internet, or "
            f"download that file yourself and set {ENVIRONMENT_VARIABLE}=/path/to/{PRETRAINED_NAME}."
        ) from error
    return cached

CONFIG_KEYS = ("d_model", "num_heads", "num_layers", "d_ff", "max_seq_length", "dropout")


def save(path: str | Path, model: nn.Module, config: dict[str, Any], source_vocab: Vocab, target_vocab: Vocab,
         metadata: dict[str, Any] | None = None) -> None:
    state = {name: tensor.detach().to("cpu", torch.float16) if tensor.is_floating_point() else tensor.cpu()
             for name, tensor in model.state_dict().items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(path).with_suffix(".part")
    torch.save({"config": {key: config[key] for key in CONFIG_KEYS}, "state_dict": state,
                "source_vocab": source_vocab.itos, "target_vocab": target_vocab.itos,
                "metadata": json.loads(json.dumps(metadata or {}, default=str))}, temporary)  # plain types only
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


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Only the metadata of a checkpoint (its scores, how it was trained)."""
    return torch.load(path, map_location="cpu", weights_only=True)["metadata"]


def select(which: str, folder: str | Path | None) -> tuple[Path, str]:
    """(checkpoint path, a line saying what was chosen) for notebook 6's choice of model.

    which = "shipped": the course's pretrained checkpoint (`pretrained_path()`); which = "mine": the
    checkpoint notebook 5 saved as `folder/transformer_de_en.pt`, or, when there is none, the shipped
    one with a line that says so (a notebook run from the top still reaches its end)."""
    if which not in ("shipped", "mine"):
        raise ValueError(f'choose "shipped" or "mine", not {which!r}')
    if which == "mine":
        candidate = Path(folder or ".") / PRETRAINED_NAME
        if candidate.exists():
            return candidate, f"your checkpoint from notebook 5: {candidate}"
        return pretrained_path(), (f"no checkpoint of yours at {candidate} (run notebook 5 to the end with the "
                                   "same USE_GOOGLE_DRIVE setting): using the shipped one instead")
    return pretrained_path(), "the course's pretrained checkpoint"
