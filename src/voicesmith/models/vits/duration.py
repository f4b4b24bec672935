"""Duration predictors of VITS: stochastic (a flow over durations, trained by its likelihood) and deterministic.

Both read the text encoder's states detached: the duration loss must not shape the text
representation the prior and the decoder rely on. Both take `h [B, hidden, T]`, `mask [B, 1, T]`
and the speaker `g [B, gin, 1]`.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voicesmith.models.gan.generator import get_padding
from voicesmith.models.vits.flow import ConvFlow, ElementwiseAffine, Flip, Log
from voicesmith.models.vits.layers import DilatedDepthSeparableConv, LayerNorm

LOG_2PI = math.log(2 * math.pi)


def _flow_stack(filter_channels: int, kernel_size: int, n_flows: int) -> nn.ModuleList:
    flows = nn.ModuleList([ElementwiseAffine(2)])
    for _ in range(n_flows):
        flows.append(ConvFlow(2, filter_channels, kernel_size, n_layers=3))
        flows.append(Flip())
    return flows


class StochasticDurationPredictor(nn.Module):
    """log-durations as a sample of a flow conditioned on the text; trained by variational dequantisation.

    forward: durations w `[B, 1, T]` (frames) -> negative log-likelihood bound `[B]` (fp32).
    infer: noise `noise_w` -> log-durations `[B, 1, T]`.
    """

    def __init__(self, in_channels: int, filter_channels: int, kernel_size: int = 3, dropout: float = 0.5,
                 n_flows: int = 4, gin_channels: int = 0):
        super().__init__()
        self.log_flow = Log()
        self.flows = _flow_stack(filter_channels, kernel_size, n_flows)
        self.post_pre = nn.Conv1d(1, filter_channels, 1)
        self.post_proj = nn.Conv1d(filter_channels, filter_channels, 1)
        self.post_convs = DilatedDepthSeparableConv(filter_channels, kernel_size, 3, dropout)
        self.post_flows = _flow_stack(filter_channels, kernel_size, 4)
        self.pre = nn.Conv1d(in_channels, filter_channels, 1)
        self.proj = nn.Conv1d(filter_channels, filter_channels, 1)
        self.convs = DilatedDepthSeparableConv(filter_channels, kernel_size, 3, dropout)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, filter_channels, 1)

    def _condition(self, h: Tensor, mask: Tensor, g: Optional[Tensor]) -> Tensor:
        x = self.pre(h.detach())
        if g is not None and hasattr(self, "cond"):
            x = x + self.cond(g.detach())
        return self.proj(self.convs(x, mask)) * mask

    def forward(self, h: Tensor, mask: Tensor, durations: Tensor, g: Optional[Tensor] = None) -> Tensor:
        x = self._condition(h, mask, g)
        h_w = self.post_proj(self.post_convs(self.post_pre(durations), mask)) * mask
        noise = torch.randn(durations.shape[0], 2, durations.shape[2], device=h.device, dtype=h.dtype) * mask
        # q(u, nu | w): dequantisation noise u in (0, 1) and an extra channel nu
        z_q, logdet_q = noise, torch.zeros(h.shape[0], device=h.device, dtype=torch.float32)
        for flow in self.post_flows:
            z_q, logdet = flow(z_q, mask, g=x + h_w)
            logdet_q = logdet_q + logdet
        z_u, z1 = z_q.split(1, dim=1)
        u = torch.sigmoid(z_u) * mask
        z0 = (durations - u) * mask
        logdet_q = logdet_q + torch.sum((F.logsigmoid(z_u.float()) + F.logsigmoid(-z_u.float())) * mask, [1, 2])
        log_q = torch.sum(-0.5 * (LOG_2PI + noise.float().square()) * mask, [1, 2]) - logdet_q
        z0, logdet_total = self.log_flow(z0, mask)
        z = torch.cat([z0, z1], dim=1)
        for flow in self.flows:
            z, logdet = flow(z, mask, g=x)
            logdet_total = logdet_total + logdet
        nll = torch.sum(0.5 * (LOG_2PI + z.float().square()) * mask, [1, 2]) - logdet_total
        return nll + log_q

    def infer(self, h: Tensor, mask: Tensor, g: Optional[Tensor] = None, noise_w: float | Tensor = 0.8) -> Tensor:
        x = self._condition(h, mask, g)
        flows = list(reversed(self.flows))
        flows = flows[:-2] + [flows[-1]]  # the first ConvFlow only acts on the unused channel: skip it
        z = torch.randn(h.shape[0], 2, h.shape[2], device=h.device, dtype=h.dtype) * noise_w
        for flow in flows:
            z = flow(z, mask, g=x, reverse=True)
        return z[:, :1]


class DurationPredictor(nn.Module):
    """Two convolutions and a projection to log-durations `[B, 1, T]`; trained by MSE in the log domain."""

    def __init__(self, in_channels: int, filter_channels: int, kernel_size: int = 3, dropout: float = 0.5,
                 gin_channels: int = 0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.conv_1 = nn.Conv1d(in_channels, filter_channels, kernel_size, padding=get_padding(kernel_size))
        self.norm_1 = LayerNorm(filter_channels)
        self.conv_2 = nn.Conv1d(filter_channels, filter_channels, kernel_size, padding=get_padding(kernel_size))
        self.norm_2 = LayerNorm(filter_channels)
        self.proj = nn.Conv1d(filter_channels, 1, 1)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, in_channels, 1)

    def infer(self, h: Tensor, mask: Tensor, g: Optional[Tensor] = None, noise_w: float | Tensor = 0.0) -> Tensor:
        x = h.detach()
        if g is not None and hasattr(self, "cond"):
            x = x + self.cond(g.detach())
        x = self.drop(self.norm_1(torch.relu(self.conv_1(x * mask))))
        x = self.drop(self.norm_2(torch.relu(self.conv_2(x * mask))))
        return self.proj(x * mask) * mask

    def forward(self, h: Tensor, mask: Tensor, durations: Tensor, g: Optional[Tensor] = None) -> Tensor:
        """Squared error of log-durations summed per item `[B]` (the caller divides by the phoneme count)."""
        target = torch.log(durations.float() + 1e-6) * mask
        return torch.sum((self.infer(h, mask, g).float() - target).square(), [1, 2])
