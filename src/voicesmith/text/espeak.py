"""espeak-ng speech through the library that espeakng-loader bundles.

No system install is needed, so the demo corpus (the project's test data)
can be spoken on any machine. The library keeps global state, so one
process-wide handle is created lazily and guarded by a lock.
"""

from __future__ import annotations

import ctypes
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1
_PARAM_RATE, _PARAM_VOLUME, _PARAM_PITCH = 1, 2, 3
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
_RANDOM_SEED = 1234
_lock = threading.Lock()


def library_path() -> Path:
    import espeakng_loader

    return Path(espeakng_loader.get_library_path())


def data_path() -> Path:
    import espeakng_loader

    return Path(espeakng_loader.get_data_path())


class _Espeak:
    """The loaded library, initialised for synchronous synthesis into memory."""

    def __init__(self) -> None:
        self.lib = ctypes.cdll.LoadLibrary(str(library_path()))
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.sample_rate = self.lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, str(data_path()).encode(), 0)
        if self.sample_rate <= 0:
            raise RuntimeError(f"espeak-ng could not start with its data at {data_path()} "
                               f"(espeak_Initialize returned {self.sample_rate}).")
        self.chunks: list[np.ndarray] = []
        self.callback = _SYNTH_CALLBACK(self._collect)  # kept alive as long as the library
        self.lib.espeak_SetSynthCallback(self.callback)

    def _collect(self, wav, n_samples, events) -> int:
        if n_samples > 0:
            self.chunks.append(np.ctypeslib.as_array(wav, shape=(n_samples,)).copy())
        return 0

    def speak(self, text: str, voice: str, rate_wpm: int, pitch: int) -> np.ndarray:
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r} (try en-us, en-gb, de, fr-fr, es; "
                             f"add a variant with +, e.g. en-us+f3).")
        self.lib.espeak_SetParameter(_PARAM_RATE, int(rate_wpm), 0)
        self.lib.espeak_SetParameter(_PARAM_PITCH, int(pitch), 0)
        self.lib.espeak_ng_SetRandSeed(ctypes.c_long(_RANDOM_SEED))  # same text, same samples
        self.chunks = []
        encoded = text.encode("utf-8") + b"\0"
        status = self.lib.espeak_Synth(ctypes.c_char_p(encoded), len(encoded), 0, 0, 0, _CHARS_UTF8, None, None)
        if status != 0:
            raise RuntimeError(f"espeak-ng failed to speak {text[:40]!r} (status {status}).")
        self.lib.espeak_Synchronize()
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.int16)


@lru_cache(maxsize=1)
def _engine() -> _Espeak:
    return _Espeak()


def speak(text: str, voice: str = "en-us", rate_wpm: int = 160, pitch: int = 50) -> tuple[np.ndarray, int]:
    """Speak `text` with an espeak-ng voice; returns int16 mono samples and their sample rate."""
    with _lock:
        engine = _engine()
        return engine.speak(text, voice, rate_wpm, pitch), engine.sample_rate
