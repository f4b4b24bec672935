"""Corpus layouts -> a flat list of items, and a finding for every line that is not one.

Three layouts are read (auto-detected, or forced with `format`):
- LJSpeech: a folder with `metadata.csv` (`id|text` or `id|text|normalized text`, no header,
  no quoting: quotes are text; the last non-empty text column wins) and `wavs/<id>.wav`.
- VCTK: a folder with `txt/<speaker>/<id>.txt` and audio in `wav*/<speaker>/<id>[_mic1|_mic2].wav|flac`.
- Filelist: a text file of `path|text` or `path|speaker|text` lines; paths are relative to
  the filelist's folder and the id is the path as written, without its extension.

Every metadata line is decoded on its own, so one line that is not UTF-8 or cannot be parsed is
reported and excluded while the others still load. A duplicate id keeps its first line and
excludes the later ones. Each excluded line yields exactly one error finding, so
`items_total = len(items) + len(excluded findings)` always holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

from voicesmith.errors import DataError

FORMATS = ("ljspeech", "vctk", "filelist")
AUDIO_SUFFIXES = (".wav", ".flac")
VCTK_MICS = ("", "_mic1", "_mic2")

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class CorpusItem:
    """One utterance: where its audio is, what is said and by whom ("" in single-speaker corpora)."""

    id: str
    line: Optional[int]  # 1-based line in the metadata file or filelist; None for VCTK (one file per text)
    audio_path: Path
    text: str
    speaker: str = ""


@dataclass(frozen=True)
class Finding:
    """One problem with one item. Errors exclude the item; warnings keep it (fixed up when loaded)."""

    id: str
    line: Optional[int]
    severity: Severity
    kind: str
    message: str

    def to_dict(self, excluded: bool) -> dict:
        return {"id": self.id, "line": self.line, "severity": self.severity, "kind": self.kind,
                "message": self.message, "excluded": excluded}


@dataclass
class Corpus:
    """The items of a dataset that parsed, plus one error finding per line that did not."""

    root: Path  # audio paths in the metadata are relative to this folder
    format: str
    source: Path  # the metadata file, filelist or txt folder the items came from
    items: list[CorpusItem] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    unlisted_audio: int = 0  # audio files in the corpus folder that no metadata line names
    _first_line: dict[str, Optional[int]] = field(default_factory=dict, repr=False)

    @property
    def items_total(self) -> int:
        return len(self.items) + sum(f.severity == "error" for f in self.findings)


def read_corpus(path: Path, format: str = "auto") -> Corpus:
    """Read a dataset in any supported layout; raises DataError when the layout cannot be told."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"Dataset {path} does not exist. Pass an LJSpeech folder (metadata.csv + wavs/), "
                        f"a VCTK folder (txt/ + wav*/) or a filelist (path|text lines).")
    if format not in ("auto", *FORMATS):
        raise DataError(f"Unknown dataset format {format!r}; choose one of auto, {', '.join(FORMATS)}.")
    fmt = detect_format(path) if format == "auto" else format
    if fmt == "ljspeech":
        return read_ljspeech(path)
    if fmt == "vctk":
        return read_vctk(path)
    return read_filelist(path)


def detect_format(path: Path) -> str:
    if path.is_file():
        return "ljspeech" if path.name == "metadata.csv" else "filelist"
    if (path / "metadata.csv").is_file():
        return "ljspeech"
    if (path / "txt").is_dir() and _vctk_audio_dirs(path):
        return "vctk"
    raise DataError(f"Cannot tell the layout of dataset folder {path}: it has no metadata.csv (LJSpeech) and "
                    f"no txt/ plus wav*/ folders (VCTK). Point to a folder in one of these layouts, or to a "
                    f"filelist of `path|text` lines, or force the layout with --format.")


# --- LJSpeech ------------------------------------------------------------------

def read_ljspeech(path: Path) -> Corpus:
    metadata = path if path.is_file() else path / "metadata.csv"
    if not metadata.is_file():
        raise DataError(f"{metadata} does not exist: an LJSpeech folder needs metadata.csv with `id|text` "
                        f"lines next to a wavs/ folder.")
    root = metadata.parent
    corpus = Corpus(root=root, format="ljspeech", source=metadata)
    for line_no, fields in _split_lines(metadata, corpus):
        item_id = fields[0].strip()
        if not item_id or len(fields) not in (2, 3):
            _unparseable(corpus, fields, line_no, "an `id|text` or `id|text|normalized text` line")
            continue
        texts = [text.strip() for text in fields[1:]]
        text = next((text for text in reversed(texts) if text), "")
        _add_item(corpus, CorpusItem(item_id, line_no, _ljspeech_audio(root, item_id), text))
    corpus.unlisted_audio = _count_unlisted(root / "wavs", corpus.items)
    return corpus


def _ljspeech_audio(root: Path, item_id: str) -> Path:
    """wavs/<id>.wav, or .flac when only that exists (a missing file is reported by validation)."""
    candidates = [root / "wavs" / f"{item_id}{suffix}" for suffix in AUDIO_SUFFIXES]
    return next((candidate for candidate in candidates if candidate.exists()), candidates[0])


