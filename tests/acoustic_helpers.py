"""Real data and a plain PyTorch training loop for the acoustic model tests (no training engine needed).

Items are made with the project's own pieces (corpus reader, audio, text front end),
batched exactly as the batch contract in INTERFACES.md says.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from voicesmith.audio import MEL_FLOOR, load_audio, mel_spectrogram, to_mono, trim_silence
from voicesmith.config import AudioConfig, ModelConfig, TextConfig, VoiceConfig, make_config
from voicesmith.data.formats import read_corpus
from voicesmith.models.acoustic import mel_statistics
from voicesmith.text import SymbolTable, TextFrontend


@dataclass
class Item:
    text: str
    ids: torch.Tensor  # [T_text]
    mel: torch.Tensor  # [n_mels, T_mel]
    speaker: int


@dataclass
class EncodedCorpus:
    items: list[Item]
    symbols: SymbolTable
    speakers: dict[str, int]


def encode_corpus(corpus_dir: Path, audio_cfg: AudioConfig = AudioConfig(),
                  text_cfg: TextConfig = TextConfig()) -> EncodedCorpus:
    corpus = read_corpus(Path(corpus_dir))
    symbols = SymbolTable.default()
    speakers = {name: index for index, name in enumerate(sorted({item.speaker for item in corpus.items}))}
    encoded = TextFrontend(text_cfg, symbols).encode_batch([item.text for item in corpus.items])
    items = []
    for item, text in zip(corpus.items, encoded):
        audio, sample_rate = load_audio(item.audio_path)
        trimmed, _, _ = trim_silence(to_mono(audio), sample_rate, 40.0)
        mel = mel_spectrogram(torch.from_numpy(trimmed), audio_cfg)
        items.append(Item(item.text, torch.tensor(text.ids), mel, speakers[item.speaker]))
    return EncodedCorpus(items, symbols, speakers)


def make_batch(items: list[Item]) -> dict:
    """The batch contract: ids 0-padded, mels MEL_FLOOR-padded, lengths, speaker ids."""
    text_lengths = torch.tensor([len(item.ids) for item in items])
    mel_lengths = torch.tensor([item.mel.shape[-1] for item in items])
    ids = torch.zeros(len(items), int(text_lengths.max()), dtype=torch.long)
    mels = torch.full((len(items), items[0].mel.shape[0], int(mel_lengths.max())), MEL_FLOOR)
    for row, item in enumerate(items):
        ids[row, :len(item.ids)] = item.ids
        mels[row, :, :item.mel.shape[-1]] = item.mel
    return {"ids": [str(row) for row in range(len(items))], "texts": [item.text for item in items],
            "phoneme_ids": ids, "phoneme_lengths": text_lengths, "mels": mels, "mel_lengths": mel_lengths,
            "speaker_ids": torch.tensor([item.speaker for item in items])}


def tiny_config(**model_overrides) -> VoiceConfig:
    config = make_config("corpus", "tiny")
    for key, value in model_overrides.items():
        setattr(config.model, key, value)
    return config


def set_mel_stats(model: nn.Module, items: list[Item]) -> None:
    """What the training engine does once before training: normalise with the data's own statistics."""
    batch = make_batch(items)
    model.set_mel_stats(*mel_statistics(batch["mels"], batch["mel_lengths"]))


def weighted_loss(model: nn.Module, batch: dict, cfg: ModelConfig) -> torch.Tensor:
    losses = model(batch).losses
    return sum(getattr(cfg.loss_weights, name) * value for name, value in losses.items())


def validation_loss(model: nn.Module, items: list[Item], name: str = "mel") -> float:
    was_training = model.training
    model.eval()
    with torch.no_grad():
        value = float(model(make_batch(items)).losses[name])
    model.train(was_training)
    return value


def train(model: nn.Module, items: list[Item], cfg: VoiceConfig, max_steps: int, max_seconds: float,
          batch_size: int = 8, seed: int = 0) -> int:
    """Plain AdamW loop over random batches; returns the number of steps taken."""
    generator = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.learning_rate, betas=cfg.train.betas)
    model.train()
    start, step = time.perf_counter(), 0
    while step < max_steps and time.perf_counter() - start < max_seconds:
        warmup = min(1.0, (step + 1) / max(cfg.train.warmup_steps, 1))
        for group in optimizer.param_groups:
            group["lr"] = cfg.train.learning_rate * warmup
        batch = make_batch(generator.sample(items, min(batch_size, len(items))))
        loss = weighted_loss(model, batch, cfg.model)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip_norm)
        optimizer.step()
        step += 1
    return step
