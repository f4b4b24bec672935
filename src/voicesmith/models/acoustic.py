"""Text to mel with an alignment learned by monotonic alignment search (Glow-TTS / Matcha-TTS, no flow).

    phoneme ids -> TextEncoder -> h --(+ speaker / style)--> DurationPredictor(h.detach()) -> log durations
                                  \\-> prior -> mu: the mean mel of each phoneme
    training:  MAS over log N(mel frame | mu phoneme, I)  -> alignment -> durations (predictor targets)
    inference: durations = round(exp(log durations) * length_scale)    -> alignment
    alignment expands h and mu to frames -> Decoder -> mel = mu_frames + residual

MAS needs no external aligner and no teacher: the prior loss pulls mu towards the
frames each phoneme is aligned to, which sharpens the alignment, and so on. The
decoder only refines mu_frames (the within-phoneme movement), which is why the
model speaks after minutes on a CPU.

Mels are modelled normalised per channel with the buffers `mel_mean` / `mel_std`.
The training engine sets them once from the training data with `set_mel_stats`
(see `mel_statistics`); they are saved in the state dict, so inference needs
nothing else. The defaults are typical of speech log-mels so an untouched model
still trains. All losses are in normalised units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voicesmith.align import maximum_path
from voicesmith.audio import MEL_FLOOR
from voicesmith.config import ModelConfig
from voicesmith.errors import ConfigError
from voicesmith.models.conditioning import ExternalSpeakerEncoder, GlobalStyleTokens, contrastive_speaker_loss
from voicesmith.models.modules import (BlockStack, ChannelNorm, DurationPredictor, ResidualConvBlock,
                                       TransformerLayer, durations_to_path, sequence_mask)

DEFAULT_MEL_MEAN = -5.5  # typical of voicesmith's natural-log mels of speech; set_mel_stats refines them
DEFAULT_MEL_STD = 2.2
PRENET_LAYERS = 2
PRENET_KERNEL_SIZE = 5
DURATION_KERNEL_SIZE = 3
MAX_FRAMES_PER_PHONEME = 100  # about 1.2 s at 22050 Hz / hop 256: an untrained predictor cannot run away


@dataclass
class AcousticOutput:
    """What a training pass returns: raw (unweighted) losses, the predicted mel and the MAS alignment."""

    mel: Tensor  # [B, n_mels, T_mel] predicted log-mel, MEL_FLOOR on padding
    alignment: Tensor  # [B, T_text, T_mel] the MAS path (0/1)
    durations: Tensor  # [B, T_text] frames per phoneme under the MAS path
    losses: dict[str, Tensor] = field(default_factory=dict)


class TextEncoder(nn.Module):
    """Phoneme embeddings -> convolutional prenet (local context) -> rotary transformer."""

    def __init__(self, cfg: ModelConfig, n_symbols: int):
        super().__init__()
        channels = cfg.hidden_channels
        self.embedding = nn.Embedding(n_symbols, channels)
        nn.init.normal_(self.embedding.weight, 0.0, channels ** -0.5)
        self.blocks = BlockStack(
            [ResidualConvBlock(channels, PRENET_KERNEL_SIZE, 1, cfg.dropout) for _ in range(PRENET_LAYERS)]
            + [TransformerLayer(channels, cfg.encoder_heads, cfg.encoder_ffn_channels, cfg.encoder_kernel_size,
                                cfg.dropout) for _ in range(cfg.encoder_layers)])
        self.norm = ChannelNorm(channels)

    def forward(self, phoneme_ids: Tensor, mask: Tensor) -> Tensor:
        x = self.embedding(phoneme_ids).transpose(1, 2) * math.sqrt(self.embedding.embedding_dim)
        return self.norm(self.blocks(x * mask, mask)) * mask


class Decoder(nn.Module):
    """Frame-rate residual convolutions with dilations 1, 2, 4, 1, ...: the residual on top of mu_frames."""

    def __init__(self, cfg: ModelConfig, in_channels: int, n_mels: int):
        super().__init__()
        channels = cfg.decoder_channels
        self.input = nn.Conv1d(in_channels + 1, channels, 1)  # +1: the position inside the phoneme
        self.blocks = BlockStack([ResidualConvBlock(channels, cfg.decoder_kernel_size, 2 ** (i % 3), cfg.dropout)
                                  for i in range(cfg.decoder_layers)])
        self.norm = ChannelNorm(channels)
        self.output = nn.Conv1d(channels, n_mels, 1)

    def forward(self, x: Tensor, mask: Tensor, condition: Optional[Tensor]) -> Tensor:
        x = self.input(x)
        if condition is not None:
            x = x + condition[:, :, None]
        x = self.blocks(x * mask, mask)
        return self.output(self.norm(x) * mask) * mask


class AcousticModel(nn.Module):
    """The acoustic model: `forward(batch)` trains, `infer(...)` speaks (mel out; a vocoder makes audio)."""

    def __init__(self, cfg: ModelConfig, n_symbols: int, n_mels: int, n_speakers: int = 1,
                 speaker_encoder: Optional[ExternalSpeakerEncoder] = None):
        super().__init__()
        check_model_config(cfg)
        self.cfg, self.n_mels, self.n_speakers = cfg, n_mels, n_speakers
        self.register_buffer("mel_mean", torch.full((n_mels,), DEFAULT_MEL_MEAN))
        self.register_buffer("mel_std", torch.full((n_mels,), DEFAULT_MEL_STD))

        self.encoder = TextEncoder(cfg, n_symbols)
        self.prior = nn.Conv1d(cfg.hidden_channels, n_mels, 1)
        self.duration_predictor = DurationPredictor(cfg.hidden_channels, cfg.duration_predictor_channels,
                                                    DURATION_KERNEL_SIZE, cfg.dropout)
        self.decoder = Decoder(cfg, cfg.hidden_channels, n_mels)

        # Conditioning: every source gives a [B, speaker_embedding_dim] vector; they are summed.
        dim = cfg.speaker_embedding_dim
        self.speaker_table = nn.Embedding(n_speakers, dim) if n_speakers > 1 else None
        self.gst = GlobalStyleTokens(n_mels, dim, cfg.gst_tokens, cfg.gst_heads) if cfg.gst else None
        self.speaker_encoder = speaker_encoder
        if speaker_encoder is not None:
            self.speaker_projection = nn.Linear(speaker_encoder.dim, dim)
            # Mean embedding of each training speaker: what `infer` uses when no reference mel is given.
            self.register_buffer("speaker_centroids", torch.zeros(n_speakers, speaker_encoder.dim))
            self.register_buffer("speaker_counts", torch.zeros(n_speakers))
        if any(part is not None for part in (self.speaker_table, self.gst, speaker_encoder)):
            self.condition_to_encoder = nn.Linear(dim, cfg.hidden_channels)
            self.condition_to_decoder = nn.Linear(dim, cfg.decoder_channels)

    # --- public helpers -------------------------------------------------------

    # Tensors whose rows belong to symbols / speakers: `train.init_from` maps them by name (training/init_from.py).
    symbol_tables = ("encoder.embedding.weight",)
    speaker_tables = ("speaker_table.weight", "speaker_centroids", "speaker_counts")

    def loss_names(self) -> list[str]:
        names = ["mel", "prior", "duration"]
        return names + ["speaker"] if self.uses_speaker_loss else names

    @property
    def uses_speaker_loss(self) -> bool:
        return self.speaker_encoder is not None and self.cfg.loss_weights.speaker > 0

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        for module in self.modules():
            if isinstance(module, BlockStack):
                module.checkpointing = enabled

    def set_mel_stats(self, mean: Union[Tensor, float], std: Union[Tensor, float]) -> None:
        """Per-channel (or global) mean/std of the training log-mels; call once before training."""
        mean = torch.as_tensor(mean, dtype=torch.float32).expand(self.n_mels)
        std = torch.as_tensor(std, dtype=torch.float32).expand(self.n_mels)
        if not (torch.isfinite(mean).all() and torch.isfinite(std).all()):
            raise ValueError("set_mel_stats: the mel statistics are not finite")
        self.mel_mean.copy_(mean)
        self.mel_std.copy_(std.clamp(min=1e-2))

    def normalize(self, mel: Tensor) -> Tensor:
        return (mel - self.mel_mean[:, None]) / self.mel_std[:, None]

    def to_log_mel(self, normalized: Tensor, mask: Tensor) -> Tensor:
        """Back to log-mel, silence (MEL_FLOOR) on padded frames."""
        mel = normalized * self.mel_std[:, None] + self.mel_mean[:, None]
        return mel.masked_fill(~mask.bool(), MEL_FLOOR)

    # --- the model ------------------------------------------------------------

    def forward(self, batch: dict) -> AcousticOutput:
        phoneme_ids, phoneme_lengths = batch["phoneme_ids"], batch["phoneme_lengths"]
        mels, mel_lengths = batch["mels"], batch["mel_lengths"]
        speaker_ids = self._speaker_ids(batch.get("speaker_ids"), len(phoneme_ids), phoneme_ids.device)
        mel_mask = sequence_mask(mel_lengths, mels.shape[-1]).unsqueeze(1).to(mels.dtype)
        target = self.normalize(mels) * mel_mask

        speaker_embedding = None
        if self.speaker_encoder is not None:
            speaker_embedding = self._encode_speaker(mels, mel_lengths)
            if self.training:
                self._update_speaker_centroids(speaker_ids, speaker_embedding.detach())
        condition = self.condition(speaker_ids, target, mel_lengths, speaker_embedding)
        h, mu, text_mask = self.encode(phoneme_ids, phoneme_lengths, condition)

        with torch.no_grad():
            alignment = maximum_path(log_likelihood(mu, target), phoneme_lengths, mel_lengths)
        durations = alignment.sum(-1)
        log_durations = self.duration_predictor(h.detach(), text_mask)
        predicted, mu_frames = self.decode(h, mu, alignment, durations, mel_mask, condition)
        mel = self.to_log_mel(predicted, mel_mask)

        mel_error = (predicted - target).abs() if self.cfg.mel_loss == "l1" else (predicted - target) ** 2
        losses = {
            "mel": masked_mean(mel_error, mel_mask),
            "prior": masked_mean(0.5 * (target - mu_frames) ** 2 + 0.5 * math.log(2 * math.pi), mel_mask),
            "duration": masked_mean((log_durations - durations.clamp(min=1).log()) ** 2, text_mask.squeeze(1)),
        }
        if self.uses_speaker_loss:
            losses["speaker"] = contrastive_speaker_loss(self.speaker_encoder(mel, mel_lengths),
                                                         speaker_embedding.detach())
        return AcousticOutput(mel=mel, alignment=alignment, durations=durations, losses=losses)

    def infer(self, phoneme_ids: Tensor, phoneme_lengths: Tensor, speaker_ids: Optional[Tensor] = None,
              length_scale: float = 1.0, reference_mel: Optional[Tensor] = None,
              reference_lengths: Optional[Tensor] = None) -> dict[str, Tensor]:
        """Mel from phoneme ids. `length_scale` > 1 speaks slower. `reference_mel` [B, n_mels, T] (log-mel)
        gives the style (GST) and/or the voice (external speaker encoder); without it GST uses the mean
        style and the speaker encoder the mean embedding of the asked training speaker."""
        speaker_ids = self._speaker_ids(speaker_ids, phoneme_ids.shape[0], phoneme_ids.device)
        target, speaker_embedding = None, None
        if reference_mel is not None:
            if reference_lengths is None:
                reference_lengths = torch.full((len(reference_mel),), reference_mel.shape[-1],
                                               device=reference_mel.device)
            reference_mask = sequence_mask(reference_lengths, reference_mel.shape[-1]).unsqueeze(1)
            target = self.normalize(reference_mel) * reference_mask
        if self.speaker_encoder is not None:
            speaker_embedding = (self._encode_speaker(reference_mel, reference_lengths) if reference_mel is not None
                                 else F.normalize(self.speaker_centroids[speaker_ids], dim=-1))
        condition = self.condition(speaker_ids, target, reference_lengths, speaker_embedding)
        h, mu, text_mask = self.encode(phoneme_ids, phoneme_lengths, condition)

        frames = torch.exp(self.duration_predictor(h, text_mask)).clamp(max=MAX_FRAMES_PER_PHONEME)
        # round, not ceil (Glow-TTS): the blanks between phonemes mostly last one frame, and ceil would
        # turn each 1.05 into 2, making every utterance about 10 % too long.
        durations = (torch.round(frames * length_scale).clamp(min=1) * text_mask.squeeze(1)).long()
        mel_lengths = durations.sum(1)
        n_frames = mel_lengths.max()  # a tensor, not an int: the length stays dynamic when traced to ONNX
        alignment = durations_to_path(durations, n_frames)
        mel_mask = sequence_mask(mel_lengths, n_frames).unsqueeze(1).to(h.dtype)
        predicted, _ = self.decode(h, mu, alignment, durations, mel_mask, condition)
        return dict(mel=self.to_log_mel(predicted, mel_mask), mel_lengths=mel_lengths, durations=durations,
                    alignment=alignment)

    def encode(self, phoneme_ids: Tensor, phoneme_lengths: Tensor,
               condition: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Encoder states h [B, C, T_text] (conditioned), prior means mu [B, n_mels, T_text], mask [B, 1, T_text]."""
        text_mask = sequence_mask(phoneme_lengths, phoneme_ids.shape[1]).unsqueeze(1).float()
        h = self.encoder(phoneme_ids, text_mask)
        if condition is not None:
            h = (h + self.condition_to_encoder(condition)[:, :, None]) * text_mask
        return h, self.prior(h) * text_mask, text_mask

    def decode(self, h: Tensor, mu: Tensor, alignment: Tensor, durations: Tensor, mel_mask: Tensor,
               condition: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """Length regulation by the alignment, then the decoder: (normalised mel, mu_frames)."""
        alignment = alignment.to(h.dtype)
        h_frames, mu_frames = torch.bmm(h, alignment), torch.bmm(mu, alignment)
        position = position_in_phoneme(durations, alignment).unsqueeze(1).to(h.dtype) * mel_mask
        decoder_condition = self.condition_to_decoder(condition) if condition is not None else None
        residual = self.decoder(torch.cat([h_frames, position], dim=1), mel_mask, decoder_condition)
        return (mu_frames + residual) * mel_mask, mu_frames

    def condition(self, speaker_ids: Tensor, normalized_mel: Optional[Tensor], mel_lengths: Optional[Tensor],
                  speaker_embedding: Optional[Tensor]) -> Optional[Tensor]:
        """Sum of the active conditioning vectors [B, speaker_embedding_dim], or None without conditioning."""
        parts = []
        if self.speaker_table is not None:
            parts.append(self.speaker_table(speaker_ids))
        if self.gst is not None:
            parts.append(self.gst(normalized_mel, mel_lengths, len(speaker_ids)))
        if speaker_embedding is not None:
            parts.append(self.speaker_projection(speaker_embedding.to(self.speaker_projection.weight.dtype)))
        return torch.stack(parts).sum(0) if parts else None

    # --- speakers -------------------------------------------------------------

    def _speaker_ids(self, speaker_ids: Optional[Tensor], batch_size: int, device: torch.device) -> Tensor:
        if speaker_ids is None:
            return torch.zeros(batch_size, dtype=torch.long, device=device)
        if bool(((speaker_ids < 0) | (speaker_ids >= self.n_speakers)).any()):
            raise ValueError(f"speaker ids {speaker_ids.tolist()} out of range: this model has "
                             f"{self.n_speakers} speaker(s), ids 0..{self.n_speakers - 1}")
        return speaker_ids

    def _encode_speaker(self, mels: Tensor, mel_lengths: Tensor) -> Tensor:
        """External speaker embeddings [B, D]; no graph through a frozen encoder's conditioning path."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.speaker_encoder.frozen):
            return self.speaker_encoder(mels, mel_lengths)

    @torch.no_grad()
    def _update_speaker_centroids(self, speaker_ids: Tensor, embeddings: Tensor) -> None:
        """Running mean per speaker (an exponential one after 100 batches, to follow a fine-tuned encoder)."""
        for speaker in speaker_ids.unique():
            chosen = speaker_ids == speaker
            self.speaker_counts[speaker] += 1
            rate = max(1.0 / float(self.speaker_counts[speaker]), 0.01)
            self.speaker_centroids[speaker] += rate * (embeddings[chosen].mean(0) - self.speaker_centroids[speaker])


# --- functions the model is made of -----------------------------------------------

def log_likelihood(mu: Tensor, target: Tensor) -> Tensor:
    """log N(frame | mu of phoneme, I) for all (phoneme, frame) pairs `[B, T_text, T_mel]`, as one matmul.

    Always float32: MAS compares sums of thousands of these, which half precision would blur.
    """
    with torch.autocast(device_type=mu.device.type, enabled=False):
        mu, target = mu.float(), target.float()
        return (torch.bmm(mu.transpose(1, 2), target)
                - 0.5 * (mu ** 2).sum(1)[:, :, None]
                - 0.5 * (target ** 2).sum(1)[:, None, :]
                - 0.5 * mu.shape[1] * math.log(2 * math.pi))


def position_in_phoneme(durations: Tensor, alignment: Tensor) -> Tensor:
    """For each frame, how far into its phoneme it lies, in (0, 1): lets the decoder shape transitions.

    durations `[B, T_text]` (integers), alignment `[B, T_text, T]` (their 0/1 path) -> `[B, T]`, 0 past
    the last phoneme. Each frame reads its phoneme's start and length through the path (matrix products
    in fp32, exact for any realistic length), which also traces to ONNX.
    """
    path = alignment.float()
    durations = durations.float()
    starts = torch.cumsum(durations, dim=1) - durations
    start = torch.bmm(starts.unsqueeze(1), path)[:, 0]  # [B, T]
    length = torch.bmm(durations.unsqueeze(1), path)[:, 0]
    frames = torch.arange(path.shape[-1], device=path.device, dtype=torch.float32)
    return (frames - start + 0.5) / length.clamp(min=1) * path.sum(1)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over the valid positions; `mask` broadcasts over the channels of `values`."""
    values = values.float()
    channels = values.shape[1] if values.dim() == 3 else 1
    return (values * mask).sum() / (mask.sum() * channels).clamp(min=1)


