"""Two-stage training of an acoustic run: the acoustic model, then a vocoder fine-tuned on its mels.

`train --stage both` trains RUN_DIR's acoustic model, then a vocoder in RUN_DIR/vocoder/ (its own
config.yaml, checkpoints, logs, samples and summary.json, so each stage resumes alone). The vocoder
learns from the acoustic model's teacher-forced mels (its prediction along the MAS alignment of each
recording) against the recorded audio, so it learns to clean up the acoustic model's errors.
`train.stage2.*` sets the second stage; `init_from` fine-tunes an existing vocoder (e.g. one trained
on many speakers) instead of starting one from the `vocoder_preset`. RUN_DIR/summary.json reports
both stages under `stages`. Afterwards the voice speaks through that vocoder (voicesmith.vocoding).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback

from voicesmith.config import VoiceConfig, preset_dict, validate_config
from voicesmith.errors import ConfigError, UserInputError
from voicesmith.fileio import atomic_write_json
from voicesmith.inference import Synthesizer
from voicesmith.training.samples import SamplesCallback
from voicesmith.vocoding import (GRIFFIN_LIM, Vocoder, check_audio_settings, read_vocoder_checkpoint,
                                 run_vocoder_dir)

log = logging.getLogger("voicesmith")

SUMMARY = "summary.json"
DEFAULT_STAGE2_STEPS = 1000  # train.stage2.max_steps when unset: minutes of a tiny vocoder on a CPU


def single_stage(config: VoiceConfig, stage: Optional[str]) -> bool:
    """True when `stage` means training this config's own model alone; refuses stages that do not apply."""
    kind = config.model.type
    if kind == "acoustic":
        return stage == "acoustic" or (stage is None and config.train.stage2.max_steps is None)
    if stage in (None, "both", kind):
        return True
    raise ConfigError(f"--stage {stage} does not apply to a {kind} run ({config.path}): stages are for acoustic "
                      f"runs (acoustic model, then vocoder). Leave out --stage.")


