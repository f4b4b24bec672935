"""VITS: text -> waveform in one model, trained with its full objective (Kim et al., 2021).

    phoneme ids -> enc_p -> h, prior N(m_p, logs_p) per phoneme
    audio -> linear spectrogram -> enc_q -> posterior z ~ N(m_q, logs_q) per frame -> flow -> z_p
    MAS between z_p and the prior (exact fp32) -> alignment -> durations -> dp (stochastic or not)
    random segment of z -> dec (HiFi-GAN) -> audio segment, judged by the discriminator

Losses (raw; weights in `model.loss_weights`): mel L1 of the segment, KL(posterior || flow-mapped
prior), duration, and the least-squares adversarial, feature-matching and discriminator losses.
Inference: h -> durations (ceil) -> expanded prior -> sample (noise_scale) -> flow^-1 -> dec.

Submodules carry the names of the original code and of Piper's `model_g` (`enc_p`, `enc_q`, `flow`,
`dp`, `dec`, `emb_g`) so that published voices load by name; the discriminator is Piper's `model_d`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from voicesmith.align import maximum_path
from voicesmith.audio import magnitude_spectrogram, mel_spectrogram, stft_padding
from voicesmith.config import AudioConfig, ModelConfig
from voicesmith.errors import ConfigError
from voicesmith.models.gan import (CombinedDiscriminator, HifiGanGenerator, MultiPeriodDiscriminator,
                                   MultiResolutionDiscriminator, discriminator_loss, feature_matching_loss,
                                   generator_adversarial_loss, split_real_fake, strip_weight_norm)
from voicesmith.models.modules import durations_to_path, sequence_mask
from voicesmith.models.vits.duration import LOG_2PI, DurationPredictor, StochasticDurationPredictor
from voicesmith.models.vits.flow import ResidualCouplingBlock
from voicesmith.models.vits.layers import WaveNet
from voicesmith.models.vits.text_encoder import TextEncoder

LOSS_NAMES = ["mel", "kl", "duration", "adversarial", "feature_matching", "discriminator"]
DURATION_KERNEL_SIZE = 3
DURATION_DROPOUT = 0.5


@dataclass
class VitsOutput:
    """One generator pass: the audio segments to judge, the alignment, and the non-adversarial raw losses."""

    audio: Tensor  # [B, 1, segment_frames * hop] generated from a random segment of z
    real_audio: Tensor  # [B, 1, segment_frames * hop] the recording at the same place
    alignment: Tensor  # [B, T_text, T_mel] the MAS path (0/1)
    durations: Tensor  # [B, T_text] frames per phoneme under that path
    losses: dict[str, Tensor] = field(default_factory=dict)  # mel, kl, duration


class PosteriorEncoder(nn.Module):
    """Linear spectrogram `[B, n_fft/2+1, T]` -> z `[B, inter, T]` sampled from N(m_q, exp(logs_q))."""

    def __init__(self, in_channels: int, out_channels: int, hidden: int, kernel_size: int, n_layers: int,
                 gin_channels: int = 0):
        super().__init__()
        self.out_channels = out_channels
        self.pre = nn.Conv1d(in_channels, hidden, 1)
        self.enc = WaveNet(hidden, kernel_size, 1, n_layers, gin_channels)
        self.proj = nn.Conv1d(hidden, 2 * out_channels, 1)

    def forward(self, spec: Tensor, mask: Tensor, g: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        x = self.enc(self.pre(spec) * mask, mask, g)
        m_q, logs_q = (self.proj(x) * mask).split(self.out_channels, dim=1)
        z = (m_q + torch.randn_like(m_q) * torch.exp(logs_q)) * mask
        return z, m_q, logs_q


class VitsModel(nn.Module):
    """The VITS generator (`enc_p`, `enc_q`, `flow`, `dp`, `dec`, `emb_g`) and its `discriminator`.

    Implements the engine's GAN protocol (training/module.py): `forward(batch)` is the generator pass,
    `discriminator_losses` and `generator_losses` score it.
    """

    is_gan = True
    # Tensors whose rows belong to symbols / speakers: `train.init_from` maps them by name (training/init_from.py).
    symbol_tables = ("enc_p.emb.weight",)
    speaker_tables = ("emb_g.weight",)

    def __init__(self, cfg: ModelConfig, audio: AudioConfig, n_symbols: int, n_speakers: int = 1):
        super().__init__()
        check_vits_config(cfg, audio)
        self.audio_cfg, self.segment_frames, self.n_speakers = audio, cfg.segment_frames, n_speakers
        self.gradient_checkpointing = False
        gin = cfg.speaker_embedding_dim if n_speakers > 1 else 0
        self.enc_p = TextEncoder(n_symbols, cfg.inter_channels, cfg.hidden_channels, cfg.encoder_ffn_channels,
                                 cfg.encoder_heads, cfg.encoder_layers, cfg.encoder_kernel_size, cfg.dropout)
        self.enc_q = PosteriorEncoder(audio.n_fft // 2 + 1, cfg.inter_channels, cfg.hidden_channels,
                                      cfg.posterior_kernel_size, cfg.posterior_layers, gin)
        self.flow = ResidualCouplingBlock(cfg.inter_channels, cfg.hidden_channels, cfg.flow_kernel_size,
                                          cfg.flow_wavenet_layers, cfg.flow_layers, gin)
        duration_class = StochasticDurationPredictor if cfg.stochastic_duration else DurationPredictor
        self.dp = duration_class(cfg.hidden_channels, cfg.duration_predictor_channels, DURATION_KERNEL_SIZE,
                                 DURATION_DROPOUT, gin_channels=gin)
        self.dec = HifiGanGenerator(cfg.inter_channels, cfg.resblock, cfg.resblock_kernel_sizes,
                                    cfg.resblock_dilation_sizes, cfg.upsample_rates, cfg.upsample_initial_channel,
                                    cfg.upsample_kernel_sizes, gin)
        if n_speakers > 1:
            self.emb_g = nn.Embedding(n_speakers, gin)
        self.discriminator = build_discriminator(cfg)

    # --- what the engine asks --------------------------------------------------------------------

    def loss_names(self) -> list[str]:
        return list(LOSS_NAMES)

    def generator_parameters(self) -> Iterator[nn.Parameter]:
        return (p for name, p in self.named_parameters() if not name.startswith("discriminator."))

    def discriminator_parameters(self) -> Iterator[nn.Parameter]:
        return self.discriminator.parameters()

    def parameter_counts(self) -> dict[str, int]:
        """Generator, discriminator, and what synthesis keeps (no posterior encoder): Piper's published sizes."""
        generator = _count(self.generator_parameters())
        return {"generator": generator, "discriminator": _count(self.discriminator_parameters()),
                "synthesis": generator - _count(self.enc_q.parameters())}

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        """Recompute the flow and the decoder in backward instead of storing their activations."""
        self.gradient_checkpointing = enabled

    # --- training ------------------------------------------------------------------------------------

    def forward(self, batch: dict) -> VitsOutput:
        g = self.speaker_embedding(batch["speaker_ids"])
        h, m_p, logs_p, text_mask = self.enc_p(batch["phoneme_ids"], batch["phoneme_lengths"])
        mel_lengths = batch["mel_lengths"]
        spec = linear_spectrogram(batch["audio"], batch["audio_lengths"], self.audio_cfg)[..., :batch["mels"].shape[-1]]
        frame_mask = sequence_mask(mel_lengths, spec.shape[-1]).unsqueeze(1).to(spec.dtype)
        z, m_q, logs_q = self.enc_q(spec, frame_mask, g)
        z_p = self._maybe_checkpoint(self.flow, z, frame_mask, g)
        alignment = monotonic_alignment(z_p, m_p, logs_p, batch["phoneme_lengths"], mel_lengths)
        durations = alignment.sum(2)  # [B, T_text]
        duration_loss = self.dp(h, text_mask, durations.unsqueeze(1), g).sum() / text_mask.sum()
        m_p_frames, logs_p_frames = (torch.bmm(stat.float(), alignment) for stat in (m_p, logs_p))
        kl = kl_divergence(z_p, logs_q, m_p_frames, logs_p_frames, frame_mask)

        starts = random_segment_starts(mel_lengths, self.segment_frames)
        fake = self._maybe_checkpoint(self.dec, slice_frames(z, starts, self.segment_frames), g)
        hop = self.audio_cfg.hop_length
        real = slice_frames(batch["audio"].unsqueeze(1), starts * hop, self.segment_frames * hop)
        target_mel = slice_frames(batch["mels"], starts, self.segment_frames)
        with torch.autocast(fake.device.type, enabled=False):
            mel = F.l1_loss(mel_spectrogram(fake.squeeze(1).float(), self.audio_cfg), target_mel.float())
        return VitsOutput(audio=fake, real_audio=real, alignment=alignment, durations=durations,
                          losses={"mel": mel, "kl": kl, "duration": duration_loss})

    def discriminator_losses(self, batch: dict, output: VitsOutput) -> dict[str, Tensor]:
        """Real and generated audio through the discriminator in one batched pass."""
        n_real = output.real_audio.shape[0]
        scores, _ = self.discriminator(torch.cat([output.real_audio, output.audio.detach()]))
        real_scores, fake_scores = split_real_fake(scores, n_real)
        return {"discriminator": discriminator_loss(real_scores, fake_scores)}

    def generator_losses(self, batch: dict, output: VitsOutput) -> dict[str, Tensor]:
        """The discriminator judges with its weights frozen (no weight gradients are computed for it),
        and the real audio's features, only targets here, are computed without a graph."""
        with frozen(self.discriminator):
            with torch.no_grad():
                _, real_features = self.discriminator(output.real_audio)
            fake_scores, fake_features = self.discriminator(output.audio)
        return {**output.losses, "adversarial": generator_adversarial_loss(fake_scores),
                "feature_matching": feature_matching_loss(real_features, fake_features)}

    # --- inference -----------------------------------------------------------------------------------

    def infer(self, phoneme_ids: Tensor, phoneme_lengths: Tensor, speaker_ids: Optional[Tensor] = None,
              noise_scale: float | Tensor = 0.667, length_scale: float | Tensor = 1.0,
              noise_w: float | Tensor = 0.8) -> dict[str, Tensor]:
        """ids `[B, T]` -> {"audio": `[B, 1, samples]`, "durations": `[B, T]` frames per id,
        "alignment": `[B, T, T_frames]`, "frame_lengths": `[B]`}. Deterministic at noise 0.

        Written to trace to ONNX: one `torch.ceil` (the duration rounding), no Python branch on values.
        """
        g = self.speaker_embedding(speaker_ids) if speaker_ids is not None else None
        h, m_p, logs_p, text_mask = self.enc_p(phoneme_ids, phoneme_lengths)
        log_durations = self.dp.infer(h, text_mask, g, noise_w)
        durations = torch.ceil(torch.exp(log_durations) * text_mask * length_scale)[:, 0]  # [B, T]
        frame_lengths = torch.clamp_min(durations.sum(1), 1).long()
        n_frames = frame_lengths.max()
        frame_mask = (torch.arange(n_frames, device=h.device)[None, :] < frame_lengths[:, None]).unsqueeze(1)
        frame_mask = frame_mask.to(h.dtype)
        alignment = durations_to_path(durations.long(), n_frames)  # padding ids last 0 frames
        m_p, logs_p = torch.bmm(m_p, alignment), torch.bmm(logs_p, alignment)
        z_p = m_p + torch.randn_like(m_p) * torch.exp(logs_p) * noise_scale
        z = self.flow(z_p, frame_mask, g, reverse=True)
        audio = self.dec(z * frame_mask, g)
        return {"audio": audio, "durations": durations, "alignment": alignment, "frame_lengths": frame_lengths}

    def remove_weight_norm(self) -> None:
        """Fold weight norm into plain weights everywhere (inference, export); training needs it back."""
        strip_weight_norm(self)

    def speaker_embedding(self, speaker_ids: Tensor) -> Optional[Tensor]:
        """`[B]` -> `[B, gin, 1]`, or None for a single-speaker voice."""
        if self.n_speakers <= 1:
            return None
        return self.emb_g(speaker_ids).unsqueeze(-1)

    def _maybe_checkpoint(self, module: nn.Module, *args):
        if self.gradient_checkpointing and self.training:
            return checkpoint(module, *args, use_reentrant=False)
        return module(*args)


