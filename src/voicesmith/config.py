"""The typed config of a run: plain data, saved as YAML next to the run.

Every relative path in a config file resolves against the folder of that file,
never against the current directory, so a run can be started from anywhere.
Unknown keys and wrong types are refused with the key's dotted name, the value
and what is allowed.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from voicesmith.errors import ConfigError

MODEL_TYPES = ("acoustic", "vits", "vocoder")
# The presets of each model type; VITS's are named like Piper's quality levels.
PRESETS: dict[str, tuple[str, ...]] = {
    "acoustic": ("tiny", "small", "medium", "high"),
    "vits": ("tiny", "x-low", "low", "medium", "high"),
    "vocoder": ("tiny", "hifigan-v1", "hifigan-v2", "hifigan-v3", "vocos"),
}
ALL_PRESETS = tuple(dict.fromkeys(name for names in PRESETS.values() for name in names))
ENV_PREFIX = "VOICESMITH_"


class Section(BaseModel):
    """Base for every section: unknown keys are an error, types are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Section):
    dataset: str = Field(description="corpus folder or filelist; relative to this config file")
    format: Literal["auto", "ljspeech", "vctk", "filelist"] = "auto"
    cache_dir: str = Field("cache", description="feature cache folder; relative to this config file")
    min_seconds: float = Field(0.5, gt=0)
    max_seconds: float = Field(20.0, gt=0)
    trim_silence: bool = True
    trim_top_db: float = Field(40.0, gt=0, description="level below the peak that counts as silence when trimming")
    long_silence_seconds: float = Field(1.0, gt=0, description="leading or trailing silence above this is reported (and trimmed when trim_silence)")
    silence_dbfs: float = Field(-60.0, lt=0, description="a clip whose peak is below this level is silence (excluded)")
    low_level_dbfs: float = Field(-30.0, lt=0, description="a clip whose peak is below this level is reported as very quiet")
    clipping_fraction: float = Field(0.001, gt=0, le=1, description="share of samples at full scale above which a clip is reported as clipped")
    normalize_peak: Optional[float] = Field(0.95, gt=0, le=1, description="cached waveforms are scaled to this peak (HiFi-GAN); None keeps levels")
    rate_outlier_mad: float = Field(5.0, gt=0, description="speaking rate (phonemes per second of speech) this many robust deviations (1.4826 MAD of log rate) from its speaker's median: excluded as text_audio_mismatch")
    rate_warning_mad: float = Field(3.5, gt=0, description="speaking rate this many robust deviations from the median: warned (speaking_rate)")
    rate_min_spread: float = Field(0.05, ge=0, description="floor of the robust deviation of log rate (0.05: 5%), so a very even corpus does not flag small differences")
    rate_min_items: int = Field(10, ge=3, description="a speaker needs this many usable items for the speaking-rate check")
    asr_check: Literal["off", "warn", "exclude"] = Field("off", description="transcribe each item with the offline recogniser (English) and warn about or exclude items above asr_max_cer")
    asr_max_cer: float = Field(0.6, gt=0, description="character error rate between what the recogniser hears and the transcript above which an item is flagged")
    asr_worst: int = Field(10, ge=0, description="the report lists this many items with the highest recogniser CER")
    val_fraction: float = Field(0.05, ge=0, lt=1)
    val_max_items: int = Field(64, ge=1)
    max_samples: Optional[int] = Field(None, ge=1, description="use at most this many training items (quick runs)")
    max_frames_per_batch: Optional[int] = Field(None, ge=1, description="cap on padded mel frames per batch")
    num_workers: int = Field(2, ge=0)
    pin_memory: Optional[bool] = Field(None, description="None: on when training on CUDA")
    prefetch_factor: int = Field(2, ge=1)
    seed: int = 1234


class AudioConfig(Section):
    sample_rate: int = Field(22050, gt=0)
    n_fft: int = Field(1024, gt=0)
    win_length: int = Field(1024, gt=0)
    hop_length: int = Field(256, gt=0)
    n_mels: int = Field(80, gt=0)
    f_min: float = Field(0.0, ge=0)
    f_max: Optional[float] = Field(8000.0, gt=0, description="None: half the sample rate")


