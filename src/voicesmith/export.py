"""`voicesmith export`: a trained VITS voice -> `VOICE.onnx` + `VOICE.onnx.json` in Piper's format.

The graph has Piper's interface, so the Piper runtime (Home Assistant, Wyoming, screen readers)
speaks it unchanged: inputs `input` int64 [batch, phonemes], `input_lengths` int64 [batch],
`scales` float32 [3] = [noise_scale, length_scale, noise_w], and `sid` int64 [batch] only for
multi-speaker voices; the audio float32 [batch, 1, samples] is the first output. An acoustic voice
exports together with its trained vocoder as one graph with the same interface (it is deterministic:
the noise scales are ignored, the length scale is honoured). Weight norm is
folded into the weights, batch and phoneme axes are dynamic, opset 15, the TorchScript exporter
(`dynamo=False`: the dynamo one fails on the data-dependent output length). The graph keeps
exactly one `Ceil` (the duration rounding), which alignment tools mark as a second output.

Every export is checked before it is called done: `onnx.checker`, the single Ceil, and one
sentence through onnxruntime against the PyTorch model at noise 0 (deterministic), whose max
absolute difference is reported. The files appear only when all of that passed.
"""

from __future__ import annotations

import io
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from voicesmith.checkpoint import load_checkpoint, load_exported, model_state
from voicesmith.config import VoiceConfig, validate_config
from voicesmith.errors import RunFailed, UserInputError
from voicesmith.onnx_voice import ONNX_SUFFIX, OnnxVoice
from voicesmith.piper_config import config_path_for, piper_config_dict
from voicesmith.text import SymbolTable, TextFrontend

OPSET = 15
TRACE_IDS = 50  # Piper's exporter traces on 50 random ids; any length works, the axes are dynamic
CHECK_TEXT = "The quick brown fox jumps over the lazy dog."
TOLERANCE = 1e-3
"""Largest |onnxruntime - PyTorch| sample difference at noise 0 that counts as the same voice (float
rounding of a different kernel order stays far below; a wrong graph is off by far more)."""
EXPORTABLE = ("vits", "acoustic")


@dataclass
class ExportReport:
    onnx_path: Path
    config_path: Path
    megabytes: float
    seconds: float  # export, checks and verification together
    max_abs_diff: float  # onnxruntime against PyTorch at noise 0, one sentence
    samples_compared: int
    num_speakers: int

    def summary(self) -> str:
        return (f"Wrote {self.onnx_path} ({self.megabytes:.1f} MB) and {self.config_path} in {self.seconds:.1f} s; "
                f"onnxruntime matches PyTorch at noise 0 within {self.max_abs_diff:.2e} (max abs difference over "
                f"{self.samples_compared} samples; tolerance {TOLERANCE:g}).")


class AcousticWithVocoder(nn.Module):
    """An acoustic model and its vocoder's generator as one text -> waveform module, with VITS's `infer`."""

    def __init__(self, acoustic: nn.Module, generator: nn.Module) -> None:
        super().__init__()
        self.acoustic, self.generator = acoustic, generator

    def infer(self, phoneme_ids: Tensor, phoneme_lengths: Tensor, speaker_ids: Optional[Tensor] = None,
              noise_scale: Tensor | float = 0.0, length_scale: Tensor | float = 1.0,
              noise_w: Tensor | float = 0.0) -> dict[str, Tensor]:
        """ids `[B, T]` -> {"audio": `[B, 1, frames * hop]`, "durations": `[B, T]`}; the noise scales do nothing."""
        output = self.acoustic.infer(phoneme_ids, phoneme_lengths, speaker_ids, length_scale=length_scale)
        return {"audio": self.generator(output["mel"]), "durations": output["durations"]}


