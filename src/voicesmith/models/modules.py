"""Building blocks of the acoustic model: masks, rotary self-attention, masked convolutions.

Every block takes `x [B, C, T]` and a float `mask [B, 1, T]` (1 on real frames,
0 on padding) and zeroes padded positions before each convolution, so a padded
batch gives the same outputs on its valid region as each item alone.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn


def sequence_mask(lengths: Tensor, max_length: Optional[int] = None) -> Tensor:
    """`[B, T]` bool mask, True on the first `lengths[b]` positions."""
    max_length = int(lengths.max()) if max_length is None else max_length
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


def durations_to_path(durations: Tensor, n_frames: int) -> Tensor:
    """Hard monotonic alignment `[B, T_text, n_frames]` from integer durations `[B, T_text]`."""
    ends = torch.cumsum(durations, dim=1)
    starts = ends - durations
    frames = torch.arange(n_frames, device=durations.device)[None, None, :]
    return ((frames >= starts[:, :, None]) & (frames < ends[:, :, None])).float()


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of `[B, C, T]`: per frame, so padding never leaks into statistics."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


def rotary_tables(length: int, head_dim: int, device: torch.device, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos/sin `[length, head_dim / 2]` of the rotary position embedding (RoFormer)."""
    inverse_frequencies = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inverse_frequencies[None, :]
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (first half, second half) of `x [B, H, T, D]` by position-dependent angles."""
    first, second = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class RotarySelfAttention(nn.Module):
    """Multi-head self-attention with rotary positions; padded keys are never attended to.

    Rotary positions are relative in effect (the score depends on i - j only), which
    suits phoneme sequences of any length without a learned position table.
    """

    def __init__(self, channels: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Conv1d(channels, 3 * channels, 1)
        self.out = nn.Conv1d(channels, channels, 1)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        batch, channels, length = x.shape
        head_dim = channels // self.n_heads
        qkv = self.qkv(x).view(batch, 3, self.n_heads, head_dim, length).transpose(3, 4)
        query, key, value = qkv.unbind(dim=1)  # each [B, H, T, D]
        cos, sin = rotary_tables(length, head_dim, x.device)
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        key_mask = mask.bool()[:, None, :, :]  # [B, 1, 1, T]: every query sees the valid keys only
        attended = F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask)
        return self.out(attended.transpose(2, 3).reshape(batch, channels, length))


class ConvFeedForward(nn.Module):
    """Position-wise feed-forward with a small kernel (Glow-TTS / FastSpeech): local context between phonemes."""

    def __init__(self, channels: int, hidden_channels: int, kernel_size: int, dropout: float):
        super().__init__()
        self.expand = nn.Conv1d(channels, hidden_channels, kernel_size, padding=kernel_size // 2)
        self.project = nn.Conv1d(hidden_channels, channels, kernel_size, padding=kernel_size // 2)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.dropout(F.gelu(self.expand(x * mask)))
        return self.project(x * mask)


class TransformerLayer(nn.Module):
    """Pre-LayerNorm transformer layer: rotary attention, then a convolutional feed-forward."""

    def __init__(self, channels: int, n_heads: int, ffn_channels: int, kernel_size: int, dropout: float):
        super().__init__()
        self.attention_norm = ChannelNorm(channels)
        self.attention = RotarySelfAttention(channels, n_heads)
        self.ffn_norm = ChannelNorm(channels)
        self.ffn = ConvFeedForward(channels, ffn_channels, kernel_size, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x), mask))
        x = x + self.dropout(self.ffn(self.ffn_norm(x), mask))
        return x * mask


class ResidualConvBlock(nn.Module):
    """Pre-norm residual block: a (dilated) convolution for context, a 1x1 convolution to mix channels."""

    def __init__(self, channels: int, kernel_size: int, dilation: int, dropout: float):
        super().__init__()
        self.norm = ChannelNorm(channels)
        self.context = nn.Conv1d(channels, channels, kernel_size, dilation=dilation,
                                 padding=dilation * (kernel_size // 2))
        self.mix = nn.Conv1d(channels, channels, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        residual = self.mix(F.gelu(self.context(self.norm(x) * mask)))
        return (x + self.dropout(residual)) * mask


class DurationPredictor(nn.Module):
    """Log-duration per phoneme from (detached) encoder states, as in FastSpeech / Glow-TTS."""

    def __init__(self, in_channels: int, channels: int, kernel_size: int, dropout: float):
        super().__init__()
        self.layers = nn.ModuleList([
            nn.Conv1d(in_channels, channels, kernel_size, padding=kernel_size // 2),
            nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2),
        ])
        self.norms = nn.ModuleList([ChannelNorm(channels), ChannelNorm(channels)])
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Conv1d(channels, 1, 1)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """`[B, T_text]` predicted log(frames) for each phoneme."""
        for conv, norm in zip(self.layers, self.norms):
            x = self.dropout(norm(F.relu(conv(x * mask))))
        return (self.out(x * mask) * mask).squeeze(1)


class BlockStack(nn.ModuleList):
    """Blocks applied in turn as `x = block(x, mask)`; optionally with gradient checkpointing.

    Checkpointing recomputes each block in the backward pass instead of keeping its
    activations: less memory for long utterances, about a third more compute.
    """

    checkpointing = False

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        for block in self:
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask)
        return x