class TextConfig(Section):
    language: str = Field("en-us", description="espeak-ng voice, e.g. en-us, de, fr-fr")
    phonemizer: Literal["espeak", "characters"] = "espeak"
    normalize: bool = True


class LossWeights(Section):
    mel: float = Field(1.0, ge=0)
    prior: float = Field(1.0, ge=0)
    duration: float = Field(1.0, ge=0)
    speaker: float = Field(0.0, ge=0, description="contrastive speaker loss (external speaker encoder)")
    kl: float = Field(1.0, ge=0, description="VITS: KL between the posterior and the flow-mapped prior")
    adversarial: float = Field(1.0, ge=0, description="GANs (VITS, vocoders): least-squares generator loss")
    feature_matching: float = Field(1.0, ge=0, description="GANs: L1 between discriminator features of real and generated audio")
    discriminator: float = Field(1.0, ge=0, description="GANs: least-squares discriminator loss")


class ModelConfig(Section):
    type: Literal[MODEL_TYPES] = "acoustic"
    hidden_channels: int = Field(192, gt=0)
    encoder_layers: int = Field(6, ge=1)
    encoder_heads: int = Field(2, ge=1)
    encoder_ffn_channels: int = Field(768, gt=0)
    encoder_kernel_size: int = Field(3, ge=1)
    decoder_layers: int = Field(6, ge=1)
    decoder_channels: int = Field(256, gt=0)
    decoder_kernel_size: int = Field(5, ge=1)
    duration_predictor_channels: int = Field(256, gt=0)
    dropout: float = Field(0.1, ge=0, lt=1)
    mel_loss: Literal["l1", "l2"] = "l1"
    speaker_embedding_dim: int = Field(64, gt=0, description="used when the corpus has several speakers")
    gst: bool = Field(False, description="global style tokens (reference encoder + token attention)")
    gst_tokens: int = Field(10, ge=1)
    gst_heads: int = Field(4, ge=1)
    speaker_encoder: Optional[str] = Field(None, description="TorchScript or ONNX speaker encoder; relative to this config file")
    freeze_speaker_encoder: bool = True
    loss_weights: LossWeights = Field(default_factory=LossWeights)
    # VITS (model.type=vits); the text encoder uses hidden_channels, encoder_* and dropout above.
    inter_channels: int = Field(192, gt=0, description="VITS: channels of the latent z (posterior, flow, decoder input)")
    posterior_layers: int = Field(16, ge=1, description="VITS: WaveNet layers of the posterior encoder")
    posterior_kernel_size: int = Field(5, ge=1)
    flow_layers: int = Field(4, ge=1, description="VITS: residual coupling blocks of the flow")
    flow_wavenet_layers: int = Field(4, ge=1)
    flow_kernel_size: int = Field(5, ge=1)
    stochastic_duration: bool = Field(True, description="VITS: stochastic duration predictor (False: deterministic)")
    resblock: Literal["1", "2"] = Field("2", description="HiFi-GAN residual block type: 1 (V1, Piper high), 2 (Piper x-low..medium)")
    resblock_kernel_sizes: list[int] = Field(default_factory=lambda: [3, 5, 7])
    resblock_dilation_sizes: list[list[int]] = Field(default_factory=lambda: [[1, 2], [2, 6], [3, 12]])
    upsample_rates: list[int] = Field(default_factory=lambda: [8, 8, 4], description="their product is audio.hop_length")
    upsample_kernel_sizes: list[int] = Field(default_factory=lambda: [16, 16, 8])
    upsample_initial_channel: int = Field(256, gt=0)
    segment_frames: int = Field(32, ge=1, description="VITS: frames of z decoded to audio per item per step (32 x hop 256 = 8192 samples)")
    discriminator_periods: list[int] = Field(default_factory=lambda: [2, 3, 5, 7, 11])
    multi_resolution_discriminator: bool = Field(False, description="add a multi-resolution (STFT) discriminator")
    max_phonemes: int = Field(400, ge=1, description="VITS: items with more phoneme ids are left out of training (reported)")
    # Vocoders (model.type=vocoder); HiFi-GAN uses the resblock/upsample fields above, both use discriminator_*.
    vocoder_generator: Literal["hifigan", "vocos"] = Field("hifigan", description="vocoder: HiFi-GAN (sizes above) or Vocos-style (ConvNeXt + inverse STFT)")
    vocoder_vocos_dim: int = Field(512, gt=0, description="Vocos: channels of the ConvNeXt backbone")
    vocoder_vocos_intermediate_channels: int = Field(1536, gt=0, description="Vocos: channels inside each ConvNeXt block")
    vocoder_vocos_layers: int = Field(8, ge=1, description="Vocos: ConvNeXt blocks")
    vocoder_segment_frames: int = Field(32, ge=1, description="vocoder: mel frames per item per step (32 x hop 256 = 8192 samples)")
    vocoder_discriminator_channel_divisor: int = Field(1, ge=1, description="vocoder: narrows the multi-period discriminator (1: HiFi-GAN's size; 4: ~15x cheaper, for CPU runs)")


