"""Published VITS voices -> voicesmith runs to fine-tune (`voicesmith import-voice`).

One module per source reads it into a `VoiceSource` (tensors under voicesmith's names, settings,
symbols); `mapping` fills the model and accounts for every tensor; `voice_run` writes the run.
- `piper_checkpoint`: Piper's Lightning `.ckpt` (+ config.json or NAME.onnx.json)
- `piper_onnx`: a Piper voice published as `NAME.onnx` + `NAME.onnx.json`
- `transformers_vits`: a transformers `VitsModel` folder (MMS-TTS layout)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from voicesmith.errors import UserInputError

if TYPE_CHECKING:
    from voicesmith.importers.voice_run import ImportResult, VoiceSource


def read_source(path: Path) -> "VoiceSource":
    """The importer for what `path` is: a .ckpt, a .onnx, or a transformers folder (config.json + weights)."""
    path = Path(path)
    if not path.exists():
        raise UserInputError(f"{path} does not exist. Pass a Piper checkpoint (.ckpt), a Piper voice (.onnx with its "
                             f".onnx.json) or a transformers VitsModel folder.")
    if path.suffix == ".ckpt":
        from voicesmith.importers.piper_checkpoint import read_piper_checkpoint

        return read_piper_checkpoint(path)
    if path.suffix == ".onnx":
        from voicesmith.importers.piper_onnx import read_piper_onnx

        return read_piper_onnx(path)
    if path.is_dir() and (path / "config.json").is_file():
        from voicesmith.importers.transformers_vits import read_transformers_vits

        return read_transformers_vits(path)
    raise UserInputError(f"{path} is not a voice import-voice reads: expected a Piper checkpoint (.ckpt), a Piper "
                         f"voice (.onnx with its .onnx.json beside it) or a transformers VitsModel folder "
                         f"(config.json, model.safetensors, vocab.json).")


def import_voice(source: Path, run_dir: Path, dataset: Optional[Path] = None) -> "ImportResult":
    """Read `source`, and write RUN_DIR as a run that `voicesmith train` fine-tunes on `dataset`."""
    from voicesmith.importers.voice_run import write_voice_run

    return write_voice_run(read_source(source), run_dir, dataset)
