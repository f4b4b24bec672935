"""`voicesmith export`: VITS voices in Piper's format, judged by the Piper runtime itself.

Each export is spoken by `piper.PiperVoice` (piper-tts, a dev dependency) and by voicesmith's ONNX
synthesizer, and set against the PyTorch model it came from, at noise 0 where all three must agree.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import piper  # the Piper runtime, a dev dependency: the judge of every export, never skipped
import pytest
import torch

from voicesmith.checkpoint import atomic_save
from voicesmith.cli import main as cli_main
from voicesmith.config import init_run, load_config, make_config
from voicesmith.export import TOLERANCE, export_voice
from voicesmith.inference import Synthesizer
from voicesmith.models import build_model
from voicesmith.onnx_voice import OnnxVoice
from voicesmith.text import SymbolTable


TEXT = "Hello there."
AT_NOISE_ZERO = dict(noise_scale=0.0, noise_w=0.0)
# The tiny preset with one layer where it has several: every kind of layer stays in the graph, which
# traces in a few seconds (the slow test exports the tiny preset itself).
SMALLER = ["model.encoder_layers=1", "model.flow_layers=1", "model.flow_wavenet_layers=1",
           "model.posterior_layers=1", "model.resblock_kernel_sizes=[3]", "model.resblock_dilation_sizes=[[1,2]]"]


def write_vits_run(run_dir: Path, speakers: dict[str, int], model_type: str = "vits",
                   symbols: SymbolTable = SymbolTable.default()) -> Path:
    """A run directory with a tiny-preset config and a checkpoint in the contract's format (untrained weights:
    export does not care what the weights learned, only that the graph reproduces them)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = (SMALLER if model_type == "vits" else []) + [f"text.phonemizer={symbols.kind}"]
    init_run(run_dir, run_dir, model_type, "tiny", overrides)  # the dataset is never read here
    config = load_config(run_dir / "config.yaml")
    torch.manual_seed(0)
    model = build_model(config.model, len(symbols), config.audio.n_mels, max(len(speakers), 1), config.resolve,
                        config.audio)
    ckpt = {"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "voicesmith": {"format": 1, "model_type": model_type, "config": config.to_dict(),
                           "symbols": symbols.to_dict(), "speakers": speakers, "global_step": 0}}
    atomic_save(ckpt, run_dir / "checkpoints" / "last.ckpt")
    return run_dir


@pytest.fixture(scope="module")
def single_export(tmp_path_factory):
    run_dir = write_vits_run(tmp_path_factory.mktemp("vits_single"), {"": 0})
    return run_dir, export_voice(run_dir, run_dir / "voice.onnx")


@pytest.fixture(scope="module")
def multi_export(tmp_path_factory):
    run_dir = write_vits_run(tmp_path_factory.mktemp("vits_multi"), {"alice": 0, "bob": 1, "carol": 2})
    return run_dir, export_voice(run_dir, run_dir / "voice.onnx")


def piper_audio(voice, text: str, **settings) -> np.ndarray:
    config = piper.SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False, **settings)
    return np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text, config)])


def test_the_graph_has_pipers_interface(single_export):
    _, report = single_export
    model = onnx.load(str(report.onnx_path))
    assert model.opset_import[0].version == 15
    assert [node.op_type for node in model.graph.node].count("Ceil") == 1
    shapes = {tensor.name: [dim.dim_param or dim.dim_value for dim in tensor.type.tensor_type.shape.dim]
              for tensor in model.graph.input}
    assert shapes == {"input": ["batch_size", "phonemes"], "input_lengths": ["batch_size"], "scales": [3]}
    assert model.graph.output[0].name == "output"
    assert report.max_abs_diff <= TOLERANCE and report.samples_compared > 0


def test_the_piper_runtime_speaks_the_export_as_voicesmith_does(single_export):
    _, report = single_export
    theirs = piper.PiperVoice.load(report.onnx_path, include_alignments=True)
    ours = OnnxVoice.load(report.onnx_path)
    assert theirs.config.sample_rate == ours.sample_rate == 22050 and theirs.config.num_speakers == 1
    expected = piper_audio(theirs, TEXT)
    audio, _ = ours.synthesize(TEXT, **AT_NOISE_ZERO)
    assert len(audio) == len(expected) > 0
    np.testing.assert_allclose(audio, np.clip(expected, -1, 1), rtol=0, atol=1e-5)
    chunk = next(iter(theirs.synthesize(TEXT, include_alignments=True)))
    assert chunk.phoneme_id_samples is not None and chunk.phoneme_id_samples.sum() == len(chunk.audio_float_array)


def test_the_onnx_synthesizer_matches_the_pytorch_synthesizer(single_export):
    from voicesmith.inference import Synthesizer

    run_dir, report = single_export
    reference, sample_rate = Synthesizer.load(run_dir).synthesize(TEXT, **AT_NOISE_ZERO)
    audio, onnx_rate = OnnxVoice.load(report.onnx_path).synthesize(TEXT, **AT_NOISE_ZERO)
    assert onnx_rate == sample_rate and audio.shape == reference.shape
    np.testing.assert_allclose(audio, np.clip(reference, -1, 1), rtol=0, atol=TOLERANCE)