class Stage2Config(Section):
    """The vocoder stage of `train --stage both|vocoder` on an acoustic run (RUN_DIR/vocoder/)."""

    max_steps: Optional[int] = Field(None, ge=1, description="vocoder steps; None: 1000 (light on a CPU)")
    lr: Optional[float] = Field(None, gt=0, description="vocoder learning rate; None: the vocoder preset's")
    batch_size: int = Field(8, ge=1)
    max_audio_seconds: float = Field(0.4, gt=0, description="audio per item per step (a random window)")
    vocoder_preset: str = Field("tiny", description="vocoder preset trained when init_from is not set")
    init_from: Optional[str] = Field(None, description="vocoder checkpoint (or vocoder run) to fine-tune, e.g. one trained on many speakers; relative to this config file")


class TrainConfig(Section):
    batch_size: int = Field(16, ge=1)
    learning_rate: float = Field(2e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = Field(0.0, ge=0)
    lr_schedule: Literal["constant", "exponential", "cosine_restarts", "warmup_cosine"] = "warmup_cosine"
    warmup_steps: int = Field(200, ge=0)
    lr_decay: float = Field(0.999875, gt=0, le=1, description="per-step factor of the exponential schedule")
    restart_steps: int = Field(2000, ge=1, description="first period of cosine_restarts")
    min_lr_ratio: float = Field(0.05, ge=0, le=1)
    max_steps: Optional[int] = Field(None, ge=1, description="None: the preset's default (never runs forever)")
    max_epochs: Optional[int] = Field(None, ge=1)
    max_minutes: Optional[float] = Field(None, gt=0, description="wall-clock budget of this invocation (e.g. the demo)")
    val_every_n_steps: int = Field(500, ge=1)
    checkpoint_every_n_steps: int = Field(500, ge=1)
    keep_last_k: int = Field(3, ge=0)
    best_metric: Literal["val_loss", "cer", "dnsmos", "cer_dnsmos"] = Field("val_loss", description="what best.ckpt follows: val_loss; cer; dnsmos (highest synthesis DNSMOS OVRL, as eval/dnsmos_shortfall = (5 - OVRL) / 4); cer_dnsmos (lowest mean of CER and that shortfall); all but val_loss need eval.every_n_steps")
    grad_clip_norm: Optional[float] = Field(1.0, gt=0)
    gradient_checkpointing: bool = False
    max_skipped_fraction: float = Field(0.05, ge=0, le=1)
    skip_window: int = Field(200, ge=1, description="the last N batches over which max_skipped_fraction is counted")
    max_consecutive_skipped: int = Field(10, ge=1)
    init_from: Optional[str] = Field(None, description="checkpoint whose weights start a fine-tune; relative to this config file")
    freeze: list[str] = Field(default_factory=list, description="parameter-name prefixes (e.g. enc_p, flow, dec) held fixed for the first train.freeze_steps steps: a fine-tune's warm-up, set by import-voice when the source lacks parts")
    freeze_steps: int = Field(0, ge=0, description="steps during which the parameters under train.freeze stay fixed")
    seed: int = 1234
    stage2: Stage2Config = Field(default_factory=Stage2Config)


class HardwareConfig(Section):
    accelerator: Literal["auto", "cpu", "cuda", "gpu", "mps"] = "auto"
    devices: Union[int, Literal["auto"]] = 1
    num_nodes: int = Field(1, ge=1)
    strategy: str = "auto"
    precision: Literal["32", "32-true", "bf16-mixed", "16-mixed"] = "32"
    compile: bool = False
    detect_anomaly: bool = False
    tf32: bool = True
    deterministic: bool = False
    cuda_launch_blocking: bool = False
    cuda_alloc_conf: Optional[str] = Field(None, description="PYTORCH_CUDA_ALLOC_CONF, set before CUDA starts")

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_as_text(cls, value: Any) -> Any:
        """YAML and --set read `32` as a number; Lightning's names are text."""
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class LoggingConfig(Section):
    tensorboard: bool = True
    csv: bool = True
    wandb: bool = False
    wandb_project: str = "voicesmith"
    mlflow: bool = False
    mlflow_tracking_uri: Optional[str] = None
    log_every_n_steps: int = Field(10, ge=1)
    progress_bar: bool = True
    profile: bool = Field(False, description="per-step timing of data wait, forward, backward, optimizer")
    memory: bool = Field(False, description="log allocated/reserved/peak memory and pressure")


DEFAULT_SAMPLE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Every voice tells a story of its own.",
]


