"""Every file voicesmith keeps is written by fileio's one atomic helper: unique temporary names (two
threads of one process never share one), nothing left behind, and a full disk keeps the old file."""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest
import soundfile as sf

from voicesmith import fileio
from voicesmith.audio import write_wav
from voicesmith.config import DataConfig, VoiceConfig, load_config
from voicesmith.errors import DiskFull
from voicesmith.fileio import atomic_write, temporary_path, temporary_writer
from voicesmith.text import SymbolTable


def test_temporary_names_are_unique_and_name_their_writer(tmp_path):
    names = {temporary_path(tmp_path / "last.ckpt").name for _ in range(100)}
    assert len(names) == 100
    assert {temporary_writer(tmp_path / name) for name in names} == {os.getpid()}


def test_threads_writing_one_file_never_mix_their_bytes(tmp_path):
    target = tmp_path / "shared.bin"
    payloads = [bytes([index]) * 200_000 for index in range(8)]
    errors = []

    def writer(payload: bytes) -> None:
        try:
            for _ in range(10):
                atomic_write(target, lambda handle: handle.write(payload), durable=False)
        except Exception as exc:  # noqa: any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(payload,)) for payload in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert target.read_bytes() in payloads  # one writer's whole file, never a mix
    assert [path.name for path in tmp_path.iterdir()] == ["shared.bin"]


def test_config_symbols_and_audio_writers_use_the_helper(tmp_path, monkeypatch):
    config_path = VoiceConfig(data=DataConfig(dataset="corpus")).save(tmp_path / "config.yaml")
    SymbolTable.default().save(tmp_path / "symbols.json")
    write_wav(tmp_path / "a.wav", np.zeros(2205, dtype=np.float32), 22050)
    assert sf.info(tmp_path / "a.wav").samplerate == 22050
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    assert sorted(before) == ["a.wav", "config.yaml", "symbols.json"]

    def full(path, mode="r", *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "open", full, raising=False)
    for write in (lambda: load_config(config_path).save(config_path),
                  lambda: SymbolTable.default().save(tmp_path / "symbols.json"),
                  lambda: write_wav(tmp_path / "a.wav", np.ones(2205, dtype=np.float32) * 0.1, 22050)):
        with pytest.raises(DiskFull, match="The disk is full"):
            write()
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