def train_stages(config: VoiceConfig, stage: Optional[str], resume: str = "auto", max_steps: Optional[int] = None,
                 max_epochs: Optional[int] = None, max_samples: Optional[int] = None,
                 callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """`--stage both` (or unset with train.stage2.max_steps set): both stages; `--stage vocoder`: the second.

    The limits and callbacks given apply to the acoustic stage; the vocoder stage follows train.stage2.
    """
    from voicesmith.training.run import train

    if stage == "vocoder":
        base = _previous_summary(config.run_dir)
        stages = {name: value for name, value in base.get("stages", {}).items() if name != "vocoder"}
    else:
        base = train(config, resume=resume, max_steps=max_steps, max_epochs=max_epochs, max_samples=max_samples,
                     stage="acoustic", callbacks=callbacks)
        stages = {"acoustic": _digest(base)}
        if base["status"] != "completed":
            return _record(config, base, stages)
    vocoder_resume = resume if resume in ("auto", "never") else "auto"  # a PATH names an acoustic checkpoint
    try:
        stages["vocoder"] = train_vocoder_stage(config, vocoder_resume, max_samples)
    except BaseException:
        stages["vocoder"] = _previous_summary(run_vocoder_dir(config.run_dir)) or {"status": "failed"}
        _record(config, base, stages)
        raise
    return _record(config, base, stages)


def train_vocoder_stage(config: VoiceConfig, resume: str = "auto", max_samples: Optional[int] = None) -> dict[str, Any]:
    """Fine-tune the run's vocoder on its acoustic model's teacher-forced mels; RUN_DIR/vocoder/summary.json."""
    from voicesmith.models import build_model
    from voicesmith.training.run import train

    acoustic = load_acoustic(config.run_dir)
    stage_config = vocoder_stage_config(config)
    vocoder = build_model(stage_config.model, len(acoustic.symbols), stage_config.audio.n_mels,
                          audio_cfg=stage_config.audio)
    vocoder.set_teacher(acoustic.model)
    log.info("Vocoder stage: %s vocoder in %s, %d steps, on the mels of %s.", stage_config.model.vocoder_generator,
             stage_config.run_dir, stage_config.train.max_steps, config.run_dir)
    samples = [VocoderStageSamples(acoustic, stage_config.model_copy(update={"samples": config.samples}),
                                   stage_config.run_dir / "samples")]
    return train(stage_config, resume=resume, max_samples=max_samples, model=vocoder,
                 callbacks=samples if config.samples.every_n_steps or config.samples.on_best else ())


def load_acoustic(run_dir: Path) -> Synthesizer:
    """The acoustic voice of stage 1 (best.ckpt, else last.ckpt) with Griffin-Lim, or a clear refusal."""
    try:
        return Synthesizer.load(run_dir, vocoder=GRIFFIN_LIM)
    except UserInputError as exc:
        raise UserInputError(f"The vocoder stage needs the run's trained acoustic model: {exc} Train it first with "
                             f"`voicesmith train {run_dir / 'config.yaml'} --stage both`.") from None


def vocoder_stage_config(config: VoiceConfig) -> VoiceConfig:
    """RUN_DIR/vocoder/config.yaml: the run's data, audio and hardware, a vocoder model, train.stage2's limits."""
    stage2, folder = config.train.stage2, run_vocoder_dir(config.run_dir)
    raw = preset_dict(stage2.vocoder_preset, _relative_to(config.resolve(config.data.dataset), folder), "vocoder")
    train = raw["train"]
    if stage2.init_from:
        path, _, source = read_vocoder_checkpoint(config.resolve(stage2.init_from))
        check_audio_settings(source.audio, config.audio, str(path), str(config.path))
        raw["model"] = source.model.model_dump(mode="json")
        train["init_from"] = str(path)
    raw["model"]["vocoder_segment_frames"] = max(1, round(stage2.max_audio_seconds * config.audio.sample_rate
                                                          / config.audio.hop_length))
    train.update(batch_size=stage2.batch_size, max_steps=stage2.max_steps or DEFAULT_STAGE2_STEPS,
                 seed=config.train.seed)
    if stage2.lr is not None:
        train["learning_rate"] = stage2.lr
    raw["data"] = {**config.data.model_dump(mode="json"), "dataset": raw["data"]["dataset"],
                   "cache_dir": _relative_to(config.resolve(config.data.cache_dir), folder)}
    raw.update(audio=config.audio.model_dump(mode="json"), hardware=config.hardware.model_dump(mode="json"),
               logging=config.logging.model_dump(mode="json"),
               samples=dict(config.samples.model_dump(mode="json"), every_n_steps=0, on_best=False))
    stage_config = validate_config(raw, source=f"the vocoder stage of {config.path}")
    stage_config.save(folder / "config.yaml")
    return stage_config


class VocoderStageSamples(SamplesCallback):
    """Samples of the vocoder stage: the run's acoustic voice speaking through the vocoder being trained."""

    def __init__(self, acoustic: Synthesizer, config: VoiceConfig, folder: Path):
        super().__init__(config, folder)
        self.acoustic = acoustic

    def _synthesizer(self, pl_module, model) -> Synthesizer:
        voice = self.acoustic
        live = Vocoder(model.generator, voice.config.audio, "the vocoder being trained")
        return Synthesizer.from_model(voice.model, voice.config, voice.symbols, voice.speaker_ids, vocoder=live)


def _relative_to(path: Path, folder: Path) -> str:
    return os.path.relpath(path, folder.resolve())


def _previous_summary(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / SUMMARY
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _digest(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("status", "reason", "start_step", "global_step", "checkpoint", "best_checkpoint", "last_losses")
    return {key: summary.get(key) for key in keys}


def _record(config: VoiceConfig, base: dict[str, Any], stages: dict[str, Any]) -> dict[str, Any]:
    """RUN_DIR/summary.json with `stages`; the status is the first stage's that did not complete, if any."""
    summary = {**(base or stages.get("vocoder", {})), "stages": stages}
    unfinished = next(((name, stage) for name, stage in stages.items() if stage.get("status") != "completed"), None)
    if unfinished is not None:
        name, stage = unfinished
        summary.update(status=stage.get("status"), reason=f"{name} stage: {stage.get('reason')}")
    elif len(stages) > 1:
        summary["reason"] = "; ".join(f"{name}: {stage.get('reason')}" for name, stage in stages.items())
    if rank_zero_only.rank == 0:
        atomic_write_json(config.run_dir / SUMMARY, summary, indent=2)
    return summary