class SamplesConfig(Section):
    every_n_steps: int = Field(500, ge=0, description="0: off")
    texts: list[str] = Field(default_factory=lambda: list(DEFAULT_SAMPLE_TEXTS))
    on_best: bool = True
    n_references: int = Field(2, ge=0, description="validation items synthesised next to their recordings")
    griffin_lim_iters: int = Field(32, ge=1)


class EvalConfig(Section):
    every_n_steps: int = Field(0, ge=0, description="0: off")
    limit: int = Field(8, ge=1)


class InferenceConfig(Section):
    """The voice's default synthesis settings (written to a Piper voice's `inference` block on export)."""

    noise_scale: float = Field(0.667, ge=0, description="VITS: spread of the prior sample (expressiveness)")
    length_scale: float = Field(1.0, gt=0, description="speaking time: above 1 slower, below 1 faster")
    noise_w: float = Field(0.8, ge=0, description="VITS: spread of the stochastic durations (rhythm variety)")


class VoiceConfig(Section):
    data: DataConfig
    audio: AudioConfig = Field(default_factory=AudioConfig)
    text: TextConfig = Field(default_factory=TextConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    hardware: HardwareConfig = Field(default_factory=HardwareConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    samples: SamplesConfig = Field(default_factory=SamplesConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    preset: Literal[ALL_PRESETS] = "small"

    _path: Optional[Path] = PrivateAttr(default=None)

    @property
    def path(self) -> Optional[Path]:
        """The file this config was loaded from or saved to, if any."""
        return self._path

    @property
    def base_dir(self) -> Path:
        """Relative paths resolve here: the config file's folder (the run directory)."""
        return self._path.parent if self._path is not None else Path.cwd()

    @property
    def run_dir(self) -> Path:
        return self.base_dir

    def resolve(self, path: Union[str, Path]) -> Path:
        """A path from this config, made absolute against the config file's folder."""
        path = Path(os.path.expanduser(str(path)))
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def save(self, path: Union[str, Path]) -> Path:
        """Write YAML atomically and remember the file, so relative paths keep their meaning."""
        from voicesmith.fileio import write_text

        path = Path(path)
        write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True))
        self._path = path.resolve()
        return path


# --- presets ---------------------------------------------------------------

_ACOUSTIC_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # About 1M parameters: trains on 2 CPU cores in minutes.
    "tiny": {
        "model": dict(hidden_channels=96, encoder_layers=2, encoder_heads=2, encoder_ffn_channels=256,
                      decoder_layers=2, decoder_channels=128, duration_predictor_channels=96, dropout=0.05,
                      speaker_embedding_dim=32),
        "train": dict(batch_size=16, learning_rate=2e-3, warmup_steps=50, max_steps=2000,
                      val_every_n_steps=100, checkpoint_every_n_steps=100, grad_clip_norm=5.0),
        "samples": dict(every_n_steps=200, griffin_lim_iters=16),
        "data": dict(max_seconds=15.0),
    },
    "small": {
        "model": dict(hidden_channels=192, encoder_layers=4, encoder_ffn_channels=768,
                      decoder_layers=4, decoder_channels=256, duration_predictor_channels=192),
        "train": dict(batch_size=16, learning_rate=5e-4, warmup_steps=200, max_steps=50_000,
                      val_every_n_steps=500, checkpoint_every_n_steps=500),
    },
    "medium": {
        "model": dict(hidden_channels=256, encoder_layers=6, encoder_ffn_channels=1024,
                      decoder_layers=6, decoder_channels=384, duration_predictor_channels=256),
        "train": dict(batch_size=32, learning_rate=3e-4, warmup_steps=1000, max_steps=200_000,
                      val_every_n_steps=1000, checkpoint_every_n_steps=1000),
    },
    "high": {
        "model": dict(hidden_channels=384, encoder_layers=6, encoder_heads=4, encoder_ffn_channels=1536,
                      decoder_layers=8, decoder_channels=512, duration_predictor_channels=384),
        "train": dict(batch_size=32, learning_rate=2e-4, warmup_steps=2000, max_steps=500_000,
                      val_every_n_steps=2000, checkpoint_every_n_steps=2000),
    },
}