def mel_statistics(mels: Tensor, mel_lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std `[n_mels]` of the valid frames of a padded batch, for `set_mel_stats`."""
    mask = sequence_mask(mel_lengths, mels.shape[-1]).unsqueeze(1).float()
    count = mask.sum()
    mean = (mels * mask).sum(dim=(0, 2)) / count
    variance = (((mels - mean[:, None]) ** 2) * mask).sum(dim=(0, 2)) / count
    return mean, variance.sqrt()


def check_model_config(cfg: ModelConfig) -> None:
    """Shapes that must divide: refused with the key to change, not a reshape error later."""
    if cfg.hidden_channels % cfg.encoder_heads or (cfg.hidden_channels // cfg.encoder_heads) % 2:
        raise ConfigError(
            f"model.hidden_channels ({cfg.hidden_channels}) must be divisible by model.encoder_heads "
            f"({cfg.encoder_heads}) into an even size per head (rotary positions rotate channel pairs).")
    if cfg.gst and cfg.speaker_embedding_dim % cfg.gst_heads:
        raise ConfigError(f"model.speaker_embedding_dim ({cfg.speaker_embedding_dim}) must be divisible by "
                          f"model.gst_heads ({cfg.gst_heads}).")


def build_acoustic_model(cfg: ModelConfig, n_symbols: int, n_mels: int, n_speakers: int = 1,
                         resolve: Optional[Callable[[str], Path]] = None) -> AcousticModel:
    """The model, with the external speaker encoder loaded (and checked) first when the config names one."""
    speaker_encoder = None
    if cfg.speaker_encoder:
        path = (resolve or (lambda p: Path(p).expanduser()))(cfg.speaker_encoder)
        speaker_encoder = ExternalSpeakerEncoder(Path(path), n_mels, cfg.freeze_speaker_encoder,
                                                 needs_gradient=cfg.loss_weights.speaker > 0)
    elif cfg.loss_weights.speaker > 0:
        raise ConfigError(f"model.loss_weights.speaker is {cfg.loss_weights.speaker}, but the contrastive speaker "
                          f"loss needs a speaker encoder: set model.speaker_encoder to a TorchScript file, or set "
                          f"model.loss_weights.speaker=0.")
    return AcousticModel(cfg, n_symbols, n_mels, n_speakers, speaker_encoder)
