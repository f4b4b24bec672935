"""Monotonic alignment search: exact agreement with the Glow-TTS reference, path properties, bad lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voicesmith.align import BACKEND_ENV, maximum_path, maximum_path_numba, maximum_path_torch


def reference_path(log_p: np.ndarray, t_x: int, t_y: int) -> np.ndarray:
    """Glow-TTS ``monotonic_align/core.pyx`` in plain Python, with numpy scalars so float32 stays float32."""
    value = log_p[:t_x, :t_y].copy()
    neg_inf, zero = value.dtype.type(-np.inf), value.dtype.type(0)
    for y in range(t_y):
        for x in range(max(0, t_x + y - t_y), min(t_x, y + 1)):
            v_cur = neg_inf if x == y else value[x, y - 1]
            if x == 0:
                v_prev = zero if y == 0 else neg_inf
            else:
                v_prev = value[x - 1, y - 1]
            value[x, y] += max(v_prev, v_cur)
    path = np.zeros(log_p.shape, dtype=np.int64)
    index = t_x - 1
    for y in range(t_y - 1, -1, -1):
        path[index, y] = 1
        if index != 0 and (index == y or value[index, y - 1] < value[index - 1, y - 1]):
            index -= 1
    return path


def reference_batch(log_p: torch.Tensor, text_lengths, mel_lengths) -> torch.Tensor:
    scores = log_p.numpy()
    paths = [reference_path(scores[b], int(t), int(m)) for b, (t, m) in enumerate(zip(text_lengths, mel_lengths))]
    return torch.from_numpy(np.stack(paths))


def random_batch(seed: int, batch: int, n_tokens: int, n_frames: int, dtype=torch.float32, ties: bool = False):
    """Scores and lengths with the edge cases mixed in: full size, text == mel, one token, one frame."""
    g = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: most cells tie, so the tie-break decides the path
        log_p = torch.randint(-2, 1, (batch, n_tokens, n_frames), generator=g).to(dtype)
    else:
        log_p = torch.randn(batch, n_tokens, n_frames, generator=g, dtype=dtype)
    mel = torch.randint(1, n_frames + 1, (batch,), generator=g)
    text = torch.minimum(torch.randint(1, n_tokens + 1, (batch,), generator=g), mel)
    special = [(n_tokens, n_frames), (min(n_tokens, n_frames),) * 2, (1, n_frames), (1, 1)]
    for b, (t, m) in zip(range(batch), special):
        text[b], mel[b] = t, m
    return log_p, text, mel


def assert_valid_path(path: torch.Tensor, text_lengths, mel_lengths) -> None:
    for b, (t_x, t_y) in enumerate(zip(text_lengths.tolist(), mel_lengths.tolist())):
        p = path[b]
        assert set(p.unique().tolist()) <= {0, 1}
        assert p[t_x:].sum() == 0 and p[:, t_y:].sum() == 0, "padding must stay 0"
        item = p[:t_x, :t_y]
        assert (item.sum(0) == 1).all(), "each frame belongs to exactly one token"
        assert (item.sum(1) >= 1).all(), "each token gets at least one frame"
        token = item.argmax(0)
        assert token[0] == 0 and token[-1] == t_x - 1, "starts at (0, 0), ends at the last token and frame"
        steps = token[1:] - token[:-1]
        assert ((steps == 0) | (steps == 1)).all(), "monotonic, one token at a time"


SHAPES = [(1, 1, 1), (1, 1, 9), (1, 6, 6), (2, 5, 5), (3, 4, 17), (5, 9, 23), (8, 13, 40), (6, 31, 33)]


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_both_backends_match_reference(shape, ties):
    log_p, text, mel = random_batch(sum(shape) + ties, *shape, ties=ties)
    expected = reference_batch(log_p, text, mel)
    for backend in ("numba", "torch"):
        path = maximum_path(log_p, text, mel, backend=backend)
        assert path.dtype == log_p.dtype and path.shape == log_p.shape
        assert torch.equal(path.long(), expected), backend
    assert_valid_path(path, text, mel)


def test_many_random_batches_match_reference_and_each_other():
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        batch, n_tokens, n_frames = (int(torch.randint(1, hi, (), generator=g)) for hi in (5, 12, 30))
        n_tokens = min(n_tokens, n_frames)
        log_p, text, mel = random_batch(1000 + seed, batch, n_tokens, n_frames, ties=seed % 3 == 0)
        numba_path = maximum_path_numba(log_p, text, mel)
        assert torch.equal(numba_path.long(), reference_batch(log_p, text, mel)), seed
        assert torch.equal(numba_path, maximum_path_torch(log_p, text, mel)), seed


def test_large_batch_numba_equals_torch_and_is_valid():
    """Long enough for the four-row groups, their leftovers and the parallel batch loop all to run."""
    log_p, text, mel = random_batch(7, 12, 61, 250)
    path = maximum_path_numba(log_p, text, mel)
    assert torch.equal(path, maximum_path_torch(log_p, text, mel))
    assert_valid_path(path, text, mel)
    for b in (0, 1, 2, 5):  # the reference is slow in Python: a few items suffice
        assert torch.equal(
            path[b].long(), torch.from_numpy(reference_path(log_p[b].numpy(), int(text[b]), int(mel[b])))
        )


@pytest.mark.parametrize("n_threads", [1, 3])
def test_any_number_of_threads_gives_the_same_paths(n_threads):
    log_p, text, mel = random_batch(13, 9, 20, 70)
    expected = maximum_path_torch(log_p, text, mel)
    threads = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        assert torch.equal(maximum_path_numba(log_p, text, mel), expected)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_dtypes(dtype):
    log_p, text, mel = random_batch(3, 4, 7, 19, dtype=dtype)
    expected = reference_batch(log_p.to(torch.float64 if dtype == torch.float64 else torch.float32), text, mel)
    for backend in ("numba", "torch"):
        path = maximum_path(log_p, text, mel, backend=backend)
        assert path.dtype == dtype and path.device == log_p.device
        assert torch.equal(path.long(), expected), backend


def test_float32_is_searched_in_float32():
    """A float32 tie that float64 would break: (0,0)+(0,1) = 1 + 1e-8 rounds to 1 = (0,0)+(1,1).

    The tie keeps frame 1 on token 1, as in the reference; a float64 search would give it to token 0.
    """
    log_p = torch.tensor([[[1.0, 1e-8, 0.0], [0.0, 0.0, 0.0]]], dtype=torch.float32)
    text, mel = torch.tensor([2]), torch.tensor([3])
    expected = torch.tensor([[[1, 0, 0], [0, 1, 1]]])
    assert torch.equal(reference_batch(log_p, text, mel), expected)
    assert torch.equal(maximum_path(log_p, text, mel).long(), expected)
    assert torch.equal(maximum_path_torch(log_p, text, mel).long(), expected)


def test_masked_scores_and_non_contiguous_input():
    log_p, text, mel = random_batch(5, 3, 8, 20)
    log_p[:, 2:5, 3:9] = float("-inf")
    transposed = log_p.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not transposed.is_contiguous()
    expected = reference_batch(log_p, text, mel)
    assert torch.equal(maximum_path(transposed, text, mel).long(), expected)
    assert torch.equal(maximum_path_torch(transposed, text, mel).long(), expected)


def test_grad_input_lists_and_empty_batch():
    log_p, text, mel = random_batch(9, 2, 5, 12)
    path = maximum_path(log_p.requires_grad_(), text.tolist(), mel.int())
    assert not path.requires_grad
    assert_valid_path(path, text, mel)
    empty = torch.zeros(0, 4, 6)
    for backend in ("numba", "torch"):
        assert maximum_path(
            empty, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), backend
        ).shape == (0, 4, 6)


def test_backend_choice(monkeypatch):
    log_p, text, mel = random_batch(11, 2, 4, 9)
    monkeypatch.setenv(BACKEND_ENV, "torch")
    assert torch.equal(maximum_path(log_p, text, mel), maximum_path_numba(log_p, text, mel))
    monkeypatch.setenv(BACKEND_ENV, "cython")
    with pytest.raises(ValueError, match="backend must be one of"):
        maximum_path(log_p, text, mel)


@pytest.mark.parametrize(
    ("text", "mel", "message"),
    [
        ([3, 6], [9, 5], "batch item 1 has text length 6 but only 5 mel frames"),
        ([3, 5], [9, 4], "batch item 1 has text length 5 but only 4 mel frames; every token needs at least one frame"),
        ([0, 2], [9, 4], "batch item 0 has text length 0 and mel length 9; both must be at least 1"),
        ([2, 2], [9, 0], "batch item 1 has text length 2 and mel length 0"),
        ([-1, 2], [9, 4], "batch item 0 has text length -1"),
        ([9, 2], [10, 4], r"batch item 0 has text length 9 \(mel length 10\) but log_p has only 6 token rows"),
        ([2, 2], [4, 13], r"batch item 1 has mel length 13 \(text length 2\) but log_p has only 12 frames"),
    ],
)
def test_bad_lengths_raise_before_any_kernel(text, mel, message):
    log_p = torch.randn(2, 6, 12)
    for fn in (maximum_path, maximum_path_numba, maximum_path_torch):
        with pytest.raises(ValueError, match=message):
            fn(log_p, torch.tensor(text), torch.tensor(mel))


@pytest.mark.parametrize(
    ("log_p", "text", "mel", "message"),
    [
        (torch.randn(6, 12), [2], [4], "3-D floating tensor"),
        (torch.ones(1, 6, 12, dtype=torch.long), [2], [4], "3-D floating tensor"),
        (np.zeros((1, 6, 12)), [2], [4], "3-D floating tensor"),
        (torch.randn(2, 6, 12), [2], [4, 4], r"text_lengths must have shape \[2\]"),
        (torch.randn(2, 6, 12), [[2, 2]], [4, 4], r"text_lengths must have shape \[2\]"),
        (torch.randn(2, 6, 12), [2, 2], [4.0, 4.0], "mel_lengths must be integers"),
    ],
)
def test_bad_arguments_raise(log_p, text, mel, message):
    with pytest.raises(ValueError, match=message):
        maximum_path(log_p, torch.tensor(text), torch.tensor(mel))
