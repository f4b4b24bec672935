"""Who speaks and how: global style tokens and an external speaker encoder the user provides.

Both turn a reference mel into one vector per utterance. The speaker table of a
multi-speaker corpus is a plain `nn.Embedding` and lives in the acoustic model.

External speaker encoder contract: a TorchScript (`torch.jit.save`) or ONNX file
whose single input is a log-mel `[1, n_mels, T]` (voicesmith's own mel:
`audio.mel_spectrogram`, natural log, floor log(1e-5)) and whose output is one
embedding `[1, D]` (or `[D]`). voicesmith L2-normalises the embedding.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voicesmith.audio import MEL_FLOOR
from voicesmith.errors import UserInputError
from voicesmith.models.modules import sequence_mask

SPEAKER_ENCODER_KEY = "model.speaker_encoder"
PROBE_FRAMES = 64


class ReferenceEncoder(nn.Module):
    """Tacotron-GST reference encoder: strided 2-D convolutions over the mel, then a GRU.

    No batch norm: its statistics would mix padding into every item. Padded frames
    are zeroed after each convolution and the GRU stops at each item's length.
    """

    def __init__(self, n_mels: int, out_dim: int, channels: tuple[int, ...] = (32, 32, 64, 64)):
        super().__init__()
        self.convs = nn.ModuleList()
        in_channels, bins = 1, n_mels
        for out_channels in channels:
            self.convs.append(nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1))
            in_channels, bins = out_channels, (bins + 1) // 2
        self.gru = nn.GRU(in_channels * bins, out_dim, batch_first=True)

    def forward(self, mel: Tensor, lengths: Tensor) -> Tensor:
        """`mel [B, n_mels, T]` (normalised, zero on padding) -> `[B, out_dim]`."""
        x = mel.unsqueeze(1)
        for conv in self.convs:
            x, lengths = F.relu(conv(x)), (lengths + 1) // 2
            x = x * sequence_mask(lengths, x.shape[-1])[:, None, None, :]
        x = x.flatten(1, 2).transpose(1, 2)  # [B, T', C * bins]
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, last_state = self.gru(packed)
        return last_state[-1]


class GlobalStyleTokens(nn.Module):
    """Global style tokens (Wang et al. 2018): a style vector as attention weights over learned tokens.

    Without a reference mel the weights are uniform: the average style of the corpus.
    """

    def __init__(self, n_mels: int, style_dim: int, n_tokens: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.reference_encoder = ReferenceEncoder(n_mels, style_dim)
        self.tokens = nn.Parameter(torch.randn(n_tokens, style_dim) * 0.5)
        self.query = nn.Linear(style_dim, style_dim)
        self.key = nn.Linear(style_dim, style_dim)
        self.value = nn.Linear(style_dim, style_dim)

    def forward(self, mel: Optional[Tensor], lengths: Optional[Tensor], batch_size: int) -> Tensor:
        """`[B, style_dim]` from `mel [B, n_mels, T]` (normalised, zero on padding), or the mean style."""
        n_tokens, style_dim = self.tokens.shape
        head_dim = style_dim // self.n_heads
        tokens = torch.tanh(self.tokens)
        keys = self.key(tokens).view(n_tokens, self.n_heads, head_dim).transpose(0, 1)  # [H, N, d]
        values = self.value(tokens).view(n_tokens, self.n_heads, head_dim).transpose(0, 1)
        if mel is None:
            weights = tokens.new_full((batch_size, self.n_heads, n_tokens), 1.0 / n_tokens)
        else:
            query = self.query(self.reference_encoder(mel, lengths)).view(-1, self.n_heads, head_dim)
            weights = torch.softmax(torch.einsum("bhd,hnd->bhn", query, keys) / math.sqrt(head_dim), dim=-1)
        return torch.einsum("bhn,hnd->bhd", weights, values).reshape(-1, style_dim)


class ExternalSpeakerEncoder(nn.Module):
    """A user-provided speaker encoder (TorchScript or ONNX), frozen or fine-tuned.

    Each item is embedded from its own valid frames only (one call per item), because
    a foreign model cannot be told where the padding starts.
    """

    def __init__(self, path: Path, n_mels: int, freeze: bool, needs_gradient: bool):
        super().__init__()
        self.path = path
        self.frozen = freeze
        self.module: Optional[nn.Module] = None
        self.session = None  # onnxruntime.InferenceSession; not a module, not in the state dict
        if not path.is_file():
            raise UserInputError(
                f"{SPEAKER_ENCODER_KEY}: the speaker encoder file {path} does not exist. Give the path of a "
                f"TorchScript (.pt) or ONNX (.onnx) speaker encoder (relative paths resolve against the config "
                f"file's folder), or remove the key to train without one.")
        if path.suffix.lower() == ".onnx":
            self._load_onnx(needs_gradient)
        else:
            self._load_torchscript()
        self.dim = self._probe(n_mels)

    def _load_onnx(self, needs_gradient: bool) -> None:
        if not self.frozen or needs_gradient:
            raise UserInputError(
                f"{SPEAKER_ENCODER_KEY}: {self.path} is an ONNX model, which can only be used frozen and gives no "
                f"gradients: set model.freeze_speaker_encoder=true and model.loss_weights.speaker=0 "
                f"(--freeze-speaker-encoder), or provide the encoder as TorchScript to fine-tune it or to train "
                f"with the contrastive speaker loss.")
        import onnxruntime

        try:
            self.session = onnxruntime.InferenceSession(str(self.path), providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises several unrelated types for a bad file
            raise UserInputError(f"{SPEAKER_ENCODER_KEY}: {self.path} is not a readable ONNX model: {exc}") from None

    def _load_torchscript(self) -> None:
        try:
            with warnings.catch_warnings():  # TorchScript is deprecated in torch, but it is the format users have
                warnings.filterwarnings("ignore", category=DeprecationWarning)
                self.module = torch.jit.load(str(self.path), map_location="cpu")
        except (RuntimeError, ValueError, OSError) as exc:
            raise UserInputError(
                f"{SPEAKER_ENCODER_KEY}: {self.path} is not a TorchScript model ({str(exc).splitlines()[0]}). "
                f"Save the encoder with torch.jit.save(torch.jit.script(encoder), path), or export it to ONNX."
            ) from None
        if self.frozen:
            for parameter in self.module.parameters():  # ScriptModules lack requires_grad_()
                parameter.requires_grad_(False)
            self.module.eval()

    def _probe(self, n_mels: int) -> int:
        """Run the encoder once on silence: checks the input/output contract before training starts."""
        silence = torch.full((n_mels, PROBE_FRAMES), MEL_FLOOR)
        try:
            with torch.no_grad():
                embedding = self.embed(silence)
        except Exception as exc:  # the foreign model may fail in any way; the user must hear which contract
            raise UserInputError(
                f"{SPEAKER_ENCODER_KEY}: {self.path} failed on a log-mel of shape [1, {n_mels}, {PROBE_FRAMES}] "
                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}). The encoder must take a "
                f"log-mel [1, n_mels, T] and return one embedding [1, D].") from None
        return embedding.numel()

    def train(self, mode: bool = True) -> "ExternalSpeakerEncoder":
        super().train(mode)
        if self.module is not None and self.frozen:
            self.module.eval()  # a frozen encoder keeps its dropout / norm statistics fixed
        return self

    def embed(self, mel: Tensor) -> Tensor:
        """`mel [n_mels, T]` (log-mel) -> `[D]`."""
        if self.session is not None:
            inputs = {self.session.get_inputs()[0].name: mel[None].detach().float().cpu().numpy()}
            return torch.from_numpy(self.session.run(None, inputs)[0]).reshape(-1).to(mel.device)
        return self.module(mel[None].float()).reshape(-1)

    def forward(self, mels: Tensor, lengths: Tensor) -> Tensor:
        """`mels [B, n_mels, T]`, `lengths [B]` -> unit-length embeddings `[B, D]`."""
        embeddings = [self.embed(mel[:, :length]) for mel, length in zip(mels, lengths.tolist())]
        return F.normalize(torch.stack(embeddings), dim=-1)


def contrastive_speaker_loss(predicted: Tensor, target: Tensor, temperature: float = 0.1) -> Tensor:
    """InfoNCE over the batch: the predicted mel's embedding must be closest to its own target's.

    With a batch of one there is nothing to contrast and the loss is 0.
    """
    similarity = F.normalize(predicted, dim=-1) @ F.normalize(target, dim=-1).T / temperature
    return F.cross_entropy(similarity, torch.arange(len(similarity), device=similarity.device))