# --- filelists -------------------------------------------------------------------

def read_filelist(path: Path) -> Corpus:
    if not path.is_file():
        raise DataError(f"Filelist {path} is not a file. A filelist holds `path|text` or `path|speaker|text` "
                        f"lines with audio paths relative to the filelist's folder.")
    root = path.parent
    corpus = Corpus(root=root, format="filelist", source=path)
    for line_no, fields in _split_lines(path, corpus):
        audio = fields[0].strip()
        if not audio or len(fields) not in (2, 3):
            _unparseable(corpus, fields, line_no, "a `path|text` or `path|speaker|text` line")
            continue
        speaker = fields[1].strip() if len(fields) == 3 else ""
        item_id = Path(audio).with_suffix("").as_posix()
        _add_item(corpus, CorpusItem(item_id, line_no, root / audio, fields[-1].strip(), speaker))
    return corpus


# --- VCTK --------------------------------------------------------------------------

def read_vctk(path: Path) -> Corpus:
    txt_dir = path / "txt"
    audio_dirs = _vctk_audio_dirs(path)
    if not txt_dir.is_dir() or not audio_dirs:
        raise DataError(f"{path} is not a VCTK folder: it needs txt/<speaker>/<id>.txt and "
                        f"wav*/<speaker>/<id>.wav (or .flac) folders.")
    corpus = Corpus(root=path, format="vctk", source=txt_dir)
    for txt in sorted(txt_dir.glob("*/*.txt")):
        speaker, item_id = txt.parent.name, txt.stem
        try:
            text = txt.read_bytes().decode("utf-8-sig").strip()
        except UnicodeDecodeError as exc:
            corpus.findings.append(Finding(item_id, None, "error", "not_utf8",
                                           f"{txt} is not UTF-8 text (byte {exc.start}); save it as UTF-8."))
            continue
        except OSError as exc:
            corpus.findings.append(Finding(item_id, None, "error", "unreadable_text",
                                           f"{txt} cannot be read ({exc.strerror}); check its permissions."))
            continue
        _add_item(corpus, CorpusItem(item_id, None, _vctk_audio(audio_dirs, speaker, item_id), text, speaker))
    corpus.unlisted_audio = sum(_count_unlisted(folder, corpus.items, "*/*") for folder in audio_dirs)
    return corpus


def _vctk_audio_dirs(path: Path) -> list[Path]:
    return sorted(child for child in path.glob("wav*") if child.is_dir())


def _vctk_audio(audio_dirs: list[Path], speaker: str, item_id: str) -> Path:
    """The first existing <dir>/<speaker>/<id>[_mic1|_mic2].wav|flac (VCTK 0.80 and 0.92 layouts)."""
    for folder in audio_dirs:
        for mic in VCTK_MICS:
            for suffix in AUDIO_SUFFIXES:
                candidate = folder / speaker / f"{item_id}{mic}{suffix}"
                if candidate.exists():
                    return candidate
    return audio_dirs[0] / speaker / f"{item_id}.wav"


# --- shared ---------------------------------------------------------------------------

def _split_lines(path: Path, corpus: Corpus):
    """Yield (line number, `|` fields) for each non-blank line that decodes as UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"Cannot read {path} ({exc.strerror}); check that it exists and is readable.") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            item_id = raw.split(b"|", 1)[0].decode("utf-8", errors="replace").strip() or f"line-{line_no}"
            corpus.findings.append(Finding(item_id, line_no, "error", "not_utf8",
                                           f"{path.name} line {line_no} is not UTF-8 (byte {exc.start}); "
                                           f"save the file as UTF-8."))
            continue
        yield line_no, line.split("|")


def _unparseable(corpus: Corpus, fields: list[str], line_no: int, expected: str) -> None:
    item_id = fields[0].strip() or f"line-{line_no}"
    corpus.findings.append(Finding(item_id, line_no, "error", "unparseable_line",
                                   f"{corpus.source.name} line {line_no} has {len(fields)} `|`-separated "
                                   f"field(s){' and no id' if not fields[0].strip() else ''}; expected "
                                   f"{expected}. Fix or remove the line."))


def _add_item(corpus: Corpus, item: CorpusItem) -> None:
    """Keep the first item of an id; later ones are excluded as duplicates."""
    seen = corpus._first_line
    if item.id in seen:
        first = seen[item.id]
        where = f"line {first}" if first is not None else "another speaker's folder"
        corpus.findings.append(Finding(item.id, item.line, "error", "duplicate_id",
                                       f"id {item.id!r} is already used by {where}; give each utterance its "
                                       f"own id (this one is excluded, the first is kept)."))
        return
    seen[item.id] = item.line
    corpus.items.append(item)


def _count_unlisted(folder: Path, items: list[CorpusItem], pattern: str = "*") -> int:
    if not folder.is_dir():
        return 0
    listed = {item.audio_path for item in items}
    return sum(1 for path in folder.glob(pattern)
               if path.suffix.lower() in AUDIO_SUFFIXES and path not in listed)
