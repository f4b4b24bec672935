"""Normalising flows of VITS: the prior flow (mean-only residual couplings) and the duration flows.

Each flow maps `x [B, C, T]` forward with a log-determinant `[B]`, or back with `reverse=True`.
Log-determinants and spline arithmetic run in fp32 whatever the autocast dtype: they are sums over
many frames, and half precision loses the small terms (the duration loss drifts).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voicesmith.models.vits.layers import DilatedDepthSeparableConv, WaveNet

MIN_BIN_WIDTH = MIN_BIN_HEIGHT = MIN_DERIVATIVE = 1e-3


class Flip(nn.Module):
    """Reverse the channel order, so the next coupling transforms the other half."""

    def forward(self, x: Tensor, mask: Tensor, g: Optional[Tensor] = None, reverse: bool = False):
        x = torch.flip(x, [1])
        return x if reverse else (x, x.new_zeros(x.shape[0], dtype=torch.float32))


class ResidualCouplingLayer(nn.Module):
    """Shift one half of the channels by a WaveNet of the other half (mean-only: volume preserving)."""

    def __init__(self, channels: int, hidden: int, kernel_size: int, n_layers: int, gin_channels: int = 0):
        super().__init__()
        self.half = channels // 2
        self.pre = nn.Conv1d(self.half, hidden, 1)
        self.enc = WaveNet(hidden, kernel_size, 1, n_layers, gin_channels)
        self.post = nn.Conv1d(hidden, self.half, 1)
        nn.init.zeros_(self.post.weight)  # starts as the identity
        nn.init.zeros_(self.post.bias)

    def forward(self, x: Tensor, mask: Tensor, g: Optional[Tensor] = None, reverse: bool = False):
        x0, x1 = x.split(self.half, dim=1)
        shift = self.post(self.enc(self.pre(x0) * mask, mask, g)) * mask
        x1 = (x1 - shift) * mask if reverse else shift + x1 * mask
        y = torch.cat([x0, x1], dim=1)
        return y if reverse else (y, y.new_zeros(y.shape[0], dtype=torch.float32))


class ResidualCouplingBlock(nn.Module):
    """The prior flow f: posterior z `[B, inter, T]` <-> z_p, conditioned on the speaker g."""

    def __init__(self, channels: int, hidden: int, kernel_size: int, n_wavenet_layers: int, n_flows: int,
                 gin_channels: int = 0):
        super().__init__()
        self.flows = nn.ModuleList()
        for _ in range(n_flows):
            self.flows.append(ResidualCouplingLayer(channels, hidden, kernel_size, n_wavenet_layers, gin_channels))
            self.flows.append(Flip())

    def forward(self, x: Tensor, mask: Tensor, g: Optional[Tensor] = None, reverse: bool = False) -> Tensor:
        for flow in (reversed(self.flows) if reverse else self.flows):
            x = flow(x, mask, g=g, reverse=True) if reverse else flow(x, mask, g=g)[0]
        return x


# --- flows of the stochastic duration predictor ----------------------------------------------------

class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def forward(self, x: Tensor, mask: Tensor, g: Optional[Tensor] = None, reverse: bool = False):
        if reverse:
            return (x - self.m) * torch.exp(-self.logs) * mask
        y = (self.m + torch.exp(self.logs) * x) * mask
        return y, torch.sum(self.logs.float() * mask.float(), [1, 2])


class Log(nn.Module):
    def forward(self, x: Tensor, mask: Tensor, g: Optional[Tensor] = None, reverse: bool = False):
        if reverse:
            return torch.exp(x) * mask
        y = torch.log(torch.clamp_min(x, 1e-5)) * mask
        return y, torch.sum(-y.float(), [1, 2])


class ConvFlow(nn.Module):
    """A monotonic rational-quadratic spline of one half, its knots predicted from the other half."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int, n_layers: int,
                 num_bins: int = 10, tail_bound: float = 5.0):
        super().__init__()
        self.half, self.filter_channels = channels // 2, filter_channels
        self.num_bins, self.tail_bound = num_bins, tail_bound
        self.pre = nn.Conv1d(self.half, filter_channels, 1)
        self.convs = DilatedDepthSeparableConv(filter_channels, kernel_size, n_layers)
        self.proj = nn.Conv1d(filter_channels, self.half * (3 * num_bins - 1), 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: Tensor, mask: Tensor, g: Optional[Tensor] = None, reverse: bool = False):
        x0, x1 = x.split(self.half, dim=1)
        h = self.proj(self.convs(self.pre(x0), mask, g=g)) * mask
        batch, _, length = x0.shape
        h = h.reshape(batch, self.half, -1, length).permute(0, 1, 3, 2).float()  # [B, half, T, 3 bins - 1]
        scale = math.sqrt(self.filter_channels)
        widths, heights = h[..., :self.num_bins] / scale, h[..., self.num_bins:2 * self.num_bins] / scale
        derivatives = h[..., 2 * self.num_bins:]
        x1, logabsdet = rational_quadratic_spline(x1.float(), widths, heights, derivatives, reverse, self.tail_bound)
        y = torch.cat([x0, x1.to(x0.dtype)], dim=1) * mask
        if reverse:
            return y
        return y, torch.sum(logabsdet * mask.float(), [1, 2])


