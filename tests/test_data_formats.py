"""Corpus layouts: LJSpeech, VCTK and filelists, auto-detected, and bad lines reported, not fatal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voicesmith.data.formats import detect_format, read_corpus
from voicesmith.errors import DataError


def _wav(path: Path, seconds: float = 0.1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, np.zeros(int(22050 * seconds), dtype=np.float32), 22050)
    return path


def test_ljspeech_columns_quotes_and_bad_lines(tmp_path):
    for name in ("a", "b", "c", "d", "e"):
        _wav(tmp_path / "wavs" / f"{name}.wav")
    _wav(tmp_path / "wavs" / "unlisted.wav")
    metadata = (
        "\ufeffa|Raw text 1.|Normalized text one.\r\n"  # BOM and CRLF: last column wins
        'b|"Quoted," she said.\n'  # two columns; quotes are text
        "\n"  # blank line: not an item
        "c|Second column only.|\n"  # empty last column: the other text column
        "d|x|y|z\n"  # four fields
        "|no id|\n"
    ).encode("utf-8") + "e|caf".encode("utf-8") + b"\xe9\n"
    (tmp_path / "metadata.csv").write_bytes(metadata)

    corpus = read_corpus(tmp_path)

    assert corpus.format == "ljspeech"
    assert [(i.id, i.line, i.text, i.speaker) for i in corpus.items] == [
        ("a", 1, "Normalized text one.", ""), ("b", 2, '"Quoted," she said.', ""), ("c", 4, "Second column only.", "")]
    assert corpus.items[0].audio_path == tmp_path / "wavs" / "a.wav"
    assert [(f.id, f.line, f.kind, f.severity) for f in corpus.findings] == [
        ("d", 5, "unparseable_line", "error"), ("line-6", 6, "unparseable_line", "error"),
        ("e", 7, "not_utf8", "error")]
    assert corpus.items_total == 6
    assert corpus.unlisted_audio == 3  # d.wav and e.wav (their lines are bad) and unlisted.wav


def test_duplicate_ids_keep_the_first(tmp_path):
    (tmp_path / "metadata.csv").write_text("a|first\nb|other\na|second\n", encoding="utf-8")
    corpus = read_corpus(tmp_path)
    assert [(i.id, i.text) for i in corpus.items] == [("a", "first"), ("b", "other")]
    [finding] = corpus.findings
    assert (finding.id, finding.line, finding.kind) == ("a", 3, "duplicate_id")
    assert "line 1" in finding.message
    assert corpus.items_total == 3


def test_vctk_layout_speakers_and_mic_files(tmp_path, multispeaker_corpus):
    corpus = read_corpus(multispeaker_corpus)
    assert corpus.format == "vctk"
    assert len(corpus.items) == 24 and not corpus.findings
    assert {item.speaker for item in corpus.items} == {"spk0", "spk1", "spk2"}
    assert all(item.audio_path.is_file() and item.line is None for item in corpus.items)

    # VCTK 0.92: wav48_silence_trimmed/<spk>/<id>_mic1.flac, plus a transcript that is not UTF-8
    (tmp_path / "txt" / "p225").mkdir(parents=True)
    (tmp_path / "txt" / "p225" / "p225_001.txt").write_text("Please call Stella.\n", encoding="utf-8")
    (tmp_path / "txt" / "p225" / "p225_002.txt").write_bytes(b"caf\xe9\n")
    _wav(tmp_path / "wav48_silence_trimmed" / "p225" / "p225_001_mic2.flac")
    _wav(tmp_path / "wav48_silence_trimmed" / "p225" / "p225_001_mic1.flac")
    corpus = read_corpus(tmp_path)
    assert [(i.id, i.speaker, i.text, i.audio_path.name) for i in corpus.items] == [
        ("p225_001", "p225", "Please call Stella.", "p225_001_mic1.flac")]
    assert [(f.id, f.kind) for f in corpus.findings] == [("p225_002", "not_utf8")]
    assert corpus.items_total == 2


def test_filelists_relative_paths_and_speakers(tmp_path):
    _wav(tmp_path / "audio" / "one.wav")
    _wav(tmp_path / "audio" / "two.flac")
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "train.txt").write_text("../audio/one.wav|Hello there.\n../audio/two.flac|anna|Hi | there?\n"
                                     "../audio/three.wav|bob|Third.\n", encoding="utf-8")
    corpus = read_corpus(lists / "train.txt")
    assert corpus.format == "filelist"
    assert [(i.id, i.speaker, i.text) for i in corpus.items] == [("../audio/one", "", "Hello there."),
                                                                 ("../audio/three", "bob", "Third.")]
    assert corpus.items[0].audio_path.resolve() == (tmp_path / "audio" / "one.wav").resolve()
    assert [(f.line, f.kind) for f in corpus.findings] == [(2, "unparseable_line")]  # 4 fields: "|" in the text


def test_detection_and_forcing(tmp_path, demo_corpus):
    assert detect_format(demo_corpus) == "ljspeech"
    assert detect_format(demo_corpus / "metadata.csv") == "ljspeech"
    # a metadata.csv-style file read as a filelist: its first field is then a path
    corpus = read_corpus(demo_corpus / "metadata.csv", format="filelist")
    assert corpus.format == "filelist" and corpus.items[0].id == "demo-0001"
    with pytest.raises(DataError, match="Cannot tell the layout"):
        read_corpus(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        read_corpus(tmp_path / "nowhere")
    with pytest.raises(DataError, match="Unknown dataset format"):
        read_corpus(demo_corpus, format="csv")
