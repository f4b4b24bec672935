"""A Piper voice published as ONNX (`NAME.onnx` + `NAME.onnx.json`): weights from the graph's initializers.

The inference graph holds the text encoder, the duration predictor (minus the parts only training
uses), the flow and the decoder. Its initializers are mostly named after the modules
(`enc_p.encoder.attn_layers.0.conv_q.weight`); those the tracer left anonymous (`onnx::Conv_8168`,
or the embedding renamed `sid`) are named by the node that consumes them: the node's scope
(`/flow/flows.6/enc/in_layers.0/Conv`) is the module, the op and input position the parameter.
Constants folded at export are undone where voicesmith knows the fold: the duration flow's
`exp(-logs)`. Weight norm was removed at export; `mapping.load_into` restores the parametrization
with the same effective weight. The decoder's strides and dilations come from the nodes' attributes.

What the graph cannot hold starts fresh, and the report says so: the posterior encoder (`enc_q`),
the duration predictor's training-only posterior flows, and the discriminator.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from voicesmith.errors import UserInputError
from voicesmith.importers.piper_voice import architecture, read_voice_config, resblock_type, voice_sections
from voicesmith.importers.voice_run import VoiceSource
from voicesmith.piper_config import config_path_for

PARAMETER_NAME = re.compile(r"^[A-Za-z_]\w*(\.\w+)+$")
# (op, input position) -> parameter of the consuming module
CONSUMED_AS = {("Conv", 1): "weight", ("Conv", 2): "bias", ("ConvTranspose", 1): "weight",
               ("ConvTranspose", 2): "bias", ("Gather", 0): "weight"}
FOLDED_EXP = re.compile(r"^/(?P<scope>.+)/Exp(_\d+)?_output_0$")  # exp(-logs) of an ElementwiseAffine
FRESH = {"enc_q.": "the posterior encoder is only used in training, so ONNX voices do not contain it",
         "dp.post_": "the duration predictor's posterior flows are only used in training",
         "dp.flows.1.": "the duration predictor's first spline flow is skipped at inference, so the graph lacks it",
         "discriminator.": "a published voice has no discriminator; it starts fresh"}


def read_piper_onnx(path: Path) -> VoiceSource:
    import onnx

    path = Path(path)
    voice, preset = read_voice_config(config_path_for(path))
    try:
        graph = onnx.load(str(path)).graph
    except Exception as exc:  # onnx raises DecodeError, ValueError, OSError ... for a damaged file
        raise UserInputError(f"{path} is not a readable ONNX model ({type(exc).__name__}: {exc}). "
                             f"Use the .onnx file that came with the voice.") from None
    tensors, constants = graph_weights(graph)
    model = architecture(tensors, {"resblock": resblock_type(tensors), **decoder_attributes(graph)})
    notes = [f"{len(constants)} graph constants (shapes, scalars) are not weights and were left aside."]
    return VoiceSource(kind="Piper ONNX", path=path, tensors=tensors, preset=preset,
                       sections=voice_sections(voice, model), symbols=voice.symbols,
                       n_speakers=voice.num_speakers, speakers=voice.speaker_id_map, fresh=dict(FRESH), notes=notes)


def graph_weights(graph) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Initializers under module names, and the names of those that are graph constants instead."""
    from onnx import numpy_helper

    consumers = _consumers(graph)
    weights: dict[str, torch.Tensor] = {}
    constants: list[str] = []
    for initializer in graph.initializer:
        value = numpy_helper.to_array(initializer)
        name = _parameter_name(initializer.name, consumers.get(initializer.name, []))
        if name is None and (match := FOLDED_EXP.match(initializer.name)):
            name, value = match["scope"].replace("/", ".") + ".logs", -np.log(value)
        if name is None or value.dtype.kind != "f":
            constants.append(initializer.name)
            continue
        weights[name] = torch.from_numpy(np.array(value, dtype=np.float32))
    return weights, constants


def _consumers(graph) -> dict[str, list[tuple[str, str, int]]]:
    found: dict[str, list[tuple[str, str, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            found.setdefault(name, []).append((node.op_type, node.name, position))
    return found


def _parameter_name(name: str, consumers: list[tuple[str, str, int]]) -> Optional[str]:
    """The module parameter an initializer holds: its own name when it is one, else its consumer's."""
    if PARAMETER_NAME.match(name):
        return name
    for op, node_name, position in consumers:
        parameter = CONSUMED_AS.get((op, position))
        if parameter and node_name.startswith("/") and node_name.count("/") >= 2:
            return node_name[1:].rsplit("/", 1)[0].replace("/", ".") + "." + parameter
    return None


def decoder_attributes(graph) -> dict[str, Any]:
    """Upsample strides and residual-block kernels/dilations of the decoder, from the nodes' attributes."""
    from onnx import helper

    strides: dict[int, int] = {}
    dilations: dict[tuple[int, int], int] = {}
    kernels: dict[int, int] = {}
    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (match := re.match(r"^/dec/ups\.(\d+)/ConvTranspose$", node.name)):
            strides[int(match[1])] = int(attributes["strides"][0])
        elif (match := re.match(r"^/dec/resblocks\.(\d+)/convs1?\.(\d+)/Conv$", node.name)):
            dilations[(int(match[1]), int(match[2]))] = int(attributes.get("dilations", [1])[0])
            kernels[int(match[1])] = int(attributes["kernel_shape"][0])
    if not strides or not kernels:
        raise UserInputError("The ONNX graph has no decoder nodes named like Piper's (/dec/ups.N/ConvTranspose, "
                             "/dec/resblocks.N/convs.M/Conv); it is not a Piper VITS voice voicesmith can import.")
    n_kernels = max(1, len(kernels) // len(strides))
    blocks = sorted(kernels)[:n_kernels]
    return {"upsample_rates": [strides[i] for i in sorted(strides)],
            "resblock_kernel_sizes": [kernels[b] for b in blocks],
            "resblock_dilation_sizes": [[dilations[(b, j)] for j in sorted(j for (i, j) in dilations if i == b)]
                                        for b in blocks]}
