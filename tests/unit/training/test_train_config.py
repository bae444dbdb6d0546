"""Unit tests of the training function's config: defaults, field-named errors, types, JSON/file entry."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fsdp_train.__main__ import parse_args
from fsdp_train.contract.config import TrainConfig

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512}


def test_defaults_and_round_trip() -> None:
    cfg = TrainConfig.from_dict({})
    assert cfg.model == "Qwen/Qwen2.5-1.5B"
    assert cfg.sharding == "auto"
    assert (cfg.loss_chunk_tokens, cfg.reshard_after_forward) == (4096, True)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_known_fields_are_taken() -> None:
    cfg = TrainConfig.from_dict(
        {"model_overrides": TINY, "steps": 20, "seq_len": 32, "learning_rate": 1, "sharding": "hybrid"}
    )
    assert (cfg.steps, cfg.seq_len, cfg.sharding) == (20, 32, "hybrid")
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert cfg.model_overrides == TINY
    assert cfg.tokens_per_rank_per_step == 32


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"seq_len": 0}, "training.seq_len must be greater than 0."),
        ({"steps": -1}, "training.steps must be greater than 0."),
        ({"grad_accum": 0}, "training.grad_accum must be greater than 0."),
        ({"checkpoint_interval": -5}, "training.checkpoint_interval must be 0 or greater."),
        ({"learning_rate": 0.0}, "training.learning_rate must be greater than 0."),
        ({"min_cross_node_gbps": -1.0}, "training.min_cross_node_gbps must be 0 or greater."),
        ({"sharding": "zero3"}, "training.sharding must be one of full, hybrid, auto; got 'zero3'."),
        ({"mixed_precision": "fp16"}, "training.mixed_precision must be one of bf16, fp32"),
        ({"model_init": "weights"}, "training.model_init must be one of pretrained, random"),
        ({"lr_schedule": "linear"}, "training.lr_schedule must be one of constant, cosine"),
        ({"data": "ftp://bucket"}, "training.data must be random or a location starting with s3://"),
        ({"seq_len": "2048"}, "training.seq_len must be an integer, got '2048'."),
        ({"steps": True}, "training.steps must be an integer, got True."),
        ({"steps": 2.5}, "training.steps must be an integer, got 2.5."),
        ({"compile": 1}, "training.compile must be true or false, got 1."),
        ({"loss_chunk_tokens": -1}, "training.loss_chunk_tokens must be 0 or greater."),
        ({"reshard_after_forward": "no"}, "training.reshard_after_forward must be true or false, got 'no'."),
        ({"learning_rate": "fast"}, "training.learning_rate must be a number"),
        ({"model_overrides": [1]}, "training.model_overrides must be a mapping"),
        ({"model": ""}, "training.model must not be empty."),
        ({"warmup_steps": 10, "steps": 10}, "training.warmup_steps must be less than training.steps"),
        ({"seqlen": 5}, "training.seqlen is not a known field"),
    ],
)
def test_bad_values_name_the_field(patch: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        TrainConfig.from_dict(patch)
    assert str(info.value).startswith(message)


def test_not_a_mapping() -> None:
    with pytest.raises(ValueError, match="training must be a mapping"):
        TrainConfig.from_dict([1, 2])  # type: ignore[arg-type]


def test_command_line_json_and_file(tmp_path: Path) -> None:
    assert parse_args(["--config-json", '{"steps": 3}']).steps == 3
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"seq_len": 64}))
    assert parse_args(["--config", str(path)]).seq_len == 64


def test_command_line_rejects_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--config-json", '{"seq_len": 0}'])
    assert info.value.code == 2
    assert "training.seq_len must be greater than 0." in capsys.readouterr().err


def test_the_learning_rate_warms_up_linearly_then_follows_its_schedule() -> None:
    cosine = TrainConfig(steps=10, warmup_steps=2, learning_rate=1.0, lr_schedule="cosine")
    # Warm-up: step/warmup; then cosine from the peak at step 2 to 0 at step 10 (8 decay steps).
    assert [cosine.learning_rate_at(s) for s in (1, 2)] == [0.5, 1.0]
    assert cosine.learning_rate_at(3) == pytest.approx(0.5 * (1 + math.cos(math.pi / 8)))
    assert cosine.learning_rate_at(6) == pytest.approx(0.5)
    assert cosine.learning_rate_at(10) == pytest.approx(0.0)
    assert cosine.learning_rate_at(11) == pytest.approx(0.0)  # past the end it stays at 0
    no_warmup = TrainConfig(steps=4, learning_rate=2.0, lr_schedule="cosine")
    expected = [2.0 * 0.5 * (1 + math.cos(math.pi / 4)), 1.0, 0.0]
    assert [no_warmup.learning_rate_at(s) for s in (1, 2, 4)] == pytest.approx(expected)
    constant = TrainConfig(steps=10, learning_rate=0.1, lr_schedule="constant")
    assert {constant.learning_rate_at(s) for s in range(1, 11)} == {0.1}
    warm_constant = TrainConfig(steps=10, warmup_steps=4, learning_rate=0.4, lr_schedule="constant")
    assert [warm_constant.learning_rate_at(s) for s in (1, 4, 5, 10)] == pytest.approx([0.1, 0.4, 0.4, 0.4])


def test_evaluating_needs_validation_data() -> None:
    message = r"eval_every_steps needs training.validation_split or training.validation_data"
    with pytest.raises(ValueError, match=message):
        TrainConfig(data="s3://bucket/corpus", eval_every_steps=10)
    assert TrainConfig(data="s3://bucket/corpus", eval_every_steps=10, validation_split=0.1).has_validation
    assert TrainConfig(data="s3://bucket/corpus", eval_every_steps=10, validation_data="s3://bucket/v").has_validation
