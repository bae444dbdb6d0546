"""Packing's exact outputs (dtypes, the empty case) and a data position's bookkeeping, without torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fsdp_train.datapath.packing import DataPosition, labels, pack_documents, position_ids


def test_packed_rows_have_fixed_dtypes_and_an_empty_input_packs_to_no_rows() -> None:
    train, held_out = pack_documents([{"input_ids": [[5, 6, 7]], "loss_mask": [[1, 1, 1]]}], seq_len=3, eos_id=0,
                                     eos_is_target=False)  # fmt: skip
    assert (train.input_ids.dtype, train.flags.dtype, train.documents) == (np.int32, np.uint8, 1)
    assert train.input_ids.tolist() == [[5, 6, 7], [0, 0, 0]]
    assert (held_out.input_ids.shape, held_out.input_ids.dtype, held_out.flags.dtype) == ((0, 3), np.int32, np.uint8)
    assert held_out.documents == 0 and len(held_out) == 0 and held_out.seq_len == 3
    assert position_ids(train.flags).dtype == np.int64 and labels(train.input_ids, train.flags).dtype == np.int64
    # A mask wider than one bit keeps only the target bit.
    wide, _ = pack_documents([{"input_ids": [[5, 6]], "loss_mask": [[3, 3]]}], seq_len=3, eos_id=0, eos_is_target=True)
    assert wide.flags.tolist() == [[2, 1, 1]]


def test_every_document_goes_to_validation_when_the_fraction_is_one() -> None:
    batch = {"input_ids": [[1], [2], [3]], "loss_mask": [[1], [1], [1]]}
    train, held_out = pack_documents([batch], seq_len=2, eos_id=0, eos_is_target=True, validation_fraction=1.0)
    assert (train.documents, held_out.documents) == (0, 3)
    with pytest.raises(ValueError):  # a mask per document, or the batch is malformed
        pack_documents([{"input_ids": [[1], [2]], "loss_mask": [[1]]}], seq_len=2, eos_id=0, eos_is_target=True)


def test_position_ids_restart_per_row_on_a_batch_of_rows() -> None:
    flags = np.array([[2, 1, 2, 1], [1, 1, 2, 1]], np.uint8)
    assert position_ids(flags).tolist() == [[0, 1, 0, 1], [0, 1, 0, 1]]


class Tensorish:
    """What `load_state_dict` reads of a tensor (`.numpy()`), without importing torch."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def numpy(self) -> np.ndarray:
        return self.array


def test_a_data_position_counts_samples_and_restores_every_field() -> None:
    position = DataPosition(size=6, global_batch=2)
    position.record([0, 5])
    position.record([1])
    assert position.samples_seen == 3
    with pytest.raises(AssertionError, match=r"epoch 0: samples \[0\] trained twice"):
        position.record([0, 2])
    with pytest.raises(AssertionError, match="trained twice"):
        position.record([3, 3])
    state: dict[str, Any] = {"size": 6, "global_batch": 2, "epoch": 4, "step_in_epoch": 1, "samples_seen": 50,
                             "trained": Tensorish(np.array([1, 0, 0, 1, 0, 0], np.uint8))}  # fmt: skip
    restored = DataPosition(size=6, global_batch=2)
    restored.load_state_dict(state)
    assert (restored.epoch, restored.step_in_epoch, restored.samples_seen) == (4, 1, 50)
    assert restored.trained.dtype == bool and restored.trained.tolist() == [True, False, False, True, False, False]
    state["trained"].array[1] = 1
    assert not restored.trained[1]  # a copy, not a view of the checkpoint's tensor
    with pytest.raises(ValueError, match=r"for 6 sequences in global batches of 2; this run has 6 in batches of 3"):
        DataPosition(size=6, global_batch=3).load_state_dict(state)
