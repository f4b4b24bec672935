"""Monotonic alignment search (Glow-TTS / VITS / Matcha-TTS MAS) without a build step.

``maximum_path`` picks the numba kernel on CPU and the torch wavefront elsewhere.
"""

from voicesmith.align.mas import BACKEND_ENV, BACKENDS, maximum_path, maximum_path_numba, maximum_path_torch

__all__ = ["BACKENDS", "BACKEND_ENV", "maximum_path", "maximum_path_numba", "maximum_path_torch"]
