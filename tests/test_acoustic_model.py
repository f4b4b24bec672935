"""The acoustic model: masks, gradients, losses, conditioning modes, and that it learns on real speech."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from acoustic_helpers import (Item, encode_corpus, make_batch, set_mel_stats, tiny_config, train, validation_loss,
                              weighted_loss)
from voicesmith.config import LossWeights
from voicesmith.errors import ConfigError, UserInputError
from voicesmith.models import build_model
from voicesmith.models.acoustic import AcousticModel, mel_statistics

N_SYMBOLS, N_MELS = 40, 80


class TinySpeakerEncoder(nn.Module):
    """A stand-in for a user's speaker encoder: log-mel [1, n_mels, T] -> [1, 16]."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(N_MELS, 16, 3, padding=1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(mel)).mean(-1)


@pytest.fixture(scope="module")
def torchscript_encoder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("encoder") / "speaker_encoder.pt"
    torch.manual_seed(0)
    with pytest.warns(DeprecationWarning):  # torch deprecates TorchScript; users still have such files
        torch.jit.script(TinySpeakerEncoder()).save(str(path))
    return path


@pytest.fixture(scope="module")
def onnx_encoder(tmp_path_factory) -> Path:
    pytest.importorskip("onnxruntime")
    path = tmp_path_factory.mktemp("encoder") / "speaker_encoder.onnx"
    torch.manual_seed(0)
    with pytest.warns(DeprecationWarning):
        torch.onnx.export(TinySpeakerEncoder(), (torch.randn(1, N_MELS, 50),), str(path), input_names=["mel"],
                          output_names=["embedding"], dynamic_axes={"mel": {2: "frames"}}, dynamo=False)
    return path


@pytest.fixture(scope="module")
def demo_items(demo_corpus):
    return encode_corpus(demo_corpus)


@pytest.fixture(scope="module")
def multispeaker_items(multispeaker_corpus):
    return encode_corpus(multispeaker_corpus)


def random_batch(lengths: list[tuple[int, int]], n_speakers: int = 1, seed: int = 0) -> dict:
    """Random ids and mels with the given (text, mel) lengths, padded like the data loader pads."""
    generator = torch.Generator().manual_seed(seed)
    items = [Item("", torch.randint(1, N_SYMBOLS, (text,), generator=generator),
                  torch.randn(N_MELS, frames, generator=generator) * 2 - 5, index % n_speakers)
             for index, (text, frames) in enumerate(lengths)]
    return make_batch(items)


def build(resolve=None, n_speakers: int = 1, **overrides) -> AcousticModel:
    torch.manual_seed(0)
    return build_model(tiny_config(**overrides).model, N_SYMBOLS, N_MELS, n_speakers, resolve)


def every_mode(encoder_path: Path) -> dict:
    return dict(n_speakers=3, gst=True, speaker_encoder=str(encoder_path), freeze_speaker_encoder=False,
                loss_weights=LossWeights(speaker=0.5))


# --- structure --------------------------------------------------------------------------------------

def test_tiny_preset_has_about_a_million_parameters():
    n_parameters = sum(p.numel() for p in build().parameters())
    assert 0.7e6 < n_parameters < 1.3e6, n_parameters


def test_losses_are_named_like_the_loss_weights(torchscript_encoder):
    plain = build()
    losses = plain(random_batch([(7, 20), (5, 12)])).losses
    assert set(losses) == set(plain.loss_names()) == {"mel", "prior", "duration"}
    full = build(**every_mode(torchscript_encoder))
    losses = full(random_batch([(7, 20), (5, 12)], n_speakers=3)).losses
    assert set(losses) == set(full.loss_names()) == {"mel", "prior", "duration", "speaker"} <= set(LossWeights.model_fields)
    assert all(value.dim() == 0 and torch.isfinite(value) for value in losses.values())