# --- pieces of the objective -----------------------------------------------------------------------------

@contextmanager
def exact_fp32() -> Iterator[None]:
    """Autocast off and TF32 off: MAS scores differ by thousands between paths, and TF32's 10-bit
    mantissa flips ties in the search."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


@torch.no_grad()
def monotonic_alignment(z_p: Tensor, m_p: Tensor, logs_p: Tensor, text_lengths: Tensor,
                        frame_lengths: Tensor) -> Tensor:
    """The most likely monotonic path of frames z_p `[B, C, T_mel]` under the per-phoneme Gaussians
    (m_p, logs_p) `[B, C, T_text]`: `[B, T_text, T_mel]` (0/1, fp32)."""
    with exact_fp32():
        z_p, m_p, logs_p = z_p.float(), m_p.float(), logs_p.float()
        inverse_variance = torch.exp(-2 * logs_p)  # [B, C, T_text]
        constant = torch.sum(-0.5 * LOG_2PI - logs_p, 1).unsqueeze(-1)
        quadratic = torch.bmm(inverse_variance.transpose(1, 2), -0.5 * z_p.square())
        linear = torch.bmm((m_p * inverse_variance).transpose(1, 2), z_p)
        mean_term = torch.sum(-0.5 * m_p.square() * inverse_variance, 1).unsqueeze(-1)
        log_likelihood = constant + quadratic + linear + mean_term  # [B, T_text, T_mel]
        return maximum_path(log_likelihood, text_lengths, frame_lengths)


def kl_divergence(z_p: Tensor, logs_q: Tensor, m_p: Tensor, logs_p: Tensor, mask: Tensor) -> Tensor:
    """KL(q(z|x) || p(z|c)) estimated at the sample z_p, per unmasked element (fp32)."""
    with torch.autocast(z_p.device.type, enabled=False):
        z_p, logs_q, m_p, logs_p, mask = (t.float() for t in (z_p, logs_q, m_p, logs_p, mask))
        kl = logs_p - logs_q - 0.5 + 0.5 * (z_p - m_p).square() * torch.exp(-2 * logs_p)
        return torch.sum(kl * mask) / torch.sum(mask)


def linear_spectrogram(audio: Tensor, audio_lengths: Tensor, cfg: AudioConfig) -> Tensor:
    """`[B, S]` -> magnitude `[B, n_fft/2+1, S // hop]` (fp32), each item framed as if it stood alone.

    The right edge of every item is reflect-padded from its own samples (not from the batch's zero
    padding), so an item's spectrogram does not depend on what it is batched with.
    """
    _, right = stft_padding(cfg)
    positions = torch.arange(audio.shape[-1] + right, device=audio.device)
    last = (audio_lengths - 1)[:, None]
    source = torch.where(positions[None, :] <= last, positions[None, :], 2 * last - positions[None, :]).clamp_min(0)
    with torch.autocast(audio.device.type, enabled=False):
        spec = magnitude_spectrogram(audio.float().gather(1, source), cfg)
    return spec[..., :audio.shape[-1] // cfg.hop_length]


def random_segment_starts(frame_lengths: Tensor, segment_frames: int) -> Tensor:
    """A random start frame per item so that the segment fits (0 for items shorter than a segment)."""
    room = (frame_lengths - segment_frames + 1).clamp_min(1)
    return (torch.rand(frame_lengths.shape, device=frame_lengths.device) * room).long()


def slice_frames(x: Tensor, starts: Tensor, size: int) -> Tensor:
    """`x[b, :, starts[b]:starts[b] + size]` for each b, zero-padded past the end: `[B, C, size]`."""
    x = F.pad(x, (0, size))
    index = (starts[:, None] + torch.arange(size, device=x.device)[None, :]).unsqueeze(1).expand(-1, x.shape[1], -1)
    return x.gather(2, index)


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """requires_grad off for the module's parameters for the duration (restored after)."""
    parameters = [p for p in module.parameters() if p.requires_grad]
    for parameter in parameters:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in parameters:
            parameter.requires_grad_(True)


