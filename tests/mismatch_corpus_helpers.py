"""Corpora whose transcripts do not match their audio, made from the demo corpus (tests and benchmark)."""

from __future__ import annotations

import shutil
from pathlib import Path

SYMBOLS_ONLY = "# * ~ ~"  # espeak-ng reads it aloud ("hash asterisk tilde"): only the words check catches it
PLACEHOLDER = "[inaudible]"


def read_rows(corpus: Path) -> list[tuple[str, str]]:
    """(id, text) of an LJSpeech demo corpus, in order."""
    rows = []
    for line in (corpus / "metadata.csv").read_text(encoding="utf-8").splitlines():
        item_id, _, text = line.split("|")
        rows.append((item_id, text))
    return rows


def write_corpus(rows: list[tuple[str, str]], source: Path, out: Path) -> Path:
    """An LJSpeech folder with these (id, text) rows and the source corpus's recordings of those ids."""
    (out / "wavs").mkdir(parents=True)
    for item_id, _ in rows:
        shutil.copy2(source / "wavs" / f"{item_id}.wav", out / "wavs" / f"{item_id}.wav")
    (out / "metadata.csv").write_text("".join(f"{i}|{t}|{t}\n" for i, t in rows), encoding="utf-8")
    return out


def truncate(text: str, words: int = 3) -> str:
    return " ".join(text.split()[:words]) + "."


def make_mismatch_corpus(source: Path, out: Path) -> tuple[Path, dict[str, str]]:
    """The source corpus with transcripts gone wrong; returns the folder and {id: how its text went wrong}.

    The shortest and the longest transcript swap places, one transcript loses all but three words,
    one is only symbols and one a placeholder tag. Every other item keeps its own text.
    """
    rows = read_rows(source)
    by_length = sorted(range(len(rows)), key=lambda index: len(rows[index][1]))
    shortest, longest = by_length[0], by_length[-1]
    truncated, symbols, placeholder = by_length[len(rows) // 2], by_length[1], by_length[2]
    texts = [text for _, text in rows]
    texts[shortest], texts[longest] = rows[longest][1], rows[shortest][1]
    texts[truncated] = truncate(texts[truncated])
    texts[symbols], texts[placeholder] = SYMBOLS_ONLY, PLACEHOLDER
    broken = {rows[shortest][0]: "swapped", rows[longest][0]: "swapped", rows[truncated][0]: "truncated",
              rows[symbols][0]: "symbols", rows[placeholder][0]: "placeholder"}
    return write_corpus([(item_id, text) for (item_id, _), text in zip(rows, texts)], source, out), broken


def swap_closest_pair(rows: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], set[str]]:
    """The rows with the two transcripts closest in length swapped (only listening tells them apart)."""
    order = sorted(range(len(rows)), key=lambda index: len(rows[index][1]))
    first, second = min(zip(order, order[1:]), key=lambda pair: abs(len(rows[pair[0]][1]) - len(rows[pair[1]][1])))
    swapped = list(rows)
    swapped[first] = (rows[first][0], rows[second][1])
    swapped[second] = (rows[second][0], rows[first][1])
    return swapped, {rows[first][0], rows[second][0]}
