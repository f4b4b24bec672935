"""Length-bucketed batches: little padding, still shuffled, and sharded for DDP.

Each epoch the items are shuffled and cut into pools of `pool_batches` batches; a pool is sorted by
length (ties keep their shuffled order) and cut into batches, and the batches are shuffled. Items
of similar length share a batch, so little of a batch is padding, while pools keep the batches
different from epoch to epoch on a large corpus.

Under DDP every rank builds the same batch list (same seed and epoch) and takes every
`num_replicas`-th batch, so ranks see disjoint items. When the batch count does not divide by the
number of ranks, the first batches are repeated to fill the last round (every rank must step the
same number of times or DDP hangs); `drop_last=True` drops those last batches instead.

A run resumed mid-epoch calls `resume_at(epoch, batches_done)`: the epoch's batch list is rebuilt
(it depends only on seed and epoch) and its first `batches_done` batches are left out once, so the
resumed run trains on exactly the batches the interrupted one had not reached. `len()` stays the
whole epoch: the training loop counts the batches already done itself.
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import numpy as np
from torch.utils.data import Sampler


class LengthBucketBatchSampler(Sampler[list[int]]):
    def __init__(self, lengths: Sequence[int], batch_size: int, max_frames: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, num_replicas: int = 1, rank: int = 0,
                 drop_last: bool = False, pool_batches: int = 64):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1}")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size, self.max_frames = batch_size, max_frames
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.num_replicas, self.rank, self.pool_batches = num_replicas, rank, pool_batches
        self.epoch = 0
        self._cached: tuple[int, list[list[int]]] = (-1, [])
        self._resume: Optional[tuple[int, int]] = None  # (epoch, batches of it already trained)
        self.sampler = _EpochHook(self)

    def set_epoch(self, epoch: int) -> None:
        """Called by the training loop so each epoch gets its own shuffle (Lightning: through `.sampler`)."""
        self.epoch = epoch

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """The next iteration continues epoch `epoch` after this rank's first `batches_done` batches."""
        self.epoch = epoch
        self._resume = (epoch, batches_done)

    def all_batches(self) -> list[list[int]]:
        """This epoch's batches of every rank, before sharding (the same list on every rank)."""
        if self._cached[0] != self.epoch:
            self._cached = (self.epoch, self._make_batches())
        return self._cached[1]

    def _make_batches(self) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        pool_size = self.batch_size * self.pool_batches
        batches: list[list[int]] = []
        for start in range(0, len(order), pool_size):
            pool = order[start:start + pool_size]
            pool = pool[np.argsort(self.lengths[pool], kind="stable")]
            batches.extend(self._cut(pool))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _cut(self, sorted_pool: np.ndarray) -> list[list[int]]:
        """Batches of up to batch_size items whose padded size stays under max_frames (one item always fits)."""
        batches, current = [], []
        for index in sorted_pool.tolist():
            longest = self.lengths[index]  # the pool is sorted, so the newest item is the longest
            too_many_frames = self.max_frames is not None and longest * (len(current) + 1) > self.max_frames
            if current and (len(current) == self.batch_size or too_many_frames):
                batches.append(current)
                current = []
            current.append(index)
        if current:
            batches.append(current)
        return batches

    def _rank_batches(self) -> list[list[int]]:
        batches = self.all_batches()
        if self.num_replicas == 1 or not batches:
            return batches
        remainder = len(batches) % self.num_replicas
        if remainder and self.drop_last:
            batches = batches[:len(batches) - remainder]
        elif remainder:
            missing = self.num_replicas - remainder
            batches = batches + [batches[i % len(batches)] for i in range(missing)]
        return batches[self.rank::self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._rank_batches()
        if self._resume is not None:
            epoch, done = self._resume
            self._resume = None
            if epoch == self.epoch:
                batches = batches[done:]
        return iter(batches)

    def __len__(self) -> int:
        return len(self._rank_batches())


class _EpochHook:
    """Lightning calls `set_epoch` on `batch_sampler.sampler`, not on the batch sampler: forward it."""

    def __init__(self, owner: LengthBucketBatchSampler):
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)


def padding_waste(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """Share of a padded batch tensor that is padding, over all batches (0 = none)."""
    lengths = np.asarray(lengths)
    padded = sum(int(lengths[list(batch)].max()) * len(batch) for batch in batches if len(batch))
    real = sum(int(lengths[list(batch)].sum()) for batch in batches)
    return 1.0 - real / padded if padded else 0.0