class PiperGraph(nn.Module):
    """Piper's graph interface around a VITS model: `forward(input, input_lengths, scales, sid=None)`.

    input `[B, T]` ids, input_lengths `[B]`, scales `[3]`, sid `[B]` -> audio `[B, 1, samples]`.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input: Tensor, input_lengths: Tensor, scales: Tensor, sid: Optional[Tensor] = None) -> Tensor:
        output = self.model.infer(input, input_lengths, sid, noise_scale=scales[0], length_scale=scales[1],
                                  noise_w=scales[2])
        return output["audio"]


@dataclass
class LoadedVoice:
    model: nn.Module
    config: VoiceConfig
    symbols: SymbolTable
    speakers: dict[str, int]
    n_speakers: int
    block: dict


def export_command(source: Path, out: Path, vocoder: Optional[str] = None) -> int:
    """`voicesmith export CHECKPOINT|RUN_DIR -o VOICE.onnx`: print what was written and how well it matches."""
    report = export_voice(Path(source), Path(out), vocoder)
    print(report.summary())
    print(f"Speak it: voicesmith synth {report.onnx_path} \"Hello there.\" -o hello.wav\n"
          f"   or, with the Piper runtime: echo \"Hello there.\" | piper -m {report.onnx_path} -f hello.wav")
    return 0


def export_voice(source: Path, out: Path, vocoder: Optional[str] = None) -> ExportReport:
    """Export, check and verify; the two files are written only when every check passed."""
    if out.suffix.lower() != ONNX_SUFFIX:
        raise UserInputError(f"-o {out}: name the voice NAME.onnx (its config is written beside it as NAME.onnx.json).")
    started = time.perf_counter()
    voice = load_voice(source, vocoder)
    graph = PiperGraph(voice.model).eval()
    onnx_bytes = trace_to_onnx(graph, len(voice.symbols), voice.n_speakers)
    check_graph_structure(onnx_bytes, expected_ceils=1 if voice.config.model.type == "vits" else 0)
    config = piper_config_dict(symbols=voice.symbols, speakers=voice.speakers, num_speakers=voice.n_speakers,
                               sample_rate=voice.config.audio.sample_rate, language=voice.config.text.language,
                               hop_length=voice.config.audio.hop_length, **voice.config.inference.model_dump(),
                               voicesmith={"config": voice.config.to_dict(), "model_type": voice.config.model.type,
                                           "global_step": voice.block.get("global_step"), "source": str(source)})
    max_diff, n_samples = write_verified(out, onnx_bytes, config, voice)
    return ExportReport(onnx_path=out, config_path=config_path_for(out), megabytes=len(onnx_bytes) / 2**20,
                        seconds=time.perf_counter() - started, max_abs_diff=max_diff, samples_compared=n_samples,
                        num_speakers=voice.n_speakers)


def write_verified(out: Path, onnx_bytes: bytes, config: dict, voice: LoadedVoice) -> tuple[float, int]:
    """Write the pair beside `out` under a staging name, verify it there, then rename both into place:
    a failed verification leaves no new file behind (and a previous export of the same name untouched)."""
    staging = out.with_name(f".{out.stem}.staging-{os.getpid()}{ONNX_SUFFIX}")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.write_bytes(onnx_bytes)
        config_path_for(staging).write_text(json.dumps(config, ensure_ascii=False, indent=1), encoding="utf-8")
        result = verify_against_pytorch(staging, voice)
        os.replace(staging, out)
        os.replace(config_path_for(staging), config_path_for(out))
        return result
    finally:
        staging.unlink(missing_ok=True)
        config_path_for(staging).unlink(missing_ok=True)


def load_voice(source: Path, vocoder: Optional[str] = None) -> LoadedVoice:
    """The text -> waveform model of a checkpoint, run directory or exported-weights folder, ready to trace:
    a VITS model, or an acoustic model joined with its trained vocoder."""
    from voicesmith.inference import find_model_file, run_dir_of, speakers_in_weights
    from voicesmith.models import build_model

    path = find_model_file(source)
    ckpt = load_exported(path) if path.is_dir() else load_checkpoint(path)
    block = ckpt["voicesmith"]
    config = validate_config(block["config"], source=f"the config stored in {path}")
    config._path = run_dir_of(path) / "config.yaml"  # the run's own vocoder is found from there
    model_type = block.get("model_type", config.model.type)
    if model_type not in EXPORTABLE:
        raise UserInputError(f"{path} holds a {model_type!r} model; Piper's format holds voices that read text: "
                             f"a VITS voice (`voicesmith init DATASET RUN_DIR --model vits`) or an acoustic voice "
                             f"with its trained vocoder.")
    state, symbols = model_state(ckpt), SymbolTable.from_dict(block["symbols"], source=f"symbol table in {path}")
    n_speakers = speakers_in_weights(state)
    model = build_model(config.model, len(symbols), config.audio.n_mels, n_speakers, config.resolve, config.audio)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise UserInputError(f"The weights in {path} do not fit the model its own config describes "
                             f"({str(error).splitlines()[0]}); use another checkpoint.") from None
    model.eval()
    if model_type == "acoustic":
        model = AcousticWithVocoder(model, _trained_vocoder(vocoder, config, path)).eval()
    else:
        model.remove_weight_norm()
    return LoadedVoice(model, config, symbols, dict(block.get("speakers", {})), n_speakers, block)


def _trained_vocoder(choice: Optional[str], config: VoiceConfig, path: Path) -> nn.Module:
    """The generator (weight norm folded) of the voice's vocoder; Griffin-Lim has no ONNX graph."""
    from voicesmith.vocoding import GRIFFIN_LIM, select_vocoder

    vocoder = None if choice == GRIFFIN_LIM else select_vocoder(choice, config, str(path))
    if vocoder is None:
        raise UserInputError(f"{path} is an acoustic voice without a trained vocoder, and Griffin-Lim does not run "
                             f"in ONNX. Train its vocoder first (`voicesmith train CONFIG --stage vocoder`), or pass "
                             f"one with --vocoder PATH; or export a VITS voice.")
    return vocoder.generator


