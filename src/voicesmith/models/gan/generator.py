"""HiFi-GAN generator (mel or latent frames -> waveform), shared by VITS (`dec`) and the vocoders.

Module and parameter names follow the original HiFi-GAN / VITS / Piper code (`conv_pre`, `ups`,
`resblocks.{i}.convs1`, `conv_post`, `cond`), so published checkpoints map onto it by name.
Weight norm is torch's parametrization (`parametrizations.weight.original0/original1`, the old
`weight_g/weight_v`); `remove_weight_norm()` folds it away before ONNX export.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

LRELU_SLOPE = 0.1


def get_padding(kernel_size: int, dilation: int = 1) -> int:
    """'Same' padding of a dilated convolution with an odd kernel."""
    return (kernel_size * dilation - dilation) // 2


def normal_weight_norm(conv: nn.Module, std: float = 0.01) -> nn.Module:
    """HiFi-GAN's init (weights ~ N(0, std)) applied before weight norm, so that it really takes effect."""
    nn.init.normal_(conv.weight, 0.0, std)
    return weight_norm(conv)


def strip_weight_norm(module: nn.Module) -> None:
    """Fold every weight-norm parametrization under `module` into a plain `weight`."""
    for child in module.modules():
        if parametrize.is_parametrized(child, "weight"):
            parametrize.remove_parametrizations(child, "weight", leave_parametrized=True)


def _dilated_conv(channels: int, kernel_size: int, dilation: int) -> nn.Module:
    return normal_weight_norm(nn.Conv1d(channels, channels, kernel_size, 1, dilation=dilation,
                                        padding=get_padding(kernel_size, dilation)))


def _masked(x: Tensor, x_mask: Optional[Tensor]) -> Tensor:
    return x if x_mask is None else x * x_mask


class ResBlock1(nn.Module):
    """HiFi-GAN V1 block (Piper high, MMS): per dilation, a dilated and a plain conv, with a residual.

    `x: [B, C, T]`, optional `x_mask: [B, 1, T]` -> `[B, C, T]`.
    """

    def __init__(self, channels: int, kernel_size: int = 3, dilation: Sequence[int] = (1, 3, 5)):
        super().__init__()
        self.convs1 = nn.ModuleList(_dilated_conv(channels, kernel_size, d) for d in dilation)
        self.convs2 = nn.ModuleList(_dilated_conv(channels, kernel_size, 1) for _ in dilation)

    def forward(self, x: Tensor, x_mask: Optional[Tensor] = None) -> Tensor:
        for conv1, conv2 in zip(self.convs1, self.convs2):
            xt = conv1(_masked(F.leaky_relu(x, LRELU_SLOPE), x_mask))
            xt = conv2(_masked(F.leaky_relu(xt, LRELU_SLOPE, inplace=True), x_mask))  # a conv's output
            x = xt + x
        return _masked(x, x_mask)

    def remove_weight_norm(self) -> None:
        strip_weight_norm(self)


class ResBlock2(nn.Module):
    """HiFi-GAN V3 block (Piper x-low/low/medium): one dilated conv per dilation, with a residual.

    `x: [B, C, T]`, optional `x_mask: [B, 1, T]` -> `[B, C, T]`.
    """

    def __init__(self, channels: int, kernel_size: int = 3, dilation: Sequence[int] = (1, 3)):
        super().__init__()
        self.convs = nn.ModuleList(_dilated_conv(channels, kernel_size, d) for d in dilation)

    def forward(self, x: Tensor, x_mask: Optional[Tensor] = None) -> Tensor:
        for conv in self.convs:
            x = conv(_masked(F.leaky_relu(x, LRELU_SLOPE), x_mask)) + x
        return _masked(x, x_mask)

    def remove_weight_norm(self) -> None:
        strip_weight_norm(self)


RESBLOCKS = {"1": ResBlock1, "2": ResBlock2}


class HifiGanGenerator(nn.Module):
    """Transposed-conv upsampling with multi-receptive-field residual blocks: frames -> waveform.

    `forward(x: [B, in_channels, T], g: [B, gin_channels, 1] or None) -> [B, 1, T * hop_length]` in [-1, 1].
    """

    def __init__(self, in_channels: int, resblock: str, resblock_kernel_sizes: Sequence[int],
                 resblock_dilation_sizes: Sequence[Sequence[int]], upsample_rates: Sequence[int],
                 upsample_initial_channel: int, upsample_kernel_sizes: Sequence[int], gin_channels: int = 0):
        super().__init__()
        if str(resblock) not in RESBLOCKS:
            raise ValueError(f"resblock must be '1' or '2', got {resblock!r}")
        if len(upsample_rates) != len(upsample_kernel_sizes):
            raise ValueError(f"upsample_rates {list(upsample_rates)} and upsample_kernel_sizes "
                             f"{list(upsample_kernel_sizes)} must have the same length")
        self.num_kernels = len(resblock_kernel_sizes)
        self.num_upsamples = len(upsample_rates)
        self.upsample_rates = tuple(int(u) for u in upsample_rates)
        self.conv_pre = nn.Conv1d(in_channels, upsample_initial_channel, 7, 1, padding=3)
        block = RESBLOCKS[str(resblock)]
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        channels = upsample_initial_channel
        for i, (rate, kernel) in enumerate(zip(upsample_rates, upsample_kernel_sizes)):
            channels = upsample_initial_channel // (2 ** (i + 1))
            self.ups.append(normal_weight_norm(nn.ConvTranspose1d(
                upsample_initial_channel // (2 ** i), channels, kernel, rate, padding=(kernel - rate) // 2)))
            for kernel_size, dilation in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(block(channels, kernel_size, dilation))
        self.conv_post = nn.Conv1d(channels, 1, 7, 1, padding=3, bias=False)
        if gin_channels > 0:
            self.cond = nn.Conv1d(gin_channels, upsample_initial_channel, 1)

    @property
    def hop_length(self) -> int:
        """Output samples per input frame."""
        return math.prod(self.upsample_rates)

    def forward(self, x: Tensor, g: Optional[Tensor] = None) -> Tensor:
        x = self.conv_pre(x)
        if g is not None:
            x = x + self.cond(g)
        for i, upsample in enumerate(self.ups):
            x = upsample(F.leaky_relu(x, LRELU_SLOPE, inplace=True))  # a conv's or a sum's output
            blocks = self.resblocks[i * self.num_kernels:(i + 1) * self.num_kernels]
            x = sum(block(x) for block in blocks) / self.num_kernels
        x = self.conv_post(F.leaky_relu(x, inplace=True))  # default slope 0.01 here, as in HiFi-GAN and VITS
        return torch.tanh(x)

    def remove_weight_norm(self) -> None:
        strip_weight_norm(self)
