"""Monotonic alignment search (MAS), the hard alignment of Glow-TTS, VITS and Matcha-TTS.

Given ``log_p[b, x, y]``, the log-likelihood of frame ``y`` under token ``x``, MAS finds the
path that gives every frame exactly one token, every token at least one frame, never
goes back, starts at (0, 0), ends at (last token, last frame) and has the largest sum.

Two implementations give the same paths, bit for bit, as the Glow-TTS reference
(``monotonic_align/core.pyx``; float32 scores stay float32 and ties stay on the same
token). The reference writes "unreachable" as -1e9, here it is -inf: the paths differ
only where path scores fall below -1e9.

* ``maximum_path_numba``: a numba kernel, the batch shared among ``torch.get_num_threads()``
  threads. Nothing to build: numba ships wheels for Linux, macOS and Windows. The
  default on every device: a GPU's scores are copied to the host and the path back.
  Measured on an H100 (benchmarks/RESULTS_gpu.md), the wavefront below took 71-79 ms for
  16 items of 150 tokens by 1000 frames, this kernel on the host 3.4 ms: the
  wavefront launches a handful of small kernels per frame, so it is launch-bound.
* ``maximum_path_torch``: a torch wavefront over mel frames, vectorised over batch and
  tokens, on ``log_p``'s own device (``backend="torch"``).

The inputs are checked before any kernel runs, so a bad length is a ValueError naming
the batch item, never an out-of-bounds read. ``log_p`` may hold -inf (masked cells);
NaN or +inf give some valid path, not necessarily the reference's.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np
import torch

BACKENDS = ("numba", "torch")
BACKEND_ENV = "VOICESMITH_MAS_BACKEND"


def maximum_path(
    log_p: torch.Tensor,
    text_lengths: torch.Tensor,
    mel_lengths: torch.Tensor,
    backend: str | None = None,
) -> torch.Tensor:
    """The best monotonic path: a 0/1 tensor shaped, typed and placed like ``log_p`` [B, T_text, T_mel].

    ``backend`` ("numba", the default, or "torch") picks the implementation; so does the
    environment variable VOICESMITH_MAS_BACKEND, for comparing the two in a real run.
    Padding (tokens past ``text_lengths[b]``, frames past ``mel_lengths[b]``) is 0.
    """
    text_lengths, mel_lengths = _checked(log_p, text_lengths, mel_lengths)
    backend = backend or os.environ.get(BACKEND_ENV) or "numba"
    if backend not in BACKENDS:
        raise ValueError(f"maximum_path: backend must be one of {BACKENDS}, got {backend!r}")
    run = _path_numba if backend == "numba" else _path_torch
    return run(log_p, text_lengths, mel_lengths)


def maximum_path_numba(log_p: torch.Tensor, text_lengths: torch.Tensor, mel_lengths: torch.Tensor) -> torch.Tensor:
    """``maximum_path`` on the numba CPU kernel, wherever ``log_p`` lives (a GPU tensor is copied)."""
    return _path_numba(log_p, *_checked(log_p, text_lengths, mel_lengths))


def maximum_path_torch(log_p: torch.Tensor, text_lengths: torch.Tensor, mel_lengths: torch.Tensor) -> torch.Tensor:
    """``maximum_path`` as a torch wavefront on ``log_p``'s own device."""
    return _path_torch(log_p, *_checked(log_p, text_lengths, mel_lengths))