def rational_quadratic_spline(inputs: Tensor, widths: Tensor, heights: Tensor, derivatives: Tensor,
                              inverse: bool, tail_bound: float) -> tuple[Tensor, Tensor]:
    """Neural-spline-flow transform on [-B, B], identity (linear tails) outside; (outputs, log|det|).

    inputs `[...]`; widths, heights `[..., K]` unnormalised; derivatives `[..., K - 1]` at inner knots.
    Computed for every element on clamped inputs and then selected, which keeps the graph free of
    boolean indexing (ONNX-friendly) at the cost of a few wasted lanes.
    """
    inside = (inputs >= -tail_bound) & (inputs <= tail_bound)
    clamped = inputs.clamp(-tail_bound, tail_bound)
    edge = math.log(math.exp(1 - MIN_DERIVATIVE) - 1)  # softplus(edge) + min = 1: slope 1 at the tails
    derivatives = F.pad(derivatives, (1, 1), value=edge)
    outputs, logabsdet = _spline_inside(clamped, widths, heights, derivatives, inverse, tail_bound)
    return torch.where(inside, outputs, inputs), torch.where(inside, logabsdet, torch.zeros_like(logabsdet))


def _knots(unnormalized: Tensor, minimum: float, bound: float) -> tuple[Tensor, Tensor]:
    """Bin sizes (softmax, at least `minimum`) and their cumulative knots spanning [-bound, bound]."""
    num_bins = unnormalized.shape[-1]
    sizes = minimum + (1 - minimum * num_bins) * torch.softmax(unnormalized, dim=-1)
    knots = F.pad(torch.cumsum(sizes, dim=-1), (1, 0), value=0.0)
    knots = 2 * bound * knots - bound
    knots = torch.cat([torch.full_like(knots[..., :1], -bound), knots[..., 1:-1],
                       torch.full_like(knots[..., :1], bound)], dim=-1)
    return knots[..., 1:] - knots[..., :-1], knots


def _spline_inside(inputs: Tensor, unnormalized_widths: Tensor, unnormalized_heights: Tensor,
                   unnormalized_derivatives: Tensor, inverse: bool, bound: float) -> tuple[Tensor, Tensor]:
    widths, cumwidths = _knots(unnormalized_widths, MIN_BIN_WIDTH, bound)
    heights, cumheights = _knots(unnormalized_heights, MIN_BIN_HEIGHT, bound)
    derivatives = MIN_DERIVATIVE + F.softplus(unnormalized_derivatives)
    locations = cumheights if inverse else cumwidths
    upper = torch.cat([locations[..., :-1], locations[..., -1:] + 1e-6], dim=-1)
    bin_index = (torch.sum((inputs[..., None] >= upper).long(), dim=-1) - 1).clamp(0, widths.shape[-1] - 1)[..., None]

    def pick(values: Tensor) -> Tensor:
        return values.gather(-1, bin_index)[..., 0]

    x_low, bin_width = pick(cumwidths), pick(widths)
    y_low, bin_height = pick(cumheights), pick(heights)
    delta = bin_height / bin_width
    d_low, d_high = pick(derivatives), pick(derivatives[..., 1:])
    curvature = d_low + d_high - 2 * delta
    if inverse:
        offset = inputs - y_low
        a = offset * curvature + bin_height * (delta - d_low)
        b = bin_height * d_low - offset * curvature
        c = -delta * offset
        discriminant = (b.square() - 4 * a * c).clamp_min(0)
        theta = (2 * c) / (-b - torch.sqrt(discriminant))
        outputs = theta * bin_width + x_low
    else:
        theta = (inputs - x_low) / bin_width
        outputs = y_low + bin_height * (delta * theta.square() + d_low * theta * (1 - theta)) / (
            delta + curvature * theta * (1 - theta))
    theta_one_minus = theta * (1 - theta)
    denominator = delta + curvature * theta_one_minus
    numerator = delta.square() * (d_high * theta.square() + 2 * delta * theta_one_minus + d_low * (1 - theta).square())
    logabsdet = torch.log(numerator) - 2 * torch.log(denominator)
    return outputs, (-logabsdet if inverse else logabsdet)