def test_training_pass_shapes_and_alignment_is_a_monotonic_path():
    batch = random_batch([(9, 30), (4, 11), (6, 25)])
    output = build()(batch)
    assert output.mel.shape == batch["mels"].shape
    assert output.alignment.shape == (3, 9, 30)
    assert torch.equal(output.durations.sum(1), batch["mel_lengths"].float())
    for row, (text_length, mel_length) in enumerate(zip(batch["phoneme_lengths"], batch["mel_lengths"])):
        path = output.alignment[row]
        assert torch.equal(path[:, :mel_length].sum(0), torch.ones(int(mel_length)))  # one phoneme per frame
        assert path[text_length:].sum() == 0 and path[:, mel_length:].sum() == 0
        assert (output.durations[row, :text_length] >= 1).all()  # every phoneme is spoken
        phoneme_of_frame = path[:, :mel_length].argmax(0)
        assert (phoneme_of_frame.diff() >= 0).all() and (phoneme_of_frame.diff() <= 1).all()
        assert (output.mel[row, :, mel_length:] == batch["mels"][row, :, mel_length:]).all()  # MEL_FLOOR


def test_padding_never_affects_outputs(torchscript_encoder):
    """Each item alone, and in batches padded differently, gives the same outputs on its valid region."""
    model = build(n_speakers=3, gst=True, speaker_encoder=str(torchscript_encoder)).eval()
    lengths = [(11, 40), (6, 18), (8, 33)]
    batch = random_batch(lengths, n_speakers=3)
    wider = random_batch(lengths + [(15, 52)], n_speakers=3)  # the same three, padded further
    with torch.no_grad():
        outputs = [model(batch), model(wider)]
        inferred = [model.infer(b["phoneme_ids"], b["phoneme_lengths"], b["speaker_ids"],
                                reference_mel=b["mels"], reference_lengths=b["mel_lengths"]) for b in (batch, wider)]
        for row, (text_length, mel_length) in enumerate(lengths):
            one = {key: value[row:row + 1] for key, value in batch.items() if torch.is_tensor(value)}
            one["phoneme_ids"], one["mels"] = one["phoneme_ids"][:, :text_length], one["mels"][:, :, :mel_length]
            alone = model(one)
            alone_inferred = model.infer(one["phoneme_ids"], one["phoneme_lengths"], one["speaker_ids"],
                                         reference_mel=one["mels"])
            frames = int(alone_inferred["mel_lengths"][0])
            for output, result in zip(outputs, inferred):
                torch.testing.assert_close(output.mel[row, :, :mel_length], alone.mel[0], atol=1e-5, rtol=0)
                assert torch.equal(output.alignment[row, :text_length, :mel_length], alone.alignment[0])
                assert int(result["mel_lengths"][row]) == frames
                assert torch.equal(result["durations"][row, :text_length], alone_inferred["durations"][0])
                torch.testing.assert_close(result["mel"][row, :, :frames], alone_inferred["mel"][0], atol=1e-5,
                                           rtol=0)


