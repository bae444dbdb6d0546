"""The data pipeline's parts on real files: reading (JSONL, Parquet, text, S3 through moto), packing,
position ids and labels, the chat loss mask token by token, and the resumable order."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fsdp_train.contract.config import TrainConfig
from fsdp_train.datapath import data, packing
from fsdp_train.datapath import feed as feed_module
from fsdp_train.state import storage
from support.tiny_hf import EOS, IM_END, conversations, documents, train_tokenizer, write_jsonl, write_parquet


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(directory)
    return directory


def batch(*docs: tuple[list[int], list[int]]) -> dict[str, Any]:
    return {"input_ids": [d[0] for d in docs], "loss_mask": [d[1] for d in docs]}


# --- packing -----------------------------------------------------------------------------------------------


def test_documents_are_joined_with_eos_and_cut_into_rows_with_restarting_positions() -> None:
    train, held_out = packing.pack_documents(
        [batch(([11, 12, 13], [1, 1, 1]), ([21, 22], [1, 1])), batch(([31, 32, 33, 34], [1, 1, 1, 1]))],
        seq_len=4,
        eos_id=0,
        eos_is_target=True,
    )
    assert len(held_out) == 0 and train.documents == 3
    # 11 12 13 EOS | 21 22 EOS 31 | 32 33 34 EOS  (12 tokens: three full rows, no padding)
    assert train.input_ids.tolist() == [[11, 12, 13, 0], [21, 22, 0, 31], [32, 33, 34, 0]]
    assert packing.position_ids(train.flags).tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 2, 3]]
    # A document's first token is nobody's target (its context is another document); EOS is.
    assert packing.labels(train.input_ids, train.flags).tolist() == [
        [-100, 12, 13, 0],
        [-100, 22, 0, -100],
        [32, 33, 34, 0],
    ]


def test_the_last_row_is_padded_with_eos_that_is_no_target() -> None:
    train, _ = packing.pack_documents([batch(([5, 6, 7], [1, 1, 1]))], seq_len=3, eos_id=9, eos_is_target=False)
    assert train.input_ids.tolist() == [[5, 6, 7], [9, 9, 9]]
    assert packing.labels(train.input_ids, train.flags).tolist() == [[-100, 6, 7], [-100, -100, -100]]


def test_the_validation_split_is_by_document_and_does_not_depend_on_batching() -> None:
    docs = [([i, i + 1], [1, 1]) for i in range(10, 400, 2)]
    one = packing.pack_documents(
        [batch(*docs)], seq_len=8, eos_id=0, eos_is_target=True, validation_fraction=0.2, seed=3
    )
    many = packing.pack_documents(
        [batch(*docs[i : i + 7]) for i in range(0, len(docs), 7)],
        seq_len=8,
        eos_id=0,
        eos_is_target=True,
        validation_fraction=0.2,
        seed=3,
    )
    assert np.array_equal(one[0].input_ids, many[0].input_ids)
    assert np.array_equal(one[1].input_ids, many[1].input_ids)
    assert 20 <= one[1].documents <= 60 and one[0].documents + one[1].documents == len(docs)


# --- reading -----------------------------------------------------------------------------------------------


def prepared(cfg: TrainConfig, tokenizer_dir: Path) -> data.Prepared:
    return data.prepare_local(cfg, str(tokenizer_dir))


def test_jsonl_parquet_and_text_of_the_same_documents_pack_alike(tmp_path: Path, tokenizer_dir: Path) -> None:
    docs = documents(40)
    write_jsonl(tmp_path / "j" / "a.jsonl", [{"text": d, "id": i} for i, d in enumerate(docs[:25])])
    write_jsonl(tmp_path / "j" / "b.jsonl", [{"text": d} for d in docs[25:]])
    write_parquet(tmp_path / "p" / "part.parquet", [{"body": d} for d in docs])
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    got = [
        prepared(TrainConfig(data=str(tmp_path / "j"), seq_len=32), tokenizer_dir),
        prepared(TrainConfig(data=str(tmp_path / "p" / "part.parquet"), data_field="body", seq_len=32), tokenizer_dir),
        prepared(TrainConfig(data=str(tmp_path / "t"), seq_len=32), tokenizer_dir),
    ]
    assert got[0].train.documents == 40
    for other in got[1:]:
        assert np.array_equal(other.train.input_ids, got[0].train.input_ids)
        assert np.array_equal(other.train.flags, got[0].train.flags)


def test_the_format_comes_from_the_extension_unless_set(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "data.json", [{"text": "x"}])
    assert data.open_source(str(tmp_path)).format == "jsonl"
    (tmp_path / "corpus.dat").write_text("one\n")
    assert data.open_source(str(tmp_path / "corpus.dat"), "text").files == (str(tmp_path / "corpus.dat"),)
    with pytest.raises(storage.DataUnavailable, match="no file with a known extension"):
        data.open_source(str(tmp_path / "corpus.dat"))


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "no file with a known extension"),
        (
            lambda p: write_jsonl(p / "a.jsonl", [{"content": "x"}]),
            r"has no column 'text' \(columns: content\); set data.field",
        ),
        (lambda p: (p.mkdir(), (p / "a.jsonl").write_text("{not json\n")), "cannot read"),
    ],
)
def test_an_unreadable_source_is_data_unavailable(
    tmp_path: Path, tokenizer_dir: Path, setup: Any, message: str
) -> None:
    source = tmp_path / "src"
    setup(source)
    with pytest.raises(storage.DataUnavailable, match=message):
        prepared(TrainConfig(data=str(source), seq_len=16), tokenizer_dir)


def test_too_little_data_for_one_global_batch_is_data_unavailable(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": "the red fox"}])
    cfg = TrainConfig(data=str(tmp_path / "a.jsonl"), seq_len=16, batch_size_per_rank=2)
    with pytest.raises(
        storage.DataUnavailable, match=r"packs into 1 sequences of 16 tokens, fewer than one global batch \(4"
    ):
        data.check_usable(prepared(cfg, tokenizer_dir), cfg, world_size=2, vocab_size=512)


def test_token_ids_beyond_the_model_vocabulary_are_refused(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": d} for d in documents(20)])
    cfg = TrainConfig(data=str(tmp_path / "a.jsonl"), seq_len=16)
    with pytest.raises(ValueError, match=r"does not fit the model's vocabulary \(64 entries\)"):
        data.check_usable(prepared(cfg, tokenizer_dir), cfg, world_size=1, vocab_size=64)


def test_s3_through_moto_reads_the_same_documents(tmp_path: Path, tokenizer_dir: Path) -> None:
    from support.s3 import moto_s3

    rows = [{"text": d} for d in documents(30)]
    local = write_parquet(tmp_path / "train.parquet", rows)
    with moto_s3() as s3:
        uri = s3.upload(local, "corpus/train.parquet")
        source = data.open_source(uri.rsplit("/", 1)[0])
        assert (source.format, source.files) == ("parquet", (f"{s3.bucket}/corpus/train.parquet",))
        from_s3 = prepared(TrainConfig(data=f"s3://{s3.bucket}/corpus", seq_len=32), tokenizer_dir)
        with pytest.raises(storage.DataUnavailable, match=f"s3://{s3.bucket}/missing does not exist"):
            data.open_source(f"s3://{s3.bucket}/missing")
    from_disk = prepared(TrainConfig(data=str(local), seq_len=32), tokenizer_dir)
    assert np.array_equal(from_s3.train.input_ids, from_disk.train.input_ids)


# --- chat --------------------------------------------------------------------------------------------------


def test_chat_loss_is_on_assistant_tokens_only_token_by_token(tokenizer_dir: Path) -> None:
    tokenize = data.Tokenize(str(tokenizer_dir), "messages", "chat")
    messages = [
        {"role": "system", "content": "you repeat phrases"},
        {"role": "user", "content": "in the empty hall"},
        {"role": "assistant", "content": "old clocks tick"},
        {"role": "user", "content": "the lazy dog"},
        {"role": "assistant", "content": "the red fox"},
    ]
    ids, mask = tokenize.chat(messages)
    tok = tokenize.tokenizer
    pieces = [tok.decode([i]) for i in ids]
    # The rendering, token by token, with the loss mask: 1 exactly on the assistant replies and their end marker.
    trained = "".join(p for p, m in zip(pieces, mask, strict=True) if m)
    assert trained == f"old clocks tick{IM_END}\nthe red fox{IM_END}\n"
    spans, current = [], ""
    for piece, m in zip(pieces, mask, strict=True):
        if m:
            current += piece
        elif current:
            spans.append(current)
            current = ""
    spans.append(current)
    assert spans == [f"old clocks tick{IM_END}\n", f"the red fox{IM_END}\n"]
    untrained = "".join(p for p, m in zip(pieces, mask, strict=True) if not m)
    assert untrained == (
        "<|im_start|>system\nyou repeat phrases<|im_end|>\n<|im_start|>user\nin the empty hall<|im_end|>\n"
        "<|im_start|>assistant\n<|im_start|>user\nthe lazy dog<|im_end|>\n<|im_start|>assistant\n"
    )
    # Packed, the chat's EOS separator is no target either.
    train, _ = packing.pack_documents(
        [batch((ids, mask))], seq_len=len(ids) + 1, eos_id=tok.eos_token_id, eos_is_target=False
    )
    targets = packing.labels(train.input_ids, train.flags)[0]
    assert [int(t != -100) for t in targets] == [0, *mask[1:], 0]
    assert tok.convert_ids_to_tokens(int(train.input_ids[0, -1])) == EOS


def test_chat_rows_from_jsonl_are_read_as_message_lists(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in conversations(12)])
    cfg = TrainConfig(data=str(tmp_path / "chat.jsonl"), data_field="messages", data_kind="chat", seq_len=32)
    packed = prepared(cfg, tokenizer_dir).train
    assert packed.documents == 12
    assert 0 < int((packed.flags & packing.TARGET).astype(bool).sum()) < packed.input_ids.size // 2


def test_chat_rows_that_are_not_message_lists_are_data_unavailable(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_jsonl(tmp_path / "chat.jsonl", [{"messages": "hello"}])
    cfg = TrainConfig(data=str(tmp_path / "chat.jsonl"), data_field="messages", data_kind="chat", seq_len=32)
    with pytest.raises(storage.DataUnavailable, match=r"field 'messages': not a list of \{role, content\} messages"):
        prepared(cfg, tokenizer_dir)


def human_bot(conversation: list[dict[str, str]]) -> list[dict[str, str]]:
    roles = {"user": "human", "assistant": "bot"}
    return [{"role": roles.get(m["role"], m["role"]), "content": m["content"]} for m in conversation]


def test_chat_with_unknown_roles_only_fails_naming_role_field_and_file(tmp_path: Path, tokenizer_dir: Path) -> None:
    path = write_jsonl(tmp_path / "chat" / "a.jsonl", [{"messages": human_bot(c)} for c in conversations(20)])
    cfg = TrainConfig(data=str(tmp_path / "chat"), data_field="messages", data_kind="chat", seq_len=32)
    with pytest.raises(storage.DataUnavailable) as caught:
        prepared(cfg, tokenizer_dir)
    message = str(caught.value)
    assert "no row can be trained on" in message
    assert f"{path}: 20 of 20 rows, field 'messages': unknown role 'bot'" in message


def test_rows_without_targets_are_counted_per_file_and_fail_above_the_share(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [{"messages": c} for c in conversations(100)]
    no_assistant = [{"messages": c[:2]} for c in conversations(10)]
    # One bad row among 100 good ones: trained without it, and said so with its file.
    write_jsonl(tmp_path / "few" / "good.jsonl", good)
    few = write_jsonl(tmp_path / "few" / "bad.jsonl", no_assistant[:1])
    cfg = TrainConfig(data=str(tmp_path / "few"), data_field="messages", data_kind="chat", seq_len=32)
    assert prepared(cfg, tokenizer_dir).train.documents == 100
    printed = capsys.readouterr().out
    dropped = f"dropped 1 of 101 rows that cannot be trained on ({few}: 1 of 1 rows, field 'messages': no target"
    assert dropped in printed
    # Ten: more than MAX_BAD_SHARE of the rows, the job fails before any model is built.
    write_jsonl(tmp_path / "many" / "good.jsonl", good)
    many = write_jsonl(tmp_path / "many" / "bad.jsonl", no_assistant)
    cfg = TrainConfig(data=str(tmp_path / "many"), data_field="messages", data_kind="chat", seq_len=32)
    expected = re.escape(f"10 of 110 rows cannot be trained on, more than 5% ({many}")
    with pytest.raises(storage.DataUnavailable, match=expected):
        prepared(cfg, tokenizer_dir)


def test_a_missing_field_is_named_with_its_file_per_row_and_per_file(tmp_path: Path, tokenizer_dir: Path) -> None:
    rows = [{"text": d} for d in documents(30)] + [{"body": "the red fox"}] * 10
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    expected = re.escape(f"{path}: 10 of 40 rows, field 'text': field missing or null")
    with pytest.raises(storage.DataUnavailable, match=expected):
        prepared(TrainConfig(data=str(path), seq_len=32), tokenizer_dir)
    # A batch without the column at all (Ray Data hands the tokenizer whole files' rows): file and field named.
    tokenize = data.Tokenize(str(tokenizer_dir), "conversations", "chat")
    expected = re.escape("s3://b/x.jsonl has no field 'conversations' (fields: text)")
    with pytest.raises(storage.DataUnavailable, match=expected):
        tokenize({"text": ["a"], "path": ["s3://b/x.jsonl"]})


# --- order and resume ----------------------------------------------------------------------------------------


def feeds(size: int, world: int, batch_size: int = 2, accum: int = 1) -> list[feed_module.TrainFeed]:
    packed = packing.Packed(np.arange(size * 4, dtype=np.int32).reshape(size, 4), np.ones((size, 4), np.uint8))
    return [
        feed_module.TrainFeed(packed, rank=r, world_size=world, batch_size=batch_size, grad_accum=accum, seed=5)
        for r in range(world)
    ]


def run_steps(group: list[feed_module.TrainFeed], steps: int) -> Iterator[tuple[int, list[int]]]:
    for _ in range(steps):
        epoch = group[0].position.epoch
        results = [feed.next_step() for feed in group]
        assert all(r[1] == results[0][1] for r in results)  # every rank knows the whole step's samples
        mine = [int(i) for r in results for b in r[0] for i in b["sample_ids"]]
        assert sorted(mine) == sorted(results[0][1])
        for feed in group:
            feed.finish_step()
        yield epoch, results[0][1]


def test_every_sample_trains_once_per_epoch_and_the_order_changes_between_epochs() -> None:
    group = feeds(size=21, world=2, batch_size=2, accum=2)  # 21 // 2 * 2 = 20 usable: 2 steps of 8, 4 left over
    assert group[0].steps_per_epoch == 2
    seen = list(run_steps(group, 6))
    by_epoch: dict[int, list[int]] = {}
    for epoch, ids in seen:
        by_epoch.setdefault(epoch, []).extend(ids)
    assert sorted(by_epoch) == [0, 1, 2]
    for ids in by_epoch.values():
        assert len(ids) == len(set(ids)) == 16 and set(ids) <= set(range(21))
    assert by_epoch[0] != by_epoch[1]


def test_a_restored_position_continues_with_the_same_samples() -> None:
    import torch

    straight = [ids for _, ids in run_steps(feeds(size=30, world=3), 9)]
    first = feeds(size=30, world=3)
    before = [ids for _, ids in run_steps(first, 4)]
    saved = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in first[0].position.state_dict().items()}
    resumed = feeds(size=30, world=3)
    for feed in resumed:
        feed.position.load_state_dict(saved)
    after = [ids for _, ids in run_steps(resumed, 5)]
    assert before + after == straight


def test_training_a_sample_twice_in_an_epoch_is_caught() -> None:
    position = packing.DataPosition(size=10, global_batch=2)
    position.record([3, 4])
    with pytest.raises(AssertionError, match=r"samples \[4\] trained twice"):
        position.record([4, 5])


def test_an_epoch_that_skipped_samples_is_caught() -> None:
    position = packing.DataPosition(size=10, global_batch=4, step_in_epoch=1)  # as if step 1 had been lost
    position.record([0, 1, 2, 3])
    with pytest.raises(AssertionError, match="epoch 0 trained 4 samples, expected 8"):
        position.finish_step()


def test_a_position_saved_for_other_data_or_batch_sizes_is_refused() -> None:
    saved = packing.DataPosition(size=10, global_batch=4).state_dict()
    with pytest.raises(ValueError, match="for 10 sequences in global batches of 4; this run has 10 in batches of 2"):
        packing.DataPosition(size=10, global_batch=2).load_state_dict(saved)


def test_eval_batches_give_every_rank_the_same_count_and_each_row_once() -> None:
    packed = packing.Packed(np.arange(7 * 4, dtype=np.int32).reshape(7, 4), np.full((7, 4), packing.TARGET, np.uint8))
    per_rank = [list(feed_module.eval_batches(packed, rank=r, world_size=3, batch_size=2)) for r in range(3)]
    assert [len(b) for b in per_rank] == [2, 2, 2]
    real = sorted(
        int(row[0]) // 4
        for batches in per_rank
        for b in batches
        for row, labels in zip(b["input_ids"], b["labels"], strict=True)
        if (labels != -100).any()
    )
    assert real == list(range(7))


def test_samples_digest_depends_on_order() -> None:
    assert packing.samples_digest([1, 2]) != packing.samples_digest([2, 1])
    assert packing.samples_digest([1, 2]) == packing.samples_digest([1, 2])
    assert json.dumps(packing.samples_digest([7]))  # a plain string


def test_without_the_document_mask_positions_run_through_the_row() -> None:
    train, _ = packing.pack_documents(
        [batch(([11, 12], [1, 1]), ([21, 22], [1, 1]), ([31], [1]))], seq_len=4, eos_id=0, eos_is_target=True
    )
    masked = feed_module.Collate(train)([0, 1])  # 11 12 EOS 21 | 22 EOS 31 EOS
    plain = feed_module.Collate(train, document_mask=False)([0, 1])
    assert masked["position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 0, 1]]
    assert plain["position_ids"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert plain["labels"].tolist() == masked["labels"].tolist()  # the targets do not change
