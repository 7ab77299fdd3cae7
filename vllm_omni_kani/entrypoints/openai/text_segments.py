"""Splitting long input into generations that each fit the model, without losing a word.

Sentences are kept whole where possible and packed greedily up to ``max_chars``; a sentence
longer than that is cut at clause punctuation, then at spaces, and only as a last resort
inside a word. Whitespace is collapsed; the segments hold every word of the input, in order.
"""

from __future__ import annotations

import re

# End of a sentence: terminal punctuation (Latin or CJK), optional closing quotes/brackets,
# then whitespace or the end of the text. CJK terminators need no following space.
_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+|(?<=[。！？])")
_CLAUSE_END = re.compile(r"(?<=[,;:，；：—])\s+")


def split_sentences(text: str) -> list[str]:
    """Sentences with their whitespace collapsed to single spaces (line breaks carry no speech)."""
    return [" ".join(s.split()) for s in _SENTENCE_END.split(text) if s and s.strip()]


def _split_long(sentence: str, max_chars: int) -> list[str]:
    """Cut one over-long sentence at clauses, then words, then characters."""
    pieces: list[str] = []
    for clause in _CLAUSE_END.split(sentence):
        if len(clause) <= max_chars:
            pieces.append(clause)
            continue
        line = ""
        for word in clause.split():
            while len(word) > max_chars:  # a "word" longer than a segment (e.g. a URL)
                if line:
                    pieces.append(line)
                    line = ""
                pieces.append(word[:max_chars])
                word = word[max_chars:]
            if line and len(line) + 1 + len(word) > max_chars:
                pieces.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        if line:
            pieces.append(line)
    return pieces


def split_text(text: str, max_chars: int) -> list[str]:
    """Segments of at most ``max_chars`` characters, in order, covering every word of ``text``."""
    if max_chars <= 0:
        raise ValueError("max_chars must be positive")
    segments: list[str] = []
    current = ""
    for sentence in split_sentences(text):
        parts = [sentence] if len(sentence) <= max_chars else _split_long(sentence, max_chars)
        for part in parts:
            if current and len(current) + 1 + len(part) > max_chars:
                segments.append(current)
                current = part
            else:
                current = f"{current} {part}" if current else part
    if current:
        segments.append(current)
    return segments
