"""Neural vocoders: generators, the ONNX-friendly inverse STFT, VocoderModel, two-stage runs, --vocoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from acoustic_helpers import tiny_config
from voicesmith.audio import stft
from voicesmith.checkpoint import atomic_save
from voicesmith.config import AudioConfig, make_config
from voicesmith.errors import ConfigError, UserInputError
from voicesmith.inference import Synthesizer
from voicesmith.models import build_model
from voicesmith.models.vocoder import InverseStft, VocoderModel, build_generator
from voicesmith.models.vocoder.model import cut_segments
from voicesmith.text import SymbolTable
from voicesmith.training.module import voicesmith_block
from voicesmith.training.stages import single_stage, vocoder_stage_config

TEXT = "The quick brown fox jumps over the lazy dog."
GENERATOR_PRESETS = ["tiny", "hifigan-v1", "hifigan-v2", "hifigan-v3", "vocos"]


def vocoder_config(preset: str = "tiny", **audio):
    config = make_config("corpus", preset, "vocoder")
    for key, value in audio.items():
        setattr(config.audio, key, value)
    return config


def write_checkpoint(path: Path, model: torch.nn.Module, config) -> Path:
    """A checkpoint in the engine's format (what training writes), for untrained weights."""
    ckpt = {"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "voicesmith": voicesmith_block(config, SymbolTable.default(), {"": 0}, 0)}
    atomic_save(ckpt, path)
    return path


def write_acoustic_run(run_dir: Path) -> Path:
    config = tiny_config()
    config.save(run_dir / "config.yaml")
    torch.manual_seed(0)
    model = build_model(config.model, len(SymbolTable.default()), config.audio.n_mels, 1, config.resolve, config.audio)
    return write_checkpoint(run_dir / "checkpoints" / "last.ckpt", model, config)


def write_vocoder(path: Path, **audio) -> Path:
    config = vocoder_config(**audio)
    torch.manual_seed(0)
    return write_checkpoint(path, build_model(config.model, 1, config.audio.n_mels, audio_cfg=config.audio), config)


@pytest.mark.parametrize("preset", GENERATOR_PRESETS)
def test_each_generator_maps_frames_to_hop_samples(preset):
    config = vocoder_config(preset)
    generator = build_generator(config.model, config.audio).eval()
    with torch.no_grad():
        audio = generator(torch.randn(2, config.audio.n_mels, 7))
    assert audio.shape == (2, 1, 7 * config.audio.hop_length)
    assert torch.isfinite(audio).all()


def test_published_hifigan_sizes():
    sizes = {preset: sum(p.numel() for p in build_generator(vocoder_config(preset).model, AudioConfig()).parameters())
             for preset in ("hifigan-v1", "hifigan-v2", "hifigan-v3")}
    assert sizes["hifigan-v1"] == 13_935_616  # HiFi-GAN V1 at 80 mels (weight norm counts g and v)
    assert sizes["hifigan-v2"] < sizes["hifigan-v3"] < sizes["hifigan-v1"]


def test_generator_hop_must_match_the_audio_hop():
    config = vocoder_config("hifigan-v3")
    with pytest.raises(ConfigError, match="hop_length is 300"):
        build_generator(config.model, AudioConfig(hop_length=300))


@pytest.mark.parametrize("n_fft, hop, win", [(1024, 256, 1024), (512, 128, 400), (16, 4, 12)])
def test_inverse_stft_equals_torch_istft(n_fft, hop, win):
    torch.manual_seed(0)
    window = torch.hann_window(win)
    for spec in (torch.stft(torch.randn(2, hop * 30), n_fft, hop, win, window=window, return_complex=True),
                 torch.randn(2, n_fft // 2 + 1, 30, dtype=torch.complex64)):  # any spectrum, consistent or not
        expected = torch.istft(spec, n_fft, hop, win, window=window, center=True)
        ours = InverseStft(n_fft, hop, win, padding="center")(spec.real, spec.imag)
        assert ours.shape == expected.shape
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_same_padding_inverts_voicesmith_stft():
    cfg = AudioConfig()
    audio = torch.randn(2, cfg.hop_length * 40) * 0.3
    spec = stft(audio, cfg)
    rebuilt = InverseStft(cfg.n_fft, cfg.hop_length, cfg.win_length, padding="same")(spec.real, spec.imag)
    torch.testing.assert_close(rebuilt, audio, atol=1e-4, rtol=0)


def test_vocos_generator_exports_to_onnx(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    config = vocoder_config("tiny")
    generator = build_generator(config.model, config.audio).eval()
    path = tmp_path / "vocos.onnx"
    torch.onnx.export(generator, (torch.randn(1, 80, 10),), str(path), input_names=["mel"], output_names=["audio"],
                      dynamic_axes={"mel": {0: "batch", 2: "frames"}, "audio": {0: "batch", 2: "samples"}},
                      dynamo=False)
    mel = torch.randn(2, 80, 23)
    (audio,) = onnxruntime.InferenceSession(str(path)).run(None, {"mel": mel.numpy()})
    with torch.no_grad():
        expected = generator(mel)
    torch.testing.assert_close(torch.from_numpy(audio), expected, atol=1e-4, rtol=1e-4)


def test_segments_cut_the_same_window_of_mel_and_audio():
    hop = 4
    mels = torch.arange(10.0).repeat(2, 3, 1)  # value = frame index
    audio = (torch.arange(40) // hop).float().repeat(2, 1, 1)  # value = frame the sample belongs to
    starts = torch.tensor([2, 7])
    mel = cut_segments(mels, starts, 5, -1.0)
    wave = cut_segments(audio, starts * hop, 5 * hop, 0.0)
    assert mel[0, 0].tolist() == [2, 3, 4, 5, 6]
    assert mel[1, 0].tolist() == [7, 8, 9, -1, -1]  # past the end: the pad value
    assert torch.equal(wave[0, 0, ::hop], mel[0, 0])


def test_discriminator_and_generator_updates_are_separate():
    config = vocoder_config("tiny")
    model = VocoderModel(config.model, config.audio)
    generator_ids = {id(p) for p in model.generator_parameters()}
    discriminator_ids = {id(p) for p in model.discriminator_parameters()}
    assert not generator_ids & discriminator_ids
    assert generator_ids | discriminator_ids == {id(p) for p in model.parameters()}
    frames = 40
    batch = {"mels": torch.randn(2, 80, frames), "mel_lengths": torch.tensor([frames, 35]),
             "audio": torch.randn(2, frames * 256) * 0.1, "audio_lengths": torch.tensor([frames, 35]) * 256}
    output = model(batch)
    assert output.fake.shape == output.real.shape == (2, 1, config.model.vocoder_segment_frames * 256)
    model.discriminator_losses(batch, output)["discriminator"].backward()
    assert all(p.grad is None for p in model.generator_parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.discriminator_parameters())
    model.zero_grad(set_to_none=True)
    losses = model.generator_losses(batch, output)
    assert set(losses) | {"discriminator"} == set(model.loss_names())
    sum(losses.values()).backward()
    assert all(p.grad is not None for p in model.generator_parameters())


def test_eval_mode_takes_the_first_window():
    config = vocoder_config("tiny")
    model = VocoderModel(config.model, config.audio).eval()
    assert model.segment_starts(torch.tensor([100, 20])).tolist() == [0, 0]
    model.train()
    starts = model.segment_starts(torch.tensor([100, 20]))
    assert 0 <= starts[0] <= 100 - config.model.vocoder_segment_frames and starts[1] == 0


def test_run_vocoder_speaks_by_default_and_griffin_lim_on_request(tmp_path):
    write_acoustic_run(tmp_path)
    griffin_lim, _ = Synthesizer.load(tmp_path).synthesize(TEXT)
    write_vocoder(tmp_path / "vocoder" / "checkpoints" / "last.ckpt")
    by_default = Synthesizer.load(tmp_path)
    assert by_default.vocoder is not None
    vocoded, _ = by_default.synthesize(TEXT)
    assert vocoded.shape == griffin_lim.shape and not np.allclose(vocoded, griffin_lim)
    again, _ = Synthesizer.load(tmp_path, vocoder="griffin-lim").synthesize(TEXT)
    np.testing.assert_array_equal(again, griffin_lim)
    by_path, _ = Synthesizer.load(tmp_path, vocoder=str(tmp_path / "vocoder")).synthesize(TEXT)
    np.testing.assert_allclose(by_path, vocoded, atol=1e-6)


def test_mismatched_audio_settings_are_refused_and_named(tmp_path):
    write_acoustic_run(tmp_path / "voice")
    other = write_vocoder(tmp_path / "other.ckpt", sample_rate=16000, f_max=7600.0)
    with pytest.raises(UserInputError, match=r"sample_rate 22050 \(vocoder: 16000\), f_max 8000.0 \(vocoder: 7600.0\)"):
        Synthesizer.load(tmp_path / "voice", vocoder=str(other))
    with pytest.raises(UserInputError, match="not a vocoder"):
        Synthesizer.load(tmp_path / "voice", vocoder=str(tmp_path / "voice"))
    config = tiny_config()
    config.save(tmp_path / "voice" / "config.yaml")
    config.train.stage2.init_from = str(other)
    with pytest.raises(UserInputError, match="sample_rate 22050"):
        vocoder_stage_config(config)


def test_cli_synth_vocoder_option(tmp_path, capsys):
    from voicesmith.cli import main

    write_acoustic_run(tmp_path)
    assert main(["synth", str(tmp_path), TEXT, "-o", str(tmp_path / "gl.wav"), "--vocoder", "griffin-lim"]) == 0
    assert main(["synth", str(tmp_path), TEXT, "-o", str(tmp_path / "x.wav"), "--vocoder", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_which_stages_a_run_trains():
    acoustic = tiny_config()
    assert single_stage(acoustic, None) and single_stage(acoustic, "acoustic")
    assert not single_stage(acoustic, "both") and not single_stage(acoustic, "vocoder")
    acoustic.train.stage2.max_steps = 50
    assert not single_stage(acoustic, None)  # a configured second stage runs by default
    vocoder = vocoder_config()
    assert single_stage(vocoder, None) and single_stage(vocoder, "vocoder")
    with pytest.raises(ConfigError, match="--stage acoustic does not apply to a vocoder run"):
        single_stage(vocoder, "acoustic")


def test_vocoder_stage_config_shares_the_runs_data(tmp_path):
    config = tiny_config()
    config.data.dataset = str(tmp_path / "corpus")
    config.save(tmp_path / "run" / "config.yaml")
    config.train.stage2.lr = 1e-3
    config.train.stage2.max_audio_seconds = 0.5
    config.train.stage2.batch_size = 3
    stage = vocoder_stage_config(config)
    assert stage.path == (tmp_path / "run" / "vocoder" / "config.yaml").resolve()
    assert stage.resolve(stage.data.dataset) == config.resolve(config.data.dataset)
    assert stage.resolve(stage.data.cache_dir) == config.resolve(config.data.cache_dir)
    assert stage.model.type == "vocoder" and stage.audio == config.audio
    assert stage.model.vocoder_segment_frames == round(0.5 * 22050 / 256)
    assert (stage.train.learning_rate, stage.train.batch_size, stage.train.max_steps) == (1e-3, 3, 1000)
    assert stage.model.loss_weights.mel == 45


def test_vocoder_stage_can_fine_tune_a_shared_vocoder(tmp_path):
    shared = write_vocoder(tmp_path / "shared" / "checkpoints" / "best.ckpt")
    config = tiny_config()
    config.save(tmp_path / "voice" / "config.yaml")
    config.train.stage2.init_from = "../shared"  # relative to the voice's config file
    stage = vocoder_stage_config(config)
    assert Path(stage.train.init_from) == shared.resolve()
    assert stage.model.vocoder_generator == vocoder_config().model.vocoder_generator


@pytest.mark.slow
def test_a_short_cpu_run_lowers_the_mel_loss(demo_corpus):
    """The tiny vocoder, trained as the engine trains it (D update, then G update), on real speech."""
    from voicesmith.audio import load_audio, mel_spectrogram, to_mono
    from voicesmith.data.formats import read_corpus
    from voicesmith.training.module import loss_weights, weighted_total

    config = vocoder_config("tiny")
    waves = [torch.from_numpy(to_mono(load_audio(item.audio_path)[0])) for item in read_corpus(demo_corpus).items]
    frames = min(len(wave) for wave in waves) // 256
    audio = torch.stack([wave[:frames * 256] for wave in waves])
    batch = {"mels": mel_spectrogram(audio, config.audio), "mel_lengths": torch.full((len(waves),), frames),
             "audio": audio}
    items = waves
    torch.manual_seed(0)
    model = VocoderModel(config.model, config.audio)
    weights = loss_weights(model, config)
    opt_g = torch.optim.AdamW(model.generator_parameters(), lr=1e-3, betas=(0.8, 0.99))
    opt_d = torch.optim.AdamW(model.discriminator_parameters(), lr=1e-3, betas=(0.8, 0.99))

    def validation_mel_loss() -> float:
        model.eval()
        with torch.no_grad():
            value = model.generator_losses(batch, model(batch))["mel"].item()
        model.train()
        return value

    before = validation_mel_loss()
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        rows = torch.randperm(len(items), generator=generator)[:4]
        part = {key: value[rows] for key, value in batch.items()}
        output = model(part)
        opt_d.zero_grad()
        weighted_total(model.discriminator_losses(part, output), weights).backward()
        opt_d.step()
        opt_g.zero_grad()
        weighted_total(model.generator_losses(part, output), weights).backward()
        opt_g.step()
    after = validation_mel_loss()
    assert after < 0.8 * before, (before, after)


@pytest.mark.slow
def test_stage_both_trains_both_stages_and_synth_uses_the_vocoder(demo_corpus, tmp_path):
    import json

    import soundfile as sf

    from voicesmith.cli import main
    from voicesmith.config import init_run

    run = tmp_path / "run"
    init_run(demo_corpus, run, "acoustic", "tiny", overrides=[
        "data.num_workers=0", "train.val_every_n_steps=5", "train.checkpoint_every_n_steps=5",
        "samples.every_n_steps=4", "samples.texts=['Hello there.']", "samples.n_references=1",
        "train.stage2.max_steps=4", "train.stage2.batch_size=4"])
    assert main(["train", str(run / "config.yaml"), "--stage", "both", "--max-steps", "6"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["stages"]["acoustic"]["global_step"] == 6 and summary["stages"]["vocoder"]["global_step"] == 4
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "vocoder" / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((run / "vocoder" / "summary.json").read_text())["status"] == "completed"
    assert (run / "vocoder" / "samples" / "step_4" / "sample-01.wav").is_file()  # the voice through the live vocoder

    assert main(["synth", str(run), "Hello there.", "-o", str(tmp_path / "vocoder.wav")]) == 0
    assert main(["synth", str(run), "Hello there.", "-o", str(tmp_path / "gl.wav"), "--vocoder", "griffin-lim"]) == 0
    vocoded, griffin_lim = (sf.read(tmp_path / name)[0] for name in ("vocoder.wav", "gl.wav"))
    assert vocoded.shape == griffin_lim.shape and not np.allclose(vocoded, griffin_lim, atol=1e-3)

    # The vocoder stage resumes alone: more stage-2 steps continue from its own last checkpoint.
    assert main(["train", str(run / "config.yaml"), "--stage", "vocoder", "--set", "train.stage2.max_steps=6"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stages"]["vocoder"]["start_step"] == 4 and summary["stages"]["vocoder"]["global_step"] == 6
    assert summary["global_step"] == summary["stages"]["acoustic"]["global_step"] == 6  # the acoustic stage's, kept