def test_multi_speaker_exports_take_sid_by_name(multi_export):
    _, report = multi_export
    ours, theirs = OnnxVoice.load(report.onnx_path), piper.PiperVoice.load(report.onnx_path)
    assert "sid" in [item.name for item in ours.session.get_inputs()]
    assert ours.speakers == ["alice", "bob", "carol"] and theirs.config.speaker_id_map == {"alice": 0, "bob": 1,
                                                                                            "carol": 2}
    bob, _ = ours.synthesize(TEXT, "bob", **AT_NOISE_ZERO)
    np.testing.assert_allclose(bob, piper_audio(theirs, TEXT, speaker_id=1), rtol=0, atol=1e-5)
    carol, _ = ours.synthesize(TEXT, "carol", **AT_NOISE_ZERO)
    assert len(bob) != len(carol) or np.abs(bob - carol).max() > 1e-4  # the speaker reaches the graph


def test_character_voices_export_as_pipers_text_type(tmp_path):
    symbols = SymbolTable.for_characters(["hello there"])
    run_dir = write_vits_run(tmp_path / "characters", {"": 0}, symbols=symbols)
    report = export_voice(run_dir, tmp_path / "characters.onnx")
    theirs = piper.PiperVoice.load(report.onnx_path)
    assert theirs.config.phoneme_type.value == "text"
    ours = OnnxVoice.load(report.onnx_path)
    text = "Hello there"  # Piper's text type feeds the raw characters: no punctuation, no digits here
    assert theirs.phonemes_to_ids(theirs.phonemize(text)[0]) == ours.frontend.encode(text).ids
    np.testing.assert_allclose(ours.synthesize(text, **AT_NOISE_ZERO)[0], piper_audio(theirs, text), rtol=0,
                               atol=1e-5)


def test_what_cannot_be_exported_is_refused_with_the_reason(tmp_path, capsys):
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"layer.weight": torch.zeros(2)}}, foreign)
    assert cli_main(["export", str(foreign), "-o", str(tmp_path / "v.onnx")]) == 2
    assert "not a voicesmith checkpoint" in capsys.readouterr().err
    acoustic = write_vits_run(tmp_path / "acoustic", {"": 0}, model_type="acoustic")
    assert cli_main(["export", str(acoustic), "-o", str(tmp_path / "v.onnx")]) == 2
    assert "acoustic voice without a trained vocoder, and Griffin-Lim does not run in ONNX" in capsys.readouterr().err
    assert cli_main(["export", str(acoustic), "-o", str(tmp_path / "v.bin")]) == 2
    assert "NAME.onnx" in capsys.readouterr().err
    assert not list(tmp_path.glob("v.*"))


def write_run_vocoder(run_dir: Path) -> None:
    """An untrained tiny vocoder as the run's second stage (RUN_DIR/vocoder/), with the run's audio settings."""
    config = make_config("corpus", "tiny", "vocoder")
    config.audio = load_config(run_dir / "config.yaml").audio
    torch.manual_seed(1)
    model = build_model(config.model, 1, config.audio.n_mels, audio_cfg=config.audio)
    ckpt = {"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "voicesmith": {"format": 1, "model_type": "vocoder", "config": config.to_dict(),
                           "symbols": SymbolTable.default().to_dict(), "speakers": {}, "global_step": 0}}
    atomic_save(ckpt, run_dir / "vocoder" / "checkpoints" / "last.ckpt")


def test_an_acoustic_voice_exports_with_its_vocoder_as_one_graph(tmp_path):
    run_dir = write_vits_run(tmp_path / "acoustic", {"": 0}, model_type="acoustic")
    write_run_vocoder(run_dir)
    report = export_voice(run_dir, tmp_path / "voice.onnx")
    assert report.max_abs_diff <= TOLERANCE
    graph = onnx.load(str(tmp_path / "voice.onnx"))
    assert [i.name for i in graph.graph.input] == ["input", "input_lengths", "scales"]
    theirs = piper.PiperVoice.load(tmp_path / "voice.onnx")
    spoken = piper_audio(theirs, TEXT)
    expected, _ = Synthesizer.load(run_dir).synthesize(TEXT)  # the run's own vocoder, in PyTorch
    np.testing.assert_allclose(spoken, expected, rtol=0, atol=1e-4)
    slower = piper_audio(theirs, TEXT, length_scale=1.5)
    assert len(slower) > len(spoken)  # the length scale is honoured; the noise scales mean nothing here


@pytest.mark.slow
def test_a_trained_tiny_run_exports_and_speaks_in_both_runtimes(demo_corpus, tmp_path):
    """The whole path on the command line: init, train 2 steps, export, speak with piper and voicesmith."""
    run_dir = tmp_path / "run"

    def voicesmith(*args: str) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, "-m", "voicesmith.cli", *args], capture_output=True, text=True,
                                timeout=900)
        assert result.returncode == 0, result.stderr
        return result

    voicesmith("init", str(demo_corpus), str(run_dir), "--model", "vits", "--preset", "tiny")
    voicesmith("train", str(run_dir / "config.yaml"), "--max-steps", "2")
    printed = voicesmith("export", str(run_dir), "-o", str(tmp_path / "voice.onnx")).stdout
    assert "onnxruntime matches PyTorch at noise 0" in printed
    audio = piper_audio(piper.PiperVoice.load(tmp_path / "voice.onnx"), "Hello there. How are you?")
    assert len(audio) > 0 and np.isfinite(audio).all()
    voicesmith("synth", str(tmp_path / "voice.onnx"), "Hello there. How are you?", "-o", str(tmp_path / "out.wav"))
    assert (tmp_path / "out.wav").stat().st_size > 1000
