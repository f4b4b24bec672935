"""Small building blocks of VITS: channel LayerNorm, WaveNet stack, dilated depth-separable convolutions.

Parameter names follow the original VITS code (and so Piper's checkpoints): `gamma`/`beta`,
`in_layers`, `res_skip_layers`, `cond_layer`, `convs_sep`, `convs_1x1`, `norms_1`, `norms_2`, so that
published weights map onto these modules by name.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from voicesmith.models.gan.generator import get_padding


class LayerNorm(nn.Module):
    """LayerNorm over the channels of `[B, C, T]`, per frame (padding never enters the statistics)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        x = F.layer_norm(x.transpose(1, -1), self.gamma.shape, self.gamma, self.beta, self.eps)  # traces as a constant
        return x.transpose(1, -1)


class WaveNet(nn.Module):
    """Non-causal WaveNet of gated dilated convolutions with skip sums (posterior encoder and flow).

    x `[B, hidden, T]`, mask `[B, 1, T]`, g `[B, gin, 1]` (speaker) -> `[B, hidden, T]`.
    """

    def __init__(self, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int,
                 gin_channels: int = 0, dropout: float = 0.0):
        super().__init__()
        self.hidden, self.n_layers = hidden, n_layers
        self.drop = nn.Dropout(dropout)
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        if gin_channels:
            self.cond_layer = weight_norm(nn.Conv1d(gin_channels, 2 * hidden * n_layers, 1))
        for index in range(n_layers):
            dilation = dilation_rate ** index
            self.in_layers.append(weight_norm(nn.Conv1d(hidden, 2 * hidden, kernel_size, dilation=dilation,
                                                        padding=get_padding(kernel_size, dilation))))
            out_channels = 2 * hidden if index < n_layers - 1 else hidden  # the last layer only skips
            self.res_skip_layers.append(weight_norm(nn.Conv1d(hidden, out_channels, 1)))

    def forward(self, x: Tensor, mask: Tensor, g: Optional[Tensor] = None) -> Tensor:
        output = torch.zeros_like(x)
        condition = self.cond_layer(g) if g is not None and hasattr(self, "cond_layer") else None
        for index, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            pre = in_layer(x)
            if condition is not None:
                pre = pre + condition[:, index * 2 * self.hidden:(index + 1) * 2 * self.hidden]
            tanh_part, sigmoid_part = pre.chunk(2, dim=1)
            acts = self.drop(torch.tanh(tanh_part) * torch.sigmoid(sigmoid_part))
            res_skip_acts = res_skip(acts)
            if index < self.n_layers - 1:
                x = (x + res_skip_acts[:, :self.hidden]) * mask
                output = output + res_skip_acts[:, self.hidden:]
            else:
                output = output + res_skip_acts
        return output * mask


class DilatedDepthSeparableConv(nn.Module):
    """Dilated depth-separable convolutions with GELU (the duration predictor's cheap wide context).

    x `[B, C, T]`, mask `[B, 1, T]`, g `[B, C, T or 1]` added first -> `[B, C, T]`.
    """

    def __init__(self, channels: int, kernel_size: int, n_layers: int, dropout: float = 0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for index in range(n_layers):
            dilation = kernel_size ** index
            self.convs_sep.append(nn.Conv1d(channels, channels, kernel_size, groups=channels, dilation=dilation,
                                            padding=get_padding(kernel_size, dilation)))
            self.convs_1x1.append(nn.Conv1d(channels, channels, 1))
            self.norms_1.append(LayerNorm(channels))
            self.norms_2.append(LayerNorm(channels))

    def forward(self, x: Tensor, mask: Tensor, g: Optional[Tensor] = None) -> Tensor:
        if g is not None:
            x = x + g
        for conv_sep, conv_1x1, norm_1, norm_2 in zip(self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2):
            y = F.gelu(norm_1(conv_sep(x * mask)))
            y = F.gelu(norm_2(conv_1x1(y)))
            x = x + self.drop(y)
        return x * mask
