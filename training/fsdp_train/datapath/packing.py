"""Packing and data positions: pure numpy, no I/O (``fsdp_train.datapath.data`` reads and feeds; this packs and counts).

A packed sequence is ``input_ids`` (``seq_len`` token ids) and ``flags``: bit 0 says the token is a
loss target, bit 1 that a document starts there. Documents are joined with EOS; position ids restart
at 0 on every document start (``position_ids``). ``DataPosition`` is where a run stands in its data,
saved with every checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TARGET = 1
"""Flag bit: the token is a loss target (predicted from the tokens before it)."""
DOC_START = 2
"""Flag bit: a document begins at this token (its position id is 0)."""
IGNORE_INDEX = -100
BOUNDS_KEY = "document_bounds"
"""The batch key of ``document_bounds`` (read by ``fsdp_train.models.attention``)."""


@dataclass(slots=True)
class Packed:
    """Packed sequences: ``input_ids`` [N, seq_len] int32 and ``flags`` [N, seq_len] uint8."""

    input_ids: np.ndarray
    flags: np.ndarray
    documents: int = 0

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])


@dataclass(slots=True)
class _Packer:
    seq_len: int
    eos_id: int
    eos_is_target: bool
    ids: list[np.ndarray] = field(default_factory=list)
    flags: list[np.ndarray] = field(default_factory=list)
    documents: int = 0

    def add(self, ids: Sequence[int], mask: Sequence[int]) -> None:
        if not len(ids):
            return
        n = len(ids) + 1
        doc_ids = np.empty(n, np.int32)
        doc_ids[:-1] = ids
        doc_ids[-1] = self.eos_id
        doc_flags = np.empty(n, np.uint8)
        doc_flags[:-1] = np.asarray(mask, np.uint8) & TARGET
        doc_flags[-1] = TARGET if self.eos_is_target else 0
        # The first token has no context inside its document: predicting it would learn across documents.
        doc_flags[0] = DOC_START
        self.ids.append(doc_ids)
        self.flags.append(doc_flags)
        self.documents += 1

    def result(self) -> Packed:
        if not self.ids:
            empty = np.zeros((0, self.seq_len), np.int32)
            return Packed(empty, empty.astype(np.uint8), 0)
        ids, flags = np.concatenate(self.ids), np.concatenate(self.flags)
        rows = -(-len(ids) // self.seq_len)
        pad = rows * self.seq_len - len(ids)
        # The last sequence is filled with EOS that is no target, so no document is dropped.
        ids = np.concatenate([ids, np.full(pad, self.eos_id, np.int32)])
        flags = np.concatenate([flags, np.zeros(pad, np.uint8)])
        return Packed(ids.reshape(rows, self.seq_len), flags.reshape(rows, self.seq_len), self.documents)


@dataclass(slots=True)
class DataReport:
    """Rows read and rows that cannot be trained on, per file and per problem (``Tokenize``'s ``problem``)."""

    rows: dict[str, int] = field(default_factory=dict)
    bad: dict[str, dict[str, int]] = field(default_factory=dict)
    """File -> problem -> rows."""

    def count(self, paths: Sequence[str], problems: Sequence[str]) -> None:
        for path, problem in zip(paths, problems, strict=True):
            self.rows[path] = self.rows.get(path, 0) + 1
            if problem:
                per_file = self.bad.setdefault(path, {})
                per_file[problem] = per_file.get(problem, 0) + 1

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def total_bad(self) -> int:
        return sum(n for per_file in self.bad.values() for n in per_file.values())

    def describe(self, field_name: str, limit: int = 6) -> str:
        """``file: N of M rows field 'x': problem`` for the worst files and problems."""
        entries = sorted(
            ((n, path, problem) for path, per_file in self.bad.items() for problem, n in per_file.items()),
            key=lambda e: (-e[0], e[1], e[2]),
        )
        parts = [
            f"{path or 'data'}: {n} of {self.rows.get(path, 0)} rows, field {field_name!r}: {problem}"
            for n, path, problem in entries[:limit]
        ]
        if len(entries) > limit:
            parts.append(f"and {len(entries) - limit} more")
        return "; ".join(parts)


def pack_documents(
    batches: Iterable[dict[str, Any]],
    *,
    seq_len: int,
    eos_id: int,
    eos_is_target: bool,
    validation_fraction: float = 0.0,
    seed: int = 0,
    report: DataReport | None = None,
) -> tuple[Packed, Packed]:
    """Join tokenized documents (in order) with EOS and cut the stream into ``seq_len`` rows.

    Returns (train, validation): with ``validation_fraction``, each document goes to validation with
    that probability, drawn from a generator seeded with ``seed`` in document order, so the split does
    not depend on how the documents were batched. Rows with a ``problem`` (empty ids) are counted in
    ``report`` and take no part.
    """
    train = _Packer(seq_len, eos_id, eos_is_target)
    held_out = _Packer(seq_len, eos_id, eos_is_target)
    rng = np.random.default_rng(seed)
    for batch in batches:
        ids_list, masks = batch["input_ids"], batch["loss_mask"]
        if report is not None and "problem" in batch:
            report.count(batch["path"], batch["problem"])
        draws = rng.random(len(ids_list)) if validation_fraction else np.ones(len(ids_list))
        for ids, mask, draw in zip(ids_list, masks, draws, strict=True):
            (held_out if draw < validation_fraction else train).add(ids, mask)
    return train.result(), held_out.result()


def position_ids(flags: np.ndarray) -> np.ndarray:
    """Position ids that restart at 0 on every document start (and at the start of every row)."""
    length = flags.shape[-1]
    index = np.broadcast_to(np.arange(length), flags.shape)
    starts = np.where((flags & DOC_START) != 0, index, 0)
    return (index - np.maximum.accumulate(starts, axis=-1)).astype(np.int64)


def labels(input_ids: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """Hugging Face labels: the token where it is a target, else -100 (the model shifts them itself)."""
    return np.where((flags & TARGET) != 0, input_ids, IGNORE_INDEX).astype(np.int64)


@dataclass(slots=True)
class DataPosition:
    """Where training stands in the data, and which samples this epoch has trained (all ranks together).

    Saved with every checkpoint (``state_dict``/``load_state_dict``: torch.distributed.checkpoint's
    ``Stateful``). ``record`` asserts that no sample is trained twice in an epoch, ``finish_epoch``
    that none was skipped, across restarts.
    """

    size: int
    global_batch: int
    epoch: int = 0
    step_in_epoch: int = 0
    samples_seen: int = 0
    trained: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def __post_init__(self) -> None:
        if self.trained.size != self.size:
            self.trained = np.zeros(self.size, bool)

    @property
    def steps_per_epoch(self) -> int:
        return self.size // self.global_batch if self.global_batch else 0

    def record(self, sample_ids: Sequence[int]) -> None:
        ids = np.asarray(sample_ids, np.int64)
        again = ids[self.trained[ids]]
        if again.size or np.unique(ids).size != ids.size:
            raise AssertionError(f"epoch {self.epoch}: samples {again[:8].tolist()} trained twice")
        self.trained[ids] = True
        self.samples_seen += int(ids.size)

    def finish_step(self) -> bool:
        """Count a finished step; True when it ended the epoch (the caller then starts the next)."""
        self.step_in_epoch += 1
        if self.step_in_epoch < self.steps_per_epoch:
            return False
        expected = self.steps_per_epoch * self.global_batch
        if int(self.trained.sum()) != expected:
            raise AssertionError(f"epoch {self.epoch} trained {int(self.trained.sum())} samples, expected {expected}")
        self.epoch += 1
        self.step_in_epoch = 0
        self.trained[:] = False
        return True

    def state_dict(self) -> dict[str, Any]:
        import torch

        return {
            "size": self.size,
            "global_batch": self.global_batch,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "samples_seen": self.samples_seen,
            "trained": torch.from_numpy(self.trained.astype(np.uint8)),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["size"], state["global_batch"]) != (self.size, self.global_batch):
            raise ValueError(
                f"the checkpoint's data position is for {state['size']} sequences in global batches of "
                f"{state['global_batch']}; this run has {self.size} in batches of {self.global_batch} "
                "(resume with the same data, seqLen, ranks and batch size)"
            )
        self.epoch = int(state["epoch"])
        self.step_in_epoch = int(state["step_in_epoch"])
        self.samples_seen = int(state["samples_seen"])
        self.trained = np.asarray(state["trained"].numpy(), bool).copy()


def samples_digest(sample_ids: Sequence[int]) -> str:
    """A short fingerprint of a step's samples, in order: equal digests, equal data."""
    return hashlib.sha256(np.asarray(sample_ids, np.int64).tobytes()).hexdigest()[:12]


def document_bounds(doc_start: np.ndarray) -> np.ndarray:
    """``cu_seqlens`` of a batch flattened row after row: every document start and every row start, then the end.

    ``doc_start`` [rows, seq_len] bool. A row that begins in the middle of a document starts a new
    sequence there (the earlier part is in another row, maybe on another rank).
    """
    rows, seq_len = doc_start.shape
    starts = doc_start.copy()
    starts[:, 0] = True
    flat = np.flatnonzero(starts.reshape(-1))
    return np.concatenate([flat, [rows * seq_len]]).astype(np.int32)