# VITS trains like Piper: AdamW 2e-4, betas (0.8, 0.99), exponential decay every step, mel weight 45;
# audio as Piper's (no mel f_max). Clipping at 1000 only catches an explosion.
_VITS_TRAIN = dict(learning_rate=2e-4, betas=(0.8, 0.99), weight_decay=0.01, lr_schedule="exponential",
                   lr_decay=0.999875, warmup_steps=0, grad_clip_norm=1000.0)
_VITS_AUDIO = dict(sample_rate=22050, n_fft=1024, win_length=1024, hop_length=256, n_mels=80, f_min=0.0, f_max=None)
_VITS_16K_AUDIO = dict(_VITS_AUDIO, sample_rate=16000)
_PIPER_MEDIUM_DECODER = dict(resblock="2", resblock_kernel_sizes=[3, 5, 7],
                             resblock_dilation_sizes=[[1, 2], [2, 6], [3, 12]], upsample_rates=[8, 8, 4],
                             upsample_kernel_sizes=[16, 16, 8], upsample_initial_channel=256)
_PIPER_HIGH_DECODER = dict(resblock="1", resblock_kernel_sizes=[3, 7, 11],
                           resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]], upsample_rates=[8, 8, 2, 2],
                           upsample_kernel_sizes=[16, 16, 4, 4], upsample_initial_channel=512)
_VITS_LOSS_WEIGHTS = dict(mel=45.0, kl=1.0, duration=1.0, adversarial=1.0, feature_matching=1.0, discriminator=1.0)


def _vits_model(hidden: int, filter_channels: int, decoder: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Piper's text encoder (2 heads, 6 layers, kernel 3), posterior encoder (16 layers) and flow (4 x 4)."""
    model = dict(hidden_channels=hidden, inter_channels=hidden, encoder_ffn_channels=filter_channels,
                 encoder_heads=2, encoder_layers=6, encoder_kernel_size=3, dropout=0.1,
                 duration_predictor_channels=hidden, speaker_embedding_dim=512,
                 loss_weights=dict(_VITS_LOSS_WEIGHTS), **decoder)
    return {**model, **extra}


_VITS_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # A few hundred thousand generator parameters and a slim discriminator: for tests and a first look on a CPU.
    "tiny": {
        "audio": _VITS_AUDIO,
        "model": _vits_model(64, 192, dict(_PIPER_MEDIUM_DECODER, upsample_initial_channel=64),
                             encoder_layers=2, posterior_layers=4, flow_layers=2, flow_wavenet_layers=2,
                             speaker_embedding_dim=64, segment_frames=16, discriminator_periods=[2, 3, 5]),
        "train": dict(_VITS_TRAIN, batch_size=8, learning_rate=3e-4, max_steps=2000, val_every_n_steps=200,
                      checkpoint_every_n_steps=200),
        "samples": dict(every_n_steps=200),
        "data": dict(max_seconds=15.0),
    },
    "x-low": {"audio": _VITS_16K_AUDIO, "model": _vits_model(96, 384, _PIPER_MEDIUM_DECODER),
              "train": dict(_VITS_TRAIN, batch_size=32, max_steps=500_000)},
    "low": {"audio": _VITS_16K_AUDIO, "model": _vits_model(192, 768, _PIPER_MEDIUM_DECODER),
            "train": dict(_VITS_TRAIN, batch_size=32, max_steps=500_000)},
    "medium": {"audio": _VITS_AUDIO, "model": _vits_model(192, 768, _PIPER_MEDIUM_DECODER),
               "train": dict(_VITS_TRAIN, batch_size=32, max_steps=1_000_000)},
    "high": {"audio": _VITS_AUDIO, "model": _vits_model(192, 768, _PIPER_HIGH_DECODER),
             "train": dict(_VITS_TRAIN, batch_size=16, max_steps=1_000_000)},
}

