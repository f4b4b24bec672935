"""Environment preflight: can this machine train, and if not, what to do about it.

Each check returns ok / warn / fail with the fix. Only a `fail` makes the
machine unable to train (exit 1); warnings are things worth knowing.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Optional

MIN_PYTHON = (3, 10)
MIN_FREE_DISK_GB = 2.0
MIN_FREE_MEMORY_GB = 2.0
OPTIONAL_EXTRAS = {"onnx": "export", "onnxruntime": "export", "pocketsphinx": "eval", "jiwer": "eval",
                   "wandb": "logging to Weights & Biases", "mlflow": "logging to MLflow"}


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def check_python() -> Check:
    version = platform.python_version()
    if sys.version_info < MIN_PYTHON:
        return Check("python", "fail", version, "install Python 3.10 or newer")
    return Check("python", "ok", version)


def check_torch() -> Check:
    try:
        import torch
    except ImportError as exc:
        return Check("torch", "fail", f"not importable ({exc})",
                     "pip install torch (the build for your machine), then reinstall voicesmith")
    try:
        import lightning
    except ImportError:
        return Check("torch", "fail", f"torch {torch.__version__}, lightning missing", "pip install lightning")
    return Check("torch", "ok", f"torch {torch.__version__}, lightning {lightning.__version__}, "
                                f"{torch.get_num_threads()} CPU threads")


def check_accelerators() -> list[Check]:
    import torch

    checks = [Check("cpu", "ok", f"{platform.machine()}, precision 32 and bf16-mixed")]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            name = torch.cuda.get_device_name(index)
            major, minor = torch.cuda.get_device_capability(index)
            precisions = ["32", "16-mixed"] + (["bf16-mixed"] if major >= 8 else [])
            checks.append(Check(f"cuda:{index}", "ok", f"{name} (sm_{major}{minor}), precision {', '.join(precisions)}"))
    else:
        checks.append(Check("cuda", "ok", "no CUDA GPU seen; training runs on the CPU (tiny/small presets)"))
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        checks.append(Check("mps", "ok", "Apple GPU, precision 32 and 16-mixed"))
    return checks


def check_espeak() -> Check:
    try:
        from voicesmith.text import Phonemizer
        from voicesmith.text.espeak import library_path, speak

        phonemes = Phonemizer("en-us", "espeak").phonemize("Hello world.")
        audio, sample_rate = speak("Hello.")
    except Exception as exc:  # any failure here means "cannot phonemize": report it, do not crash the doctor
        return Check("espeak-ng", "fail", f"{type(exc).__name__}: {exc}",
                     "reinstall espeakng-loader and phonemizer (pip install --force-reinstall espeakng-loader phonemizer)")
    if not phonemes.strip() or audio.size == 0:
        return Check("espeak-ng", "fail", "loaded but produced no phonemes or no audio",
                     "reinstall espeakng-loader")
    return Check("espeak-ng", "ok", f"bundled library {library_path().name}: 'Hello world.' -> {phonemes.strip()}; "
                                    f"speaks at {sample_rate} Hz")


def check_disk(folder: Path) -> Check:
    free_gb = shutil.disk_usage(_existing_parent(folder)).free / 1e9
    if free_gb < MIN_FREE_DISK_GB:
        return Check("disk", "warn", f"{free_gb:.1f} GB free at {folder}",
                     f"free at least {MIN_FREE_DISK_GB:.0f} GB for the feature cache and checkpoints")
    return Check("disk", "ok", f"{free_gb:.0f} GB free at {folder}")


def check_memory() -> Check:
    import psutil

    memory = psutil.virtual_memory()
    detail = f"{memory.available / 1e9:.1f} GB available of {memory.total / 1e9:.1f} GB"
    if memory.available / 1e9 < MIN_FREE_MEMORY_GB:
        return Check("memory", "warn", detail, "close other programs or use the tiny preset and a smaller batch")
    return Check("memory", "ok", detail)


def check_workers() -> Check:
    """Start a real DataLoader worker under `spawn`, the start method of Windows and macOS."""
    import multiprocessing

    import torch
    from torch.utils.data import DataLoader

    started = time.perf_counter()
    try:
        loader = DataLoader(list(range(4)), batch_size=2, num_workers=1, multiprocessing_context="spawn")
        batches = [batch.tolist() for batch in loader]
    except Exception as exc:  # the doctor's job is to turn this into advice
        return Check("dataloader workers", "fail", f"a spawn worker did not start: {exc}",
                     "set data.num_workers=0 in the config to load data in the main process")
    if batches != [[0, 1], [2, 3]]:
        return Check("dataloader workers", "fail", f"spawn worker returned {batches}", "set data.num_workers=0")
    seconds = time.perf_counter() - started
    default = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_start_method()
    return Check("dataloader workers", "ok", f"default start method {default}; a spawn worker started in "
                                             f"{seconds:.1f} s (torch {torch.__version__})")


def check_writable(folder: Path) -> Check:
    target = _existing_parent(folder)
    probe = target / f".voicesmith-write-test-{time.time_ns()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return Check("run folder", "fail", f"cannot write to {target}: {exc.strerror}",
                     "choose a run folder you can write to")
    return Check("run folder", "ok", f"writable: {target}")


def check_extras() -> list[Check]:
    checks = []
    for module, purpose in OPTIONAL_EXTRAS.items():
        if find_spec(module) is not None:
            checks.append(Check(f"extra {module}", "ok", f"installed ({purpose})"))
        else:
            extra = f"pip install 'voicesmith[{purpose}]'" if purpose in ("export", "eval") else f"pip install {module}"
            checks.append(Check(f"extra {module}", "warn", f"not installed; needed for {purpose}", extra))
    return checks


def check_config(config_path: Path) -> list[Check]:
    from voicesmith.config import load_config
    from voicesmith.errors import VoicesmithError

    try:
        config = load_config(config_path)
    except VoicesmithError as exc:
        return [Check("config", "fail", str(exc), "fix the config file")]
    checks = [Check("config", "ok", str(config_path))]
    for key, value in (("data.dataset", config.data.dataset), ("model.speaker_encoder", config.model.speaker_encoder),
                       ("train.init_from", config.train.init_from)):
        if value is None:
            continue
        path = config.resolve(value)
        if path.exists():
            checks.append(Check(key, "ok", str(path) + _outside_note(path, config.base_dir)))
        else:
            checks.append(Check(key, "fail", f"{path} does not exist (from {key}: {value!r}, relative to "
                                             f"{config.base_dir})", f"fix {key} in {config_path}"))
    checks.append(check_writable(config.resolve(config.data.cache_dir)))
    return checks


def _outside_note(path: Path, run_dir: Path) -> str:
    """Paths that leave the run directory are said so: moving or sharing the run folder does not take them along."""
    return "" if path.resolve().is_relative_to(run_dir.resolve()) else " (outside the run directory)"


def _existing_parent(folder: Path) -> Path:
    folder = Path(folder).resolve()
    while not folder.exists():
        folder = folder.parent
    return folder


def run_checks(config_path: Optional[Path] = None) -> list[Check]:
    folder = Path(config_path).parent if config_path else Path.cwd()
    checks = [check_python(), check_torch()]
    if checks[-1].status == "fail":
        return checks  # nothing below works without torch
    checks += check_accelerators()
    checks += [check_espeak(), check_disk(folder), check_memory(), check_workers(), check_writable(folder)]
    checks += check_extras()
    if config_path is not None:
        checks += check_config(Path(config_path))
    return checks


def doctor_command(config_path: Optional[Path] = None, as_json: bool = False) -> int:
    checks = run_checks(config_path)
    can_train = all(check.status != "fail" for check in checks)
    if as_json:
        print(json.dumps({"can_train": can_train, "checks": [asdict(check) for check in checks]}, indent=2))
    else:
        for check in checks:
            fix = f"\n       fix: {check.fix}" if check.fix and check.status != "ok" else ""
            print(f"{check.status:<5}{check.name:<22}{check.detail}{fix}")
        print("This machine can train." if can_train else "This machine cannot train yet: fix the lines marked fail.")
    return 0 if can_train else 1
