"""DNSMOS: how natural a clip sounds, predicted from the clip alone, offline.

Intelligibility (CER) cannot tell a buzzy Griffin-Lim voice from a clean neural one when both are
understood. Microsoft's DNSMOS predicts the mean opinion score listeners would give a clip, with
no reference recording, from two small ONNX models that the `speechmos` package (MIT) ships:

- P.835 (`sig_bak_ovr.onnx`): raw 16 kHz waveform windows -> SIG (the speech itself), BAK (the
  background) and OVRL (overall), each mapped to the 1-5 scale by its authors' polynomial;
- P.808 (`model_v8.onnx`): log-mel windows -> an overall MOS.

Only the model files are taken from the package (found with importlib.resources); the features,
windows and mapping are computed here with numpy and soxr, and onnxruntime runs the models. The
definition is the package's (`speechmos.dnsmos`, checked against it in tests/test_dnsmos.py):

- mono float audio in [-1, 1] (beyond is clipped), resampled to 16 kHz with soxr;
- a clip shorter than 9.01 s is repeated (doubled until it is long enough);
- windows of 9.01 s (144160 samples) every 1 s, max(1, whole seconds - 9) of them; each score is
  the mean over the windows;
- P.808 features of a window: its first 144000 samples, centred STFT (n_fft 321, periodic Hann
  of 321, hop 160, zero padding) -> 900 frames, power, 120 slaney mel bands (0-8 kHz) on the
  FFT's own bin frequencies k * 16000 / 321, dB relative to the window's maximum floored 80 dB
  below it (power floor 1e-10), then (dB + 40) / 40.

Two differences, both deliberate: the package computes window bounds in floating point, so in
clips of 17 s or more windows 8-24 (and 120-123) come out one sample short and it skips them
silently; here every window counts. And librosa before 0.10 (which the package names as its
prerequisite) put the bins of an odd-sized FFT at linspace(0, 8000, 161) instead; on the demo
corpus that moves P.808 by up to 0.17. This module follows the package as it runs with today's
librosa, which is what numbers published now are computed with; P.835 is unaffected (waveform).

The scores rank clips of the same kind well (one voice over training, one vocoder against another
on the same texts); they are not listener MOS, and absolute values across speakers, languages or
recording set-ups are not comparable.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from importlib.util import find_spec
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import soxr

from voicesmith.errors import UserInputError
from voicesmith.melscale import slaney_filterbank

SAMPLE_RATE = 16_000
WINDOW_SAMPLES = 144_160  # 9.01 s
HOP_SAMPLES = SAMPLE_RATE  # 1 s
P808_SAMPLES = WINDOW_SAMPLES - 160  # the P.808 model takes 900 frames
N_FFT, MEL_HOP, N_MELS = 321, 160, 120
TOP_DB, POWER_FLOOR = 80.0, 1e-10
BATCH_WINDOWS = 16  # windows per model call: batching several clips' windows saves per-call overhead

MODELS_PACKAGE = "speechmos"
P835_FILES = {False: "dnsmos_models/sig_bak_ovr.onnx", True: "pdnsmos_models/sig_bak_ovr.onnx"}
P808_FILE = "dnsmos_models/model_v8.onnx"
# raw P.835 outputs -> MOS (np.polyval, highest power first); the DNSMOS authors' fits, for the
# standard model (False) and the personalized one (True), which also penalises interfering talkers
P835_POLYNOMIALS = {
    False: {"sig": (-0.08397278, 1.22083953, 0.0052439),
            "bak": (-0.13166888, 1.60915514, -0.39604546),
            "ovrl": (-0.06766283, 1.11546468, 0.04602535)},
    True: {"sig": (-0.01019296, 0.02751166, 1.19576786, -0.24348726),
           "bak": (-0.04976499, 0.44276479, -0.1644611, 0.96883132),
           "ovrl": (-0.00533021, 0.005101, 1.18058466, -0.11236046)},
}
INSTALL_HINT = "install them with `pip install 'voicesmith[eval]'` (the `speechmos` and `onnxruntime` packages)"

DEFINITION = ("DNSMOS (speechmos models, offline): OVRL/SIG/BAK = P.835 overall/speech/background, "
              "P.808 = overall; 1-5, higher is better. Compare checkpoints or vocoders on the same texts, "
              "not absolute MOS across speakers.")


SCORES = ("ovrl", "sig", "bak", "p808")  # DnsmosScores' fields, in the order of score_windows' columns


@dataclass(frozen=True)
class DnsmosScores:
    """Predicted MOS of one clip, each 1-5 (higher is better)."""

    ovrl: float
    sig: float
    bak: float
    p808: float

    def as_dict(self, prefix: str = "dnsmos_") -> dict[str, float]:
        """{"dnsmos_ovrl": ..., ...}: the names of the eval JSON (`reference_dnsmos_` for recordings)."""
        return {f"{prefix}{name}": value for name, value in asdict(self).items()}


# --- features ------------------------------------------------------------------------------------

def model_windows(audio: np.ndarray) -> np.ndarray:
    """The 9.01 s windows DNSMOS scores: a read-only view `[n_windows, 144160]` of mono 16 kHz `[samples]`
    (a view, not a copy: an hour of audio is 3591 overlapping windows)."""
    if audio.size == 0:
        raise ValueError("DNSMOS needs at least one sample of audio; got an empty clip.")
    repeats = 1
    while audio.size * repeats < WINDOW_SAMPLES:
        repeats *= 2
    audio = np.tile(np.asarray(audio, dtype=np.float32), repeats)
    n_windows = max(1, audio.size // SAMPLE_RATE - 9)
    return np.lib.stride_tricks.sliding_window_view(audio, WINDOW_SAMPLES)[::HOP_SAMPLES][:n_windows]


@lru_cache(maxsize=1)
def _p808_filterbank() -> np.ndarray:
    """`[161, 120]` float32: slaney mel filters on the bins of a 321-point FFT at 16 kHz."""
    bin_hz = np.fft.rfftfreq(N_FFT, d=1.0 / SAMPLE_RATE)
    return slaney_filterbank(SAMPLE_RATE, N_FFT, N_MELS, 0.0, SAMPLE_RATE / 2, bin_hz).T.astype(np.float32)


@lru_cache(maxsize=1)
def _periodic_hann() -> np.ndarray:
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


def p808_features(windows: np.ndarray) -> np.ndarray:
    """The P.808 model's input: `[n, 144160]` windows -> `[n, 900, 120]` float32 normalised log-mels."""
    audio = np.pad(windows[:, :P808_SAMPLES], ((0, 0), (N_FFT // 2, N_FFT // 2)))
    frames = np.lib.stride_tricks.sliding_window_view(audio, N_FFT, axis=1)[:, ::MEL_HOP]  # [n, 900, 321]
    power = np.abs(np.fft.rfft(frames * _periodic_hann(), axis=-1)) ** 2
    mel = power @ _p808_filterbank()  # [n, 900, 120]
    db = 10.0 * np.log10(np.maximum(mel, POWER_FLOOR))
    db -= 10.0 * np.log10(np.maximum(mel.max(axis=(1, 2), keepdims=True), POWER_FLOOR))
    db = np.maximum(db, db.max(axis=(1, 2), keepdims=True) - TOP_DB)
    return ((db + 40.0) / 40.0).astype(np.float32)


def prepare(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float `[samples]` at any rate -> float32 at 16 kHz in [-1, 1]; refuses what cannot be scored."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"DNSMOS scores mono audio `[samples]`; got shape {audio.shape}.")
    if not np.isfinite(audio).all():
        raise ValueError("DNSMOS cannot score audio holding NaN or infinite samples.")
    if sample_rate != SAMPLE_RATE:
        audio = soxr.resample(audio, sample_rate, SAMPLE_RATE, quality="HQ").astype(np.float32, copy=False)
    return np.clip(audio, -1.0, 1.0)


# --- models --------------------------------------------------------------------------------------

def model_path(name: str) -> Path:
    """A model file inside the installed `speechmos` package (its scoring code is never imported)."""
    try:
        path = Path(str(resources.files(MODELS_PACKAGE).joinpath(name)))
    except ModuleNotFoundError:
        raise UserInputError(f"Naturalness scores (DNSMOS) need the models of the `speechmos` package, which is "
                             f"not installed; {INSTALL_HINT}.") from None
    if not path.is_file():
        raise UserInputError(f"The DNSMOS model {name} is missing from the installed `speechmos` package "
                             f"({path}); reinstall it: `pip install --force-reinstall speechmos`.")
    return path


def check_available() -> None:
    """Raise UserInputError (with what to install) unless the models and onnxruntime can be loaded."""
    for name in (P835_FILES[False], P808_FILE):
        model_path(name)
    if find_spec("onnxruntime") is None:
        raise UserInputError(f"Naturalness scores (DNSMOS) need onnxruntime, which is not installed; {INSTALL_HINT}.")


def _session(path: Path, threads: Optional[int]):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


class DnsmosScorer:
    """Both DNSMOS models, loaded once; `score`/`score_many` turn clips into `DnsmosScores`.

    `personalized` takes the personalized P.835 model (it also marks down interfering talkers);
    `threads` sets onnxruntime's intra-op threads (None: its default, one per physical core).
    """

    def __init__(self, personalized: bool = False, threads: Optional[int] = None):
        check_available()
        self.personalized = personalized
        self.p835 = _session(model_path(P835_FILES[personalized]), threads)
        self.p808 = _session(model_path(P808_FILE), threads)

    def score(self, audio: np.ndarray, sample_rate: int) -> DnsmosScores:
        return self.score_many([(audio, sample_rate)])[0]

    def score_many(self, clips: Sequence[tuple[np.ndarray, int]]) -> list[DnsmosScores]:
        """One `DnsmosScores` per (mono audio, sample rate); windows of all clips share model calls."""
        windows = [model_windows(prepare(audio, sample_rate)) for audio, sample_rate in clips]
        queue = itertools.chain.from_iterable(windows)  # one clip after another, BATCH_WINDOWS at a time
        scored = [np.zeros((0, len(SCORES)))]
        while batch := list(itertools.islice(queue, BATCH_WINDOWS)):
            scored.append(self.score_windows(np.stack(batch)))
        per_window = np.concatenate(scored)
        bounds = np.cumsum([0] + [len(clip_windows) for clip_windows in windows])
        return [DnsmosScores(*map(float, per_window[start:end].mean(axis=0)))
                for start, end in zip(bounds[:-1], bounds[1:])]

    def score_windows(self, windows: np.ndarray) -> np.ndarray:
        """`[n, 144160]` windows (`model_windows`) -> `[n, 4]` MOS of each (ovrl, sig, bak, p808)."""
        fits = P835_POLYNOMIALS[self.personalized]
        rows = [np.zeros((0, len(SCORES)))]
        for start in range(0, len(windows), BATCH_WINDOWS):
            batch = np.ascontiguousarray(windows[start:start + BATCH_WINDOWS], dtype=np.float32)
            raw_sig, raw_bak, raw_ovrl = self._run(self.p835, batch).T  # [n, 3] -> three [n]
            p808 = self._run(self.p808, p808_features(batch))[:, 0]
            rows.append(np.stack([np.polyval(fits["ovrl"], raw_ovrl), np.polyval(fits["sig"], raw_sig),
                                  np.polyval(fits["bak"], raw_bak), p808], axis=1))
        return np.concatenate(rows).astype(np.float64)

    @staticmethod
    def _run(session, inputs: np.ndarray) -> np.ndarray:
        return session.run(None, {session.get_inputs()[0].name: inputs})[0]


@lru_cache(maxsize=2)
def scorer(personalized: bool = False) -> DnsmosScorer:
    """One scorer per process (loading the two models takes a moment); onnxruntime picks the threads."""
    return DnsmosScorer(personalized)


def dnsmos(audio: np.ndarray, sample_rate: int, personalized: bool = False) -> DnsmosScores:
    """DNSMOS of one mono clip at any sample rate, with the process's shared scorer."""
    return scorer(personalized).score(audio, sample_rate)


def shortfall(ovrl: float) -> float:
    """(5 - OVRL) / 4: 0 at the top of the scale, 1 at the bottom. Lower is better, like every metric
    `train.best_metric` follows, and on CER's scale, so the two can be averaged (`cer_dnsmos`)."""
    return (5.0 - ovrl) / 4.0