def trace_to_onnx(graph: PiperGraph, n_symbols: int, n_speakers: int) -> bytes:
    """The TorchScript exporter on random ids, with Piper's names and dynamic axes; the ONNX bytes."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, n_symbols, (1, TRACE_IDS), generator=generator)
    args = [ids, torch.tensor([TRACE_IDS]), torch.tensor([0.667, 1.0, 0.8])]
    names = ["input", "input_lengths", "scales"]
    axes = {"input": {0: "batch_size", 1: "phonemes"}, "input_lengths": {0: "batch_size"},
            "output": {0: "batch_size", 2: "time"}}
    if n_speakers > 1:
        args.append(torch.tensor([0]))
        names.append("sid")
        axes["sid"] = {0: "batch_size"}
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        # the flows' reversed slices (step -1) are not constant-folded: harmless, said once per pass
        warnings.filterwarnings("ignore", message="Constant folding - Only steps=1", category=UserWarning)
        torch.onnx.export(graph, tuple(args), buffer, opset_version=OPSET, dynamo=False, input_names=names,
                          output_names=["output"], dynamic_axes=axes)
    return buffer.getvalue()


def check_graph_structure(onnx_bytes: bytes, expected_ceils: int = 1) -> None:
    """onnx.checker, and the expected Ceil count: exactly one in VITS (the duration rounding alignment tools
    expose); none in an acoustic voice, which rounds its durations to the nearest frame."""
    import onnx

    model = onnx.load_from_string(onnx_bytes)
    onnx.checker.check_model(model)
    ceils = sum(node.op_type == "Ceil" for node in model.graph.node)
    if ceils != expected_ceils:
        raise RunFailed(f"The exported graph has {ceils} Ceil nodes where {expected_ceils} were expected (Piper's "
                        f"alignment tools need exactly one in VITS: the duration rounding). This is a bug in "
                        f"voicesmith's inference path; report it.")


def verify_against_pytorch(onnx_path: Path, voice: LoadedVoice) -> tuple[float, int]:
    """Max |onnxruntime - PyTorch| over one sentence at noise 0, and the samples compared."""
    exported = OnnxVoice.load(onnx_path)
    ids = TextFrontend(voice.config.text, voice.symbols).encode(CHECK_TEXT).ids
    sid = exported.speaker_id(None)
    scales = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    onnx_audio = exported.run_graph(ids, sid, scales)
    with torch.no_grad():
        expected = voice.model.infer(torch.tensor([ids]), torch.tensor([len(ids)]),
                                     None if sid is None else torch.tensor([sid]),
                                     noise_scale=0.0, length_scale=1.0, noise_w=0.0)["audio"]
    expected = expected.reshape(-1).clamp(-1, 1).numpy()
    if expected.shape != onnx_audio.shape:
        raise RunFailed(f"The exported graph speaks {len(onnx_audio)} samples where the model speaks "
                        f"{len(expected)} for the same ids at noise 0; the export is wrong. Report this as a bug.")
    max_diff = float(np.abs(expected - onnx_audio).max())
    if max_diff > TOLERANCE:
        raise RunFailed(f"The exported graph differs from the model by up to {max_diff:.2e} at noise 0 (tolerance "
                        f"{TOLERANCE:g}); the export is wrong. Report this as a bug.")
    return max_diff, len(expected)
