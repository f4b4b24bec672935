"""The CPU kernel of monotonic alignment search, compiled by numba.

Imported on the first CPU call only: importing numba costs about half a second and
compiling costs seconds, which a command that never aligns should not pay.
``cache=True`` keeps the machine code on disk, so each machine compiles once.

Parallel over the batch with Python threads (the kernel releases the GIL), not numba's
``prange``: without TBB numba runs ``prange`` on GNU OpenMP, which hangs in a process
forked after it ran (a data-loader worker) and whose workers spin at barriers; on a
busy 2-core machine the median call then took 20 ms against 3 ms with threads
(16 x 150 x 1000). Each thread takes the biggest item left, so uneven lengths balance.

Layout: one item is ``lp[x, y]`` (token ``x``, frame ``y``), rows contiguous in
frames. Walking frames in the outer loop, as the reference does, would stride across
rows; instead each pass walks four rows at once along the frames, every row read
contiguously, the four running scores in registers. The four scores of a frame depend
only on the previous frame, so the CPU overlaps their adds instead of waiting on one
chain. The scores are not kept: one byte per cell says whether the best path into it
came from the token before, which is all the backtrack needs.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _rows4(lp, move, prev, x, width, neg_inf):
    """Scores rows ``x .. x+3``; ``prev[y]`` holds row ``x-1`` at frame ``y-1`` and leaves holding row ``x+3``.

    All four rows start at frame ``x``, so row ``x+k`` spends its first ``k`` frames above
    the diagonal: those cells start at -inf and stay -inf (-inf plus a score), which is
    what the reference reads there. Rows also run up to 3 frames past their band's end;
    no cell inside a band reads those.
    """
    n = width + 3
    l0, l1, l2, l3 = lp[x, x : x + n], lp[x + 1, x : x + n], lp[x + 2, x : x + n], lp[x + 3, x : x + n]
    m0, m1, m2, m3 = move[x, x : x + n], move[x + 1, x : x + n], move[x + 2, x : x + n], move[x + 3, x : x + n]
    pv = prev[x : x + n + 1]
    c0 = c1 = c2 = c3 = neg_inf
    for j in range(n):
        p = pv[j]
        pv[j] = c3
        m0[j] = c0 < p
        m1[j] = c1 < c0
        m2[j] = c2 < c1
        m3[j] = c3 < c2
        c3 = l3[j] + max(c3, c2)
        c2 = l2[j] + max(c2, c1)
        c1 = l1[j] + max(c1, c0)
        c0 = l0[j] + max(c0, p)
    pv[n] = c3


@njit(cache=True, nogil=True)
def _row1(lp, move, prev, x, width, neg_inf):
    """Scores the one row ``x`` left over after the groups of four, like ``_rows4``."""
    row, mv, pv = lp[x, x : x + width], move[x, x : x + width], prev[x : x + width + 1]
    c = neg_inf
    for j in range(width):
        p = pv[j]
        pv[j] = c
        mv[j] = c < p
        c = row[j] + max(c, p)
    pv[width] = c


@njit(cache=True, nogil=True)
def _forward(lp, t_x, t_y, move):
    """Fills ``move[x, y]``: the best path into (x, y) comes from token x-1 (reference's ``<``, ties stay)."""
    neg_inf = np.full(1, -np.inf, lp.dtype)[0]  # typed like lp: float32 stays float32, as in the reference
    prev = np.full(t_y + 1, neg_inf, lp.dtype)
    prev[0] = 0  # the path enters (0, 0) from nowhere with score 0
    width = t_y - t_x + 1  # frames in each row's band
    x = 0
    while x + 4 <= t_x:
        _rows4(lp, move, prev, x, width, neg_inf)
        x += 4
    while x < t_x:
        _row1(lp, move, prev, x, width, neg_inf)
        x += 1


@njit(cache=True, nogil=True)
def _backtrack(move, t_x, t_y, out):
    """Puts a one at each frame's token on the best path; ``out`` arrives zeroed."""
    x = t_x - 1
    for y in range(t_y - 1, -1, -1):
        out[x, y] = 1
        if x != 0 and (x == y or move[x, y]):
            x -= 1


@njit(cache=True, nogil=True)
def align_item(out, log_p, t_x, t_y, scratch):
    """Marks the best path of one item (``log_p`` [T_text, T_mel]) in its zeroed ``out``.

    Lengths are validated and arrays C-contiguous. Runs without the GIL, so Python
    threads run items side by side; ``scratch`` (at least T_text * T_mel bytes) is
    reused across the items of a thread.
    """
    move = scratch[: t_x * t_y].reshape((t_x, t_y))
    _forward(log_p, t_x, t_y, move)
    _backtrack(move, t_x, t_y, out)
