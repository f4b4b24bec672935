"""The typed config of a run: plain data, saved as YAML next to the run.

Every relative path in a config file resolves against the folder of that file,
never against the current directory, so a run can be started from anywhere.
Unknown keys and wrong types are refused with the key's dotted name, the value
and what is allowed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from voicesmith.errors import ConfigError

PRESETS = ("tiny", "small", "medium", "high")
MODEL_TYPES = ("acoustic", "vits", "vocoder")
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


class Stage2Config(Section):
    max_steps: Optional[int] = Field(None, ge=1)


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
    best_metric: Literal["val_loss", "cer"] = "val_loss"
    grad_clip_norm: Optional[float] = Field(1.0, gt=0)
    gradient_checkpointing: bool = False
    max_skipped_fraction: float = Field(0.05, ge=0, le=1)
    skip_window: int = Field(200, ge=1, description="the last N batches over which max_skipped_fraction is counted")
    max_consecutive_skipped: int = Field(10, ge=1)
    init_from: Optional[str] = Field(None, description="checkpoint whose weights start a fine-tune; relative to this config file")
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
    preset: Literal[PRESETS] = "small"

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
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True), encoding="utf-8")
        tmp.replace(path)
        self._path = path.resolve()
        return path


# --- presets ---------------------------------------------------------------

_PRESET_OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
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


def preset_dict(preset: str, dataset: str, model_type: str = "acoustic") -> dict[str, Any]:
    """The raw config of a preset, before validation."""
    if preset not in PRESETS:
        raise ConfigError(f"Unknown preset {preset!r}; choose one of {', '.join(PRESETS)}.")
    raw: dict[str, Any] = {"preset": preset, "data": {"dataset": dataset}, "model": {"type": model_type}}
    for section, values in _PRESET_OVERRIDES[preset].items():
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


def init_run(dataset: Path, run_dir: Path, model_type: str = "acoustic", preset: str = "small",
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
    raw = preset_dict(preset, os.path.relpath(dataset.resolve(), run_dir.resolve()), model_type)
    for item in overrides or []:
        apply_override(raw, item)
    validate_config(raw, source="voicesmith init").save(path)
    return path
