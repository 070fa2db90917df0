"""Word tokenisers from spaCy's blank pipelines (rules only: no model download), lowercased."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

import spacy


@cache
def _blank(language: str) -> spacy.language.Language:
    return spacy.blank(language)


class Tokenizer:
    """Tokenizer("de")("Ein Hund läuft.") -> ['ein', 'hund', 'läuft', '.']"""

    def __init__(self, language: str, lowercase: bool = True) -> None:
        self.language = language
        self.lowercase = lowercase
        self._tokenizer = _blank(language).tokenizer

    def __call__(self, text: str) -> list[str]:
        text = text.strip().lower() if self.lowercase else text.strip()
        return [token.text for token in self._tokenizer(text) if not token.is_space]

    def many(self, texts: Iterable[str]) -> list[list[str]]:
        """Tokenise a corpus quickly (spaCy's batched pipe)."""
        prepared = (text.strip().lower() if self.lowercase else text.strip() for text in texts)
        return [[token.text for token in doc if not token.is_space] for doc in self._tokenizer.pipe(prepared)]