def _checked(log_p, text_lengths, mel_lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """The lengths as int64 CPU tensors, or a ValueError saying which item is wrong and how."""
    if not isinstance(log_p, torch.Tensor) or log_p.dim() != 3 or not log_p.is_floating_point():
        what = f"a {log_p.dim()}-D {log_p.dtype} tensor" if isinstance(log_p, torch.Tensor) else type(log_p).__name__
        raise ValueError(f"maximum_path: log_p must be a 3-D floating tensor [B, T_text, T_mel], got {what}")
    batch, n_tokens, n_frames = log_p.shape
    text = _lengths("text_lengths", text_lengths, batch)
    mel = _lengths("mel_lengths", mel_lengths, batch)
    for b, (t_x, t_y) in enumerate(zip(text.tolist(), mel.tolist())):
        problem = _length_problem(t_x, t_y, n_tokens, n_frames)
        if problem:
            raise ValueError(f"maximum_path: batch item {b} has {problem}")
    return text, mel


def _lengths(name: str, lengths, batch: int) -> torch.Tensor:
    lengths = torch.as_tensor(lengths)
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise ValueError(f"maximum_path: {name} must be integers, got {lengths.dtype}")
    if lengths.shape != (batch,):
        raise ValueError(
            f"maximum_path: {name} must have shape [{batch}] (one per batch item), got {list(lengths.shape)}"
        )
    return lengths.detach().to("cpu", torch.int64)


def _length_problem(t_x: int, t_y: int, n_tokens: int, n_frames: int) -> str:
    """What is wrong with one item's lengths, as the end of a sentence; "" if nothing."""
    if t_x < 1 or t_y < 1:
        return f"text length {t_x} and mel length {t_y}; both must be at least 1. Drop empty items before aligning."
    if t_x > n_tokens:
        return f"text length {t_x} (mel length {t_y}) but log_p has only {n_tokens} token rows."
    if t_y > n_frames:
        return f"mel length {t_y} (text length {t_x}) but log_p has only {n_frames} frames."
    if t_x > t_y:
        return (
            f"text length {t_x} but only {t_y} mel frames; every token needs at least one frame. "
            "Drop or trim this item (voicesmith validate flags it as too_many_phonemes)."
        )
    return ""


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half precision cannot tell close scores apart over a thousand frames; it is searched in float32."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _path_numba(log_p: torch.Tensor, text_lengths: torch.Tensor, mel_lengths: torch.Tensor) -> torch.Tensor:
    from ._numba import align_item

    scores = log_p.detach().to("cpu", _work_dtype(log_p.dtype)).contiguous().numpy()
    # np.zeros is calloc: a large buffer comes from the OS already zeroed, so nothing zeroes it
    # twice, and a small one reuses the last call's pages. A torch buffer page-faults on every
    # call and is then zeroed again, which costs more than the search itself.
    out = np.zeros_like(scores)
    lengths = list(zip(text_lengths.tolist(), mel_lengths.tolist()))
    # Biggest items first, so no thread is left with a long one at the end; next() on this
    # shared iterator hands each item to exactly one thread (it is atomic under the GIL).
    queue = iter(sorted(range(len(lengths)), key=lambda b: lengths[b][0] * lengths[b][1], reverse=True))

    def work() -> None:
        scratch = np.empty(scores.shape[1] * scores.shape[2], np.bool_)
        for b in queue:
            align_item(out[b], scores[b], *lengths[b], scratch)

    n_threads = max(1, min(torch.get_num_threads(), len(lengths)))  # the CPU share torch was given
    with ThreadPoolExecutor(n_threads - 1) if n_threads > 1 else nullcontext() as pool:
        helpers = [pool.submit(work) for _ in range(n_threads - 1)]
        work()
        for helper in helpers:
            helper.result()
    return torch.from_numpy(out).to(device=log_p.device, dtype=log_p.dtype)


def _path_torch(log_p: torch.Tensor, text_lengths: torch.Tensor, mel_lengths: torch.Tensor) -> torch.Tensor:
    device = log_p.device
    text_lengths, mel_lengths = text_lengths.to(device), mel_lengths.to(device)
    # [B, T_mel, T_text]: the wavefront reads one frame of every token per step, now contiguous.
    scores = log_p.detach().to(_work_dtype(log_p.dtype)).transpose(1, 2).contiguous()
    token_of_frame = _backtrack_torch(_forward_torch(scores), text_lengths, mel_lengths)
    n_tokens, n_frames = log_p.shape[1:]
    tokens = torch.arange(n_tokens, device=device)
    frames = torch.arange(n_frames, device=device)
    path = (token_of_frame[:, None, :] == tokens[None, :, None]) & (frames < mel_lengths[:, None])[:, None, :]
    return path.to(log_p.dtype)


def _forward_torch(scores: torch.Tensor) -> torch.Tensor:
    """``move[b, y, x]``: the best path into (x, y) comes from token x-1, as ``_numba._forward``.

    Step y updates the tokens 0..y only: the rest stay -inf, which is what the reference
    reads above the diagonal. Cells outside an item's band get scores too, but no cell
    inside the band ever reads them, so one wavefront serves items of any lengths.
    """
    batch, n_frames, n_tokens = scores.shape
    # best[:, x + 1]: best score into token x at the previous frame; best[:, 0] is the
    # "token -1" the path starts from: 0 before frame 0, unreachable after.
    best = scores.new_full((batch, n_tokens + 1), float("-inf"))
    best[:, 0] = 0
    move = torch.zeros((batch, n_frames, n_tokens), dtype=torch.bool, device=scores.device)
    for y in range(n_frames):
        n = min(n_tokens, y + 1)
        stay, step = best[:, 1 : n + 1], best[:, :n]
        torch.lt(stay, step, out=move[:, y, :n])
        torch.add(scores[:, y, :n], torch.maximum(stay, step), out=best[:, 1 : n + 1])
        if y == 0:
            best[:, 0] = float("-inf")
    move.diagonal(dim1=1, dim2=2).fill_(True)  # token x at frame x can only have come from x-1
    return move


def _backtrack_torch(move: torch.Tensor, text_lengths: torch.Tensor, mel_lengths: torch.Tensor) -> torch.Tensor:
    """The token of every frame on the best path, [B, T_mel]; frames past an item's end hold its last token."""
    batch, n_frames, _ = move.shape
    move &= (torch.arange(n_frames, device=move.device) < mel_lengths[:, None])[:, :, None]
    token = (text_lengths - 1)[:, None]
    token_of_frame = torch.empty((batch, n_frames), dtype=torch.int64, device=move.device)
    for y in range(n_frames - 1, -1, -1):
        token_of_frame[:, y : y + 1] = token
        token = token - move[:, y].gather(1, token).long()
    return token_of_frame