def build_discriminator(cfg: ModelConfig) -> nn.Module:
    """Multi-period (+ scale) discriminator, with the multi-resolution one beside it when asked."""
    periodic = MultiPeriodDiscriminator(cfg.discriminator_periods)
    return CombinedDiscriminator(periodic, MultiResolutionDiscriminator()) if cfg.multi_resolution_discriminator \
        else periodic


def check_vits_config(cfg: ModelConfig, audio: AudioConfig) -> None:
    """Refuse settings that cannot work, before any weight is built."""
    hop = math.prod(cfg.upsample_rates)
    if hop != audio.hop_length:
        raise ConfigError(f"model.upsample_rates {cfg.upsample_rates} multiply to {hop}, but audio.hop_length is "
                          f"{audio.hop_length}: the decoder must make exactly one hop of samples per frame.")
    if len(cfg.resblock_kernel_sizes) != len(cfg.resblock_dilation_sizes):
        raise ConfigError(f"model.resblock_kernel_sizes {cfg.resblock_kernel_sizes} and "
                          f"model.resblock_dilation_sizes {cfg.resblock_dilation_sizes} need the same length.")
    if cfg.hidden_channels % cfg.encoder_heads:
        raise ConfigError(f"model.hidden_channels ({cfg.hidden_channels}) must be divisible by "
                          f"model.encoder_heads ({cfg.encoder_heads}).")
    if cfg.inter_channels % 2:
        raise ConfigError(f"model.inter_channels ({cfg.inter_channels}) must be even (the flow splits it in halves).")


def _count(parameters: Iterable[nn.Parameter]) -> int:
    return sum(p.numel() for p in parameters)


def build_vits_model(cfg: ModelConfig, audio: AudioConfig, n_symbols: int, n_speakers: int = 1) -> VitsModel:
    return VitsModel(cfg, audio, n_symbols, n_speakers)
