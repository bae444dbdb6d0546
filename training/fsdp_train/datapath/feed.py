"""The per-rank feed of packed batches: datasets, collation, the resumable sampler, eval batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fsdp_train.datapath.packing import (
    BOUNDS_KEY,
    DOC_START,
    IGNORE_INDEX,
    DataPosition,
    Packed,
    document_bounds,
    labels,
    position_ids,
)

if TYPE_CHECKING:
    import torch


class PackedDataset:
    """Map-style dataset over packed rows: (input_ids, labels, position_ids) as torch tensors."""

    def __init__(self, packed: Packed) -> None:
        self.packed = packed

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, index: int) -> int:
        return index  # the collate function gathers rows in one numpy fancy-index, not row by row


@dataclass(slots=True)
class Collate:
    packed: Packed
    document_mask: bool = True
    """Position ids restart per document (see ``TrainConfig.document_mask``); else 0..seq_len-1 per row."""

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        import torch

        rows = np.asarray(indices, dtype=np.int64)
        ids = self.packed.input_ids[rows]
        flags = self.packed.flags[rows]
        positions = position_ids(flags) if self.document_mask else np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        batch = {
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "labels": torch.from_numpy(labels(ids, flags)),
            "position_ids": torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)),
            "sample_ids": torch.from_numpy(rows),
        }
        if self.document_mask:  # for fsdp_train.models.attention: attention inside documents without a dense mask
            batch[BOUNDS_KEY] = torch.from_numpy(document_bounds((flags & DOC_START) != 0))
        return batch


class ResumableSampler:
    """torch's ``DistributedSampler`` (seeded per epoch, ``drop_last``) that starts ``skip`` samples in."""

    def __init__(self, size: int, *, world_size: int, rank: int, seed: int) -> None:
        from torch.utils.data import DistributedSampler

        self._sampler: DistributedSampler[int] = DistributedSampler(
            range(size),  # type: ignore[arg-type]  # it only takes len() of its dataset: the indices are its samples
            num_replicas=world_size,
            rank=rank,
            shuffle=True,
            seed=seed,
            drop_last=True,
        )
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self._sampler.set_epoch(epoch)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        for i, index in enumerate(self._sampler):
            if i >= self.skip:
                yield index

    def __len__(self) -> int:
        return len(self._sampler) - self.skip

    @property
    def per_rank(self) -> int:
        return len(self._sampler)


def epoch_order(size: int, *, world_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Every rank's sample order for one epoch, as each rank's ``ResumableSampler`` yields it."""
    orders = []
    for rank in range(world_size):
        sampler = ResumableSampler(size, world_size=world_size, rank=rank, seed=seed)
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


class TrainFeed:
    """The packed training sequences as this rank's micro-batches, step after step, epoch after epoch.

    A ``DataLoader`` over the rank's ``ResumableSampler``; ``DataPosition`` (in the checkpoint) says
    where to start. Each step also yields every rank's sample ids (all ranks compute the same epoch
    order), so the position can assert that the whole job trains each sample once per epoch.
    """

    def __init__(
        self,
        packed: Packed,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        grad_accum: int,
        seed: int,
        pin_memory: bool = False,
        document_mask: bool = True,
    ) -> None:
        self.packed = packed
        self.document_mask = document_mask
        self.rank, self.world_size = rank, world_size
        self.batch_size, self.grad_accum, self.seed = batch_size, grad_accum, seed
        self.pin_memory = pin_memory
        self.position = DataPosition(len(packed), world_size * batch_size * grad_accum)
        self.sampler = ResumableSampler(len(packed), world_size=world_size, rank=rank, seed=seed)
        self._iterator: Iterator[dict[str, torch.Tensor]] | None = None
        self._orders: list[list[int]] = []

    @property
    def steps_per_epoch(self) -> int:
        return self.position.steps_per_epoch

    @property
    def seq_len(self) -> int:
        return self.packed.seq_len

    def _start_epoch(self) -> None:
        from torch.utils.data import DataLoader

        per_rank_step = self.batch_size * self.grad_accum
        self.sampler.set_epoch(self.position.epoch, skip=self.position.step_in_epoch * per_rank_step)
        loader: DataLoader[Any] = DataLoader(
            PackedDataset(self.packed),  # type: ignore[arg-type]
            batch_size=self.batch_size,
            sampler=self.sampler,
            collate_fn=Collate(self.packed, self.document_mask),
            drop_last=True,
            pin_memory=self.pin_memory,
        )
        self._iterator = iter(loader)
        self._orders = epoch_order(
            len(self.packed), world_size=self.world_size, seed=self.seed, epoch=self.position.epoch
        )

    def next_step(self) -> tuple[list[dict[str, torch.Tensor]], list[int]]:
        """This rank's micro-batches for the next step, and the global sample ids of the step."""
        if self._iterator is None:
            self._start_epoch()
        assert self._iterator is not None
        micro = [next(self._iterator) for _ in range(self.grad_accum)]
        per_rank_step = self.batch_size * self.grad_accum
        first = self.position.step_in_epoch * per_rank_step
        step_ids = [i for order in self._orders for i in order[first : first + per_rank_step]]
        mine = [int(i) for batch in micro for i in batch["sample_ids"]]
        if mine != self._orders[self.rank][first : first + per_rank_step]:
            raise AssertionError(f"rank {self.rank}: the loader's samples {mine[:4]}... are not the epoch order's")
        self.position.record(step_ids)
        return micro, step_ids

    def finish_step(self) -> None:
        if self.position.finish_step():
            self._iterator = None  # the next step starts the next epoch, reshuffled

    def total_steps(self, steps: int, epochs: int) -> int:
        return min(steps, epochs * self.steps_per_epoch) if epochs else steps


def eval_batches(
    packed: Packed, *, rank: int, world_size: int, batch_size: int, document_mask: bool = True
) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's share of the validation rows (every ``world_size``-th), in batches.

    Every rank yields the same number of batches (FSDP's forward is collective): a rank with fewer
    rows gets rows with no targets, which count for nothing in the loss.
    """
    import torch

    rows = list(range(rank, len(packed), world_size))
    per_rank = -(-len(packed) // world_size)
    collate = Collate(packed, document_mask)
    padded = rows + [-1] * (per_rank - len(rows))
    for start in range(0, per_rank, batch_size):
        chunk = padded[start : start + batch_size]
        batch = collate([max(i, 0) for i in chunk])
        dummy = torch.tensor([i < 0 for i in chunk])
        batch["labels"][dummy] = IGNORE_INDEX
        yield batch
