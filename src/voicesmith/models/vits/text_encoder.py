"""The VITS text encoder: phoneme embeddings -> transformer with windowed relative positions -> prior stats.

The attention is VITS's own (relative key and value embeddings within +-4 positions, 1x1-conv
projections), not a generic one, so that the weights of published Piper and MMS voices map onto
it unchanged. Every shape manipulation is written without Python branches on tensor sizes, so the
module traces to ONNX for any phoneme count.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voicesmith.models.gan.generator import get_padding
from voicesmith.models.vits.layers import LayerNorm

RELATIVE_WINDOW = 4


class RelativeAttention(nn.Module):
    """Multi-head self-attention with learned relative-position embeddings for keys and values."""

    def __init__(self, channels: int, n_heads: int, dropout: float, window: int = RELATIVE_WINDOW):
        super().__init__()
        self.n_heads, self.window = n_heads, window
        self.head_dim = channels // n_heads
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        self.drop = nn.Dropout(dropout)
        scale = self.head_dim ** -0.5
        self.emb_rel_k = nn.Parameter(torch.randn(1, 2 * window + 1, self.head_dim) * scale)
        self.emb_rel_v = nn.Parameter(torch.randn(1, 2 * window + 1, self.head_dim) * scale)
        for conv in (self.conv_q, self.conv_k, self.conv_v):
            nn.init.xavier_uniform_(conv.weight)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x `[B, C, T]`, mask `[B, 1, T]` -> `[B, C, T]`."""
        batch, channels, length = x.shape
        query, key, value = (self._heads(conv(x)) for conv in (self.conv_q, self.conv_k, self.conv_v))
        query = query / math.sqrt(self.head_dim)
        scores = query @ key.transpose(-2, -1)  # [B, H, T, T]
        relative_keys = self._relative_embeddings(self.emb_rel_k, length)  # [1, 2T-1, D]
        scores = scores + _relative_to_absolute(query @ relative_keys.unsqueeze(0).transpose(-2, -1))
        pair_mask = mask.unsqueeze(2) * mask.unsqueeze(-1)  # [B, 1, T, T]
        weights = self.drop(torch.softmax(scores.masked_fill(pair_mask == 0, -1e4), dim=-1))
        output = weights @ value
        relative_values = self._relative_embeddings(self.emb_rel_v, length)
        output = output + _absolute_to_relative(weights) @ relative_values.unsqueeze(0)
        return self.conv_o(output.transpose(2, 3).reshape(batch, channels, length))

    def _heads(self, x: Tensor) -> Tensor:
        batch, channels, length = x.shape
        return x.view(batch, self.n_heads, self.head_dim, length).transpose(2, 3)  # [B, H, T, D]

    def _relative_embeddings(self, table: Tensor, length: int) -> Tensor:
        """The table's rows for relative positions -(T-1)..(T-1), zero beyond the window: `[1, 2T-1, D]`."""
        padded = F.pad(table, (0, 0, length - 1, length - 1))
        return padded[:, self.window:self.window + 2 * length - 1]


def _relative_to_absolute(x: Tensor) -> Tensor:
    """`[B, H, T, 2T-1]` scores by relative position -> `[B, H, T, T]` by key position (a padding trick)."""
    batch, heads, length, _ = x.shape
    x = F.pad(x, (0, 1)).reshape(batch, heads, 2 * length * length)
    x = F.pad(x, (0, length - 1)).reshape(batch, heads, length + 1, 2 * length - 1)
    return x[:, :, :length, length - 1:]


def _absolute_to_relative(x: Tensor) -> Tensor:
    """`[B, H, T, T]` weights by key position -> `[B, H, T, 2T-1]` by relative position."""
    batch, heads, length, _ = x.shape
    x = F.pad(x, (0, length - 1)).reshape(batch, heads, length * (2 * length - 1))
    x = F.pad(x, (length, 0)).reshape(batch, heads, length, 2 * length)
    return x[:, :, :, 1:]


class FeedForward(nn.Module):
    """Two convolutions (kernel k) with ReLU, masked before each."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int, dropout: float):
        super().__init__()
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size, padding=get_padding(kernel_size))
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size, padding=get_padding(kernel_size))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.drop(torch.relu(self.conv_1(x * mask)))
        return self.conv_2(x * mask) * mask


class Encoder(nn.Module):
    """Post-norm transformer: x = norm(x + attention(x)); x = norm(x + feed_forward(x))."""

    def __init__(self, channels: int, filter_channels: int, n_heads: int, n_layers: int, kernel_size: int,
                 dropout: float):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.attn_layers = nn.ModuleList(RelativeAttention(channels, n_heads, dropout) for _ in range(n_layers))
        self.norm_layers_1 = nn.ModuleList(LayerNorm(channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(FeedForward(channels, filter_channels, kernel_size, dropout)
                                        for _ in range(n_layers))
        self.norm_layers_2 = nn.ModuleList(LayerNorm(channels) for _ in range(n_layers))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = x * mask
        for attention, norm_1, feed_forward, norm_2 in zip(self.attn_layers, self.norm_layers_1,
                                                            self.ffn_layers, self.norm_layers_2):
            x = norm_1(x + self.drop(attention(x, mask)))
            x = norm_2(x + self.drop(feed_forward(x, mask)))
        return x * mask


class TextEncoder(nn.Module):
    """Phoneme ids -> hidden states and the prior's per-phoneme mean and log-scale.

    ids `[B, T]`, lengths `[B]` -> (h `[B, hidden, T]`, m_p `[B, inter, T]`, logs_p `[B, inter, T]`,
    mask `[B, 1, T]`).
    """

    def __init__(self, n_symbols: int, inter_channels: int, hidden: int, filter_channels: int, n_heads: int,
                 n_layers: int, kernel_size: int, dropout: float):
        super().__init__()
        self.hidden, self.inter_channels = hidden, inter_channels
        self.emb = nn.Embedding(n_symbols, hidden)
        nn.init.normal_(self.emb.weight, 0.0, hidden ** -0.5)
        self.encoder = Encoder(hidden, filter_channels, n_heads, n_layers, kernel_size, dropout)
        self.proj = nn.Conv1d(hidden, 2 * inter_channels, 1)

    def forward(self, phoneme_ids: Tensor, phoneme_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        x = self.emb(phoneme_ids).transpose(1, 2) * math.sqrt(self.hidden)
        positions = torch.arange(phoneme_ids.shape[1], device=phoneme_ids.device)
        mask = (positions[None, :] < phoneme_lengths[:, None]).unsqueeze(1).to(x.dtype)
        x = self.encoder(x, mask)
        m_p, logs_p = (self.proj(x) * mask).split(self.inter_channels, dim=1)
        return x, m_p, logs_p, mask