def test_gradient_reaches_every_parameter(torchscript_encoder):
    model = build(**every_mode(torchscript_encoder))
    batch = random_batch([(9, 30), (4, 11), (6, 25)], n_speakers=3)
    weighted_loss(model, batch, model.cfg).backward()
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert any(name.startswith("speaker_encoder.") for name in trainable)  # fine-tuned, so trainable
    missing = [name for name, p in trainable.items() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []
    assert all(torch.isfinite(p.grad).all() for p in trainable.values())


def test_gradient_checkpointing_gives_the_same_gradients():
    batch = random_batch([(9, 30), (4, 11)])
    model = build(dropout=0.0)
    gradients = []
    for enabled in (False, True):
        model.zero_grad()
        model.set_gradient_checkpointing(enabled)
        weighted_loss(model, batch, model.cfg).backward()
        gradients.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(gradients[0], gradients[1], atol=1e-6, rtol=1e-5)


def test_infer_length_scale_and_durations():
    model = build().eval()
    batch = random_batch([(9, 30), (4, 11)])
    with torch.no_grad():
        normal = model.infer(batch["phoneme_ids"], batch["phoneme_lengths"])
        slow = model.infer(batch["phoneme_ids"], batch["phoneme_lengths"], length_scale=2.0)
    assert normal["durations"].dtype == torch.long
    assert (normal["durations"][0] >= 1).all() and (normal["durations"][1, 4:] == 0).all()
    assert torch.equal(normal["durations"].sum(1), normal["mel_lengths"])
    assert torch.equal(normal["alignment"].sum(-1).long(), normal["durations"])
    assert (slow["mel_lengths"] >= 2 * normal["mel_lengths"] - batch["phoneme_lengths"]).all()
    assert normal["mel"].shape == (2, N_MELS, int(normal["mel_lengths"].max()))


def test_mel_statistics_ignore_padding_and_are_saved_with_the_weights():
    batch = random_batch([(5, 40), (5, 10)])
    mean, std = mel_statistics(batch["mels"], batch["mel_lengths"])
    valid = torch.cat([batch["mels"][0], batch["mels"][1, :, :10]], dim=-1)
    torch.testing.assert_close(mean, valid.mean(-1))
    torch.testing.assert_close(std, valid.std(-1, unbiased=False))
    model = build()
    model.set_mel_stats(mean, std)
    restored = build()
    restored.load_state_dict(model.state_dict())
    assert torch.equal(restored.mel_mean, mean)


def test_shapes_that_do_not_divide_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="model.encoder_heads"):
        build(hidden_channels=90, encoder_heads=4)
    with pytest.raises(ConfigError, match="model.gst_heads"):
        build(gst=True, speaker_embedding_dim=30, gst_heads=4)
    with pytest.raises(ConfigError, match="model.speaker_encoder"):
        build(loss_weights=LossWeights(speaker=1.0))


# --- external speaker encoder ---------------------------------------------------------------------

def test_missing_speaker_encoder_is_a_clear_error_at_build(tmp_path):
    with pytest.raises(UserInputError, match="model.speaker_encoder") as error:
        build(resolve=lambda p: tmp_path / p, speaker_encoder="encoders/missing.pt")
    assert str(tmp_path / "encoders" / "missing.pt") in str(error.value)


def test_unusable_speaker_encoder_files_are_refused(tmp_path, onnx_encoder):
    not_a_model = tmp_path / "encoder.pt"
    not_a_model.write_bytes(b"not a model")
    with pytest.raises(UserInputError, match="not a TorchScript model"):
        build(speaker_encoder=str(not_a_model))
    with pytest.raises(UserInputError, match="only be used frozen"):
        build(speaker_encoder=str(onnx_encoder), freeze_speaker_encoder=False)
    with pytest.raises(UserInputError, match="only be used frozen"):
        build(speaker_encoder=str(onnx_encoder), loss_weights=LossWeights(speaker=1.0))


def test_wrong_speaker_encoder_contract_is_refused_before_training(tmp_path):
    class TakesWaveforms(nn.Module):
        def forward(self, audio: torch.Tensor) -> torch.Tensor:
            if audio.dim() != 2:
                raise ValueError("expects a waveform [1, samples]")
            return audio[:, :16]

    path = tmp_path / "waveform_encoder.pt"
    with pytest.warns(DeprecationWarning):
        torch.jit.script(TakesWaveforms()).save(str(path))
    with pytest.raises(UserInputError, match=r"must take a log-mel \[1, n_mels, T\]"):
        build(speaker_encoder=str(path))


def test_frozen_speaker_encoder_stays_unchanged(torchscript_encoder):
    model = build(speaker_encoder=str(torchscript_encoder), loss_weights=LossWeights(speaker=1.0))
    before = {k: v.clone() for k, v in model.speaker_encoder.state_dict().items()}
    assert not any(p.requires_grad for p in model.speaker_encoder.parameters())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = random_batch([(9, 30), (4, 11), (6, 25)])
    weighted_loss(model, batch, model.cfg).backward()
    optimizer.step()
    assert all(torch.equal(before[k], v) for k, v in model.speaker_encoder.state_dict().items())
    assert model.speaker_projection.weight.grad.abs().sum() > 0
    assert model.speaker_counts[0] == 1  # the training pass recorded the speaker's mean embedding


# --- learning on real speech ------------------------------------------------------------------------

def _eval_loss(model: AcousticModel, batch: dict, cfg) -> float:
    model.eval()
    with torch.no_grad():
        return float(weighted_loss(model, batch, cfg.model))


