"""Real English text for simulated keyboards: the quotations Debian's fortune packages ship.

``fortunes-min`` and ``fortunes`` (``apt-get install fortunes``; ``scripts/install_text_corpus.sh``
does it idempotently, and CI runs it) install plain-text files under
``/usr/share/games/fortunes``, one quotation after another, separated by lines holding ``%``.
Nothing is downloaded at run time: when the files are absent, :func:`load_sentences` raises
:class:`CorpusUnavailable` naming the package to install.

Quotations are cut into sentences (at ``.``, ``!``, ``?`` and line breaks between paragraphs);
attribution lines (``-- Author``) are dropped. :func:`assign_sentences` deals the sentences out to
simulated devices as what their users typed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from privacy.ngrams import tokenize

__all__ = [
    "FORTUNE_DIR",
    "CorpusUnavailable",
    "fortune_files",
    "load_sentences",
    "assign_sentences",
]

FORTUNE_DIR = Path(os.environ.get("ESA_FORTUNE_DIR", "/usr/share/games/fortunes"))
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_ATTRIBUTION = re.compile(r"^\s*(--|-- |\u2014)")


class CorpusUnavailable(Exception):
    """The text corpus is not installed on this machine."""


def fortune_files(directory: Path = FORTUNE_DIR) -> list[Path]:
    """The quotation files (not the ``.dat`` indexes, ``.u8`` links or the offensive ones)."""
    if not directory.is_dir():
        raise CorpusUnavailable(
            f"{directory} does not exist: install Debian's fortunes package "
            "(scripts/install_text_corpus.sh)"
        )
    files = sorted(
        path
        for path in directory.iterdir()
        if path.is_file() and not path.suffix and not path.is_symlink()
    )
    if not files:
        raise CorpusUnavailable(f"{directory} holds no fortune files")
    return files


def _sentences_of(quotation: str) -> list[str]:
    lines = [line for line in quotation.splitlines() if not _ATTRIBUTION.match(line)]
    text = "\n".join(lines)
    return [" ".join(part.split()) for part in _SENTENCE_END.split(text) if part.strip()]


def load_sentences(directory: Path = FORTUNE_DIR, min_words: int = 2) -> list[str]:
    """Every sentence of every quotation with at least ``min_words`` words, in file order."""
    sentences: list[str] = []
    for path in fortune_files(directory):
        text = path.read_text(encoding="utf-8", errors="replace")
        for quotation in re.split(r"^%\s*$", text, flags=re.MULTILINE):
            sentences.extend(s for s in _sentences_of(quotation) if len(tokenize(s)) >= min_words)
    if not sentences:
        raise CorpusUnavailable(f"no sentences in {directory}")
    return sentences


def assign_sentences(
    sentences: Sequence[str], devices: int, rng: np.random.Generator
) -> list[list[str]]:
    """Deal the sentences out at random: every device gets ``len(sentences) // devices`` or one
    more (each sentence typed by exactly one device)."""
    if not 1 <= devices <= len(sentences):
        raise ValueError(f"devices must be in [1, {len(sentences)}], got {devices}")
    order = rng.permutation(len(sentences))
    return [[sentences[i] for i in order[d::devices]] for d in range(devices)]
