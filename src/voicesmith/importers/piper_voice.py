"""What Piper's checkpoint and ONNX importers share: the voice config, and the architecture read from
the weights themselves (layer counts and widths from tensor shapes), so that a voice of any quality
level, or a custom one, rebuilds with exactly its own sizes.

The decoder's strides and dilations are not in any weight: the checkpoint's hyper-parameters or the
ONNX graph's node attributes give them (`decoder` argument).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

from torch import Tensor

from voicesmith.errors import UserInputError
from voicesmith.piper_config import PiperConfig, read_piper_config

QUALITY_PRESETS = {"x_low": "x-low", "low": "low", "medium": "medium", "high": "high"}


def read_voice_config(path: Path) -> tuple[PiperConfig, str]:
    """The checked voice config, and the vits preset of its quality level (medium when it names none)."""
    config = read_piper_config(path)
    quality = json.loads(Path(path).read_text(encoding="utf-8")).get("audio", {}).get("quality", "medium")
    return config, QUALITY_PRESETS.get(str(quality), "medium")


def voice_sections(config: PiperConfig, architecture: dict[str, Any], audio: Mapping[str, Any] = ()) -> dict:
    """Config sections of the imported run: model sizes, audio, text and default scales of the voice."""
    return {"model": architecture,
            "audio": {"sample_rate": config.sample_rate, **dict(audio)},
            "text": config.text_config.model_dump(mode="json"),
            "inference": {"noise_scale": config.noise_scale, "length_scale": config.length_scale,
                          "noise_w": config.noise_w}}


def architecture(tensors: Mapping[str, Tensor], decoder: Mapping[str, Any]) -> dict[str, Any]:
    """model.* values of a VITS generator under voicesmith's names, read from its tensor shapes."""
    hidden = _shape(tensors, "enc_p.emb.weight")[1]
    head_dim = _shape(tensors, "enc_p.encoder.attn_layers.0.emb_rel_k")[2]
    ffn = _shape(tensors, "enc_p.encoder.ffn_layers.0.conv_1.weight")
    stochastic = "dp.flows.0.m" in tensors
    model = dict(hidden_channels=hidden, inter_channels=_shape(tensors, "enc_p.proj.weight")[0] // 2,
                 encoder_ffn_channels=ffn[0], encoder_kernel_size=ffn[2], encoder_heads=hidden // head_dim,
                 encoder_layers=_count(tensors, r"enc_p\.encoder\.attn_layers\.(\d+)\."),
                 stochastic_duration=stochastic,
                 duration_predictor_channels=_shape(tensors, "dp.pre.weight" if stochastic else "dp.conv_1.weight")[0],
                 flow_layers=_count(tensors, r"flow\.flows\.(\d+)\."),
                 flow_wavenet_layers=_count(tensors, r"flow\.flows\.0\.enc\.in_layers\.(\d+)\."),
                 flow_kernel_size=_kernel(tensors, "flow.flows.0.enc.in_layers.0"),
                 upsample_initial_channel=_shape(tensors, "dec.conv_pre.weight")[0],
                 upsample_kernel_sizes=[_kernel(tensors, f"dec.ups.{i}")
                                        for i in range(_count(tensors, r"dec\.ups\.(\d+)\."))],
                 **decoder)
    if any(name.startswith("enc_q.") for name in tensors):  # absent from ONNX voices: the preset's then
        model["posterior_layers"] = _count(tensors, r"enc_q\.enc\.in_layers\.(\d+)\.")
        model["posterior_kernel_size"] = _kernel(tensors, "enc_q.enc.in_layers.0")
    if "emb_g.weight" in tensors:
        model["speaker_embedding_dim"] = _shape(tensors, "emb_g.weight")[1]
    return model


def resblock_type(tensors: Mapping[str, Tensor]) -> str:
    """"1" (two convolutions per dilation: convs1/convs2) or "2" (one: convs)."""
    return "1" if any(".convs1." in name for name in tensors if name.startswith("dec.resblocks.")) else "2"


def _shape(tensors: Mapping[str, Tensor], name: str) -> tuple[int, ...]:
    for candidate in (name, name.replace(".weight", ".weight_v")):
        if candidate in tensors:
            return tuple(tensors[candidate].shape)
    raise UserInputError(f"The voice has no tensor {name}: it is not a VITS/Piper voice, or its file is damaged.")


def _kernel(tensors: Mapping[str, Tensor], module: str) -> int:
    return _shape(tensors, f"{module}.weight")[2]


def _count(tensors: Mapping[str, Tensor], pattern: str) -> int:
    """How many distinct layer indices the pattern's group takes (indices may skip, as Flip layers do)."""
    regex = re.compile(pattern)
    indices = {match.group(1) for name in tensors if (match := regex.match(name))}
    return len(indices)