# Vocoders train like HiFi-GAN (AdamW 2e-4, betas (0.8, 0.99), exponential decay, mel weight 45) on
# random windows of the cached audio. HiFi-GAN V1 and V3 are exactly Piper's high and medium decoders.
# They have no text to speak on their own: samples come from a two-stage run (train --stage both).
_VOCODER_TRAIN = dict(_VITS_TRAIN, weight_decay=0.0)
_VOCODER_COMMON: dict[str, dict[str, Any]] = {"samples": dict(every_n_steps=0, on_best=False)}


def _vocoder_preset(model: dict[str, Any], **train: Any) -> dict[str, dict[str, Any]]:
    model = dict(loss_weights=dict(_VITS_LOSS_WEIGHTS), **model)
    return {**_VOCODER_COMMON, "model": model, "train": dict(_VOCODER_TRAIN, **train)}


_VOCOS = dict(vocoder_generator="vocos", vocoder_segment_frames=64)
_VOCODER_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # A small Vocos-style generator and a slim discriminator: fine-tunes in minutes on a CPU.
    "tiny": _vocoder_preset(dict(_VOCOS, vocoder_vocos_dim=128, vocoder_vocos_intermediate_channels=384,
                                 vocoder_vocos_layers=4, vocoder_segment_frames=32, discriminator_periods=[2, 3, 5],
                                 vocoder_discriminator_channel_divisor=4),
                            batch_size=8, learning_rate=5e-4, max_steps=2000, val_every_n_steps=200,
                            checkpoint_every_n_steps=200),
    "hifigan-v1": _vocoder_preset(_PIPER_HIGH_DECODER, batch_size=16, max_steps=1_000_000),
    "hifigan-v2": _vocoder_preset(dict(_PIPER_HIGH_DECODER, upsample_initial_channel=128), batch_size=16,
                                  max_steps=1_000_000),
    "hifigan-v3": _vocoder_preset(_PIPER_MEDIUM_DECODER, batch_size=16, max_steps=1_000_000),
    "vocos": _vocoder_preset(dict(_VOCOS, multi_resolution_discriminator=True), batch_size=16,
                             learning_rate=5e-4, max_steps=1_000_000),
}

_PRESET_OVERRIDES: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    "acoustic": _ACOUSTIC_PRESETS, "vits": _VITS_PRESETS, "vocoder": _VOCODER_PRESETS}


def default_preset(model_type: str, cuda: Optional[bool] = None) -> str:
    """The preset `voicesmith init` takes when none is given: the first of `preset_choice`."""
    return preset_choice(model_type, cuda)[0]


def preset_choice(model_type: str, cuda: Optional[bool] = None) -> tuple[str, str]:
    """(preset, why) for this machine. A CUDA GPU gets the model type's standard preset; a machine
    without one gets tiny, which trains in minutes on a few CPU cores where the standard presets
    would take days. `cuda`: None asks torch, imported here only (`voicesmith --help` never loads it)."""
    standard = {"acoustic": "small", "vits": "medium"}.get(model_type, PRESETS[model_type][0])
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if cuda:
        return standard, f"a CUDA GPU is available, so the {model_type} model's standard preset"
    return "tiny", (f"no CUDA GPU on this machine, and tiny trains in minutes on the CPU where the standard "
                    f"preset ({standard}) wants a GPU; choose another with --preset")


def preset_dict(preset: str, dataset: str, model_type: str = "acoustic") -> dict[str, Any]:
    """The raw config of a preset, before validation."""
    if model_type not in PRESETS:
        raise ConfigError(f"Unknown model type {model_type!r}; choose one of {', '.join(MODEL_TYPES)}.")
    overrides = _PRESET_OVERRIDES[model_type]
    if preset not in overrides:
        raise ConfigError(f"Unknown preset {preset!r} for a {model_type} model; choose one of "
                          f"{', '.join(PRESETS[model_type])}.")
    raw: dict[str, Any] = {"preset": preset, "data": {"dataset": dataset}, "model": {"type": model_type}}
    for section, values in copy.deepcopy(overrides[preset]).items():
        raw.setdefault(section, {}).update(values)
    return raw