def _trains_and_speaks(model: AcousticModel, corpus, cfg, steps: int) -> None:
    """A few steps lower the loss on the training items; inference gives a finite mel for every speaker."""
    items = sorted(corpus.items, key=lambda item: item.mel.shape[-1])[:8]  # short ones: a quick test
    batch = make_batch(items)
    set_mel_stats(model, items)
    before = _eval_loss(model, batch, cfg)
    train(model, items, cfg, max_steps=steps, max_seconds=60, batch_size=4)
    after = _eval_loss(model, batch, cfg)
    with torch.no_grad():
        for speaker in sorted(set(corpus.speakers.values())):
            result = model.infer(batch["phoneme_ids"][:1], batch["phoneme_lengths"][:1], torch.tensor([speaker]))
            assert torch.isfinite(result["mel"]).all() and result["mel_lengths"][0] > 0
    assert after < before, (before, after)


@pytest.mark.parametrize("mode", ["speakers", "gst", "torchscript_finetuned", "onnx_frozen"])
def test_each_conditioning_mode_trains_and_synthesises(mode, multispeaker_items, torchscript_encoder,
                                                       onnx_encoder):
    overrides = {"speakers": {}, "gst": dict(gst=True),
                 "torchscript_finetuned": dict(speaker_encoder=str(torchscript_encoder), freeze_speaker_encoder=False,
                                               loss_weights=LossWeights(speaker=0.1)),
                 "onnx_frozen": dict(speaker_encoder=str(onnx_encoder))}[mode]
    cfg = tiny_config(**overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model, len(multispeaker_items.symbols), N_MELS, len(multispeaker_items.speakers))
    assert (model.speaker_table is not None) == (len(multispeaker_items.speakers) > 1)
    _trains_and_speaks(model, multispeaker_items, cfg, steps=8)


def test_gst_reference_changes_the_style(demo_items):
    model = build_model(tiny_config(gst=True).model, len(demo_items.symbols), N_MELS).eval()
    item, other = demo_items.items[0], demo_items.items[5]
    ids, lengths = item.ids[None], torch.tensor([len(item.ids)])
    with torch.no_grad():
        plain = model.infer(ids, lengths)["mel"]
        styled = model.infer(ids, lengths, reference_mel=other.mel[None])["mel"]
    assert plain.shape == styled.shape and not torch.allclose(plain, styled)


def _learning_run(demo_items, seconds: float, max_steps: int) -> tuple[float, float, AcousticModel]:
    cfg = tiny_config()
    torch.manual_seed(0)
    model = build_model(cfg.model, len(demo_items.symbols), N_MELS)
    validation, training = demo_items.items[:4], demo_items.items[4:]
    set_mel_stats(model, training)
    before = validation_loss(model, validation)
    train(model, training, cfg, max_steps=max_steps, max_seconds=seconds)
    return before, validation_loss(model, validation), model


def test_short_training_lowers_validation_mel_loss(demo_items):
    before, after, _ = _learning_run(demo_items, seconds=30, max_steps=60)
    assert after < 0.8 * before, (before, after)


@pytest.mark.slow
def test_two_minute_training_learns_and_durations_follow_the_text(demo_items):
    before, after, model = _learning_run(demo_items, seconds=120, max_steps=10_000)
    assert after < 0.6 * before, (before, after)
    model.eval()
    frames = []
    with torch.no_grad():
        for item in demo_items.items[:8]:
            result = model.infer(item.ids[None], torch.tensor([len(item.ids)]))
            frames.append((len(item.ids), int(result["mel_lengths"][0]), item.mel.shape[-1]))
    text_lengths, predicted, real = (torch.tensor(column, dtype=torch.float) for column in zip(*frames))
    assert torch.corrcoef(torch.stack([text_lengths, predicted]))[0, 1] > 0.8, frames
    assert torch.corrcoef(torch.stack([real, predicted]))[0, 1] > 0.8, frames
    assert 0.6 < float(predicted.sum() / real.sum()) < 1.4, frames  # still learning after 2 minutes