def make_config(dataset: str, preset: str = "small", model_type: str = "acoustic") -> VoiceConfig:
    return validate_config(preset_dict(preset, dataset, model_type), source=f"preset {preset!r}")


# --- loading, overrides, errors ---------------------------------------------

def load_config(path: Union[str, Path], overrides: Optional[list[str]] = None,
                env: Optional[dict[str, str]] = None) -> VoiceConfig:
    """Read a YAML config, apply environment and `--set KEY=VALUE` overrides, validate.

    Precedence, lowest first: file, environment (VOICESMITH_<SECTION>_<KEY>), --set.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file {path} does not exist. Create one with "
                          f"`voicesmith init DATASET RUN_DIR` or pass the path to an existing config.yaml.")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Config file {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"Config file {path} must hold a mapping of sections (data:, model:, train:, ...); "
                          f"found {type(raw).__name__}.")
    apply_env_overrides(raw, os.environ if env is None else env)
    for item in overrides or []:
        apply_override(raw, item)
    config = validate_config(raw, source=str(path))
    config._path = path.resolve()
    return config


def validate_config(raw: dict[str, Any], source: str) -> VoiceConfig:
    try:
        return VoiceConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source)) from None


def describe_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"Invalid config in {source}:"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            section = _section_of(error["loc"][:-1])
            allowed = ", ".join(sorted(section.model_fields)) if section else ""
            lines.append(f"  - unknown key '{key}'. Allowed here: {allowed}.")
        elif error["type"] == "missing":
            lines.append(f"  - '{key}' is required.")
        else:
            lines.append(f"  - '{key}' = {error.get('input')!r}: {error['msg']}.")
    return "\n".join(lines)


def _section_of(loc: tuple) -> Optional[type[BaseModel]]:
    """The pydantic model that owns a dotted location, to list its allowed keys."""
    model: type[BaseModel] = VoiceConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `section.key=value`; the value is read as YAML (8 -> int, true -> bool, [a, b] -> list)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.batch_size=8")
    parts = key.split(".")
    if len(parts) < 2:
        raise ConfigError(f"--set {item!r}: the key needs its section, e.g. train.{key}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {item!r}: '{part}' is a value, not a section.")
        node = child
    node[parts[-1]] = value


_ENV_SECTIONS = tuple(name for name, field in VoiceConfig.model_fields.items()
                      if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel))


def apply_env_overrides(raw: dict[str, Any], env: "os._Environ[str] | dict[str, str]") -> list[str]:
    """VOICESMITH_<SECTION>_<KEY>=VALUE, e.g. VOICESMITH_HARDWARE_PRECISION=bf16-mixed."""
    applied = []
    for name, text in sorted(env.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        section, _, key = name[len(ENV_PREFIX):].lower().partition("_")
        if section not in _ENV_SECTIONS or not key:
            continue
        apply_override(raw, f"{section}.{key}={text}")
        applied.append(name)
    return applied


def init_run(dataset: Path, run_dir: Path, model_type: str = "acoustic", preset: Optional[str] = None,
             overrides: Optional[list[str]] = None, force: bool = False) -> Path:
    """Write RUN_DIR/config.yaml for DATASET, with the dataset path relative to that file."""
    dataset, run_dir = Path(dataset), Path(run_dir)
    if not dataset.exists():
        raise ConfigError(f"Dataset {dataset} does not exist. Give a corpus folder (LJSpeech or VCTK layout) "
                          f"or a filelist; `voicesmith demo-corpus DIR` makes one to try.")
    path = run_dir / "config.yaml"
    if path.exists() and not force:
        raise ConfigError(f"{path} already exists; pass --force to overwrite it, or train with it as it is.")
    run_dir.mkdir(parents=True, exist_ok=True)
    raw = preset_dict(preset or default_preset(model_type), os.path.relpath(dataset.resolve(), run_dir.resolve()),
                      model_type)
    for item in overrides or []:
        apply_override(raw, item)
    validate_config(raw, source="voicesmith init").save(path)
    return path
