"""The exported directory as a user loads it: ``AutoTokenizer`` and ``AutoModelForCausalLM`` on it alone.

One rank trains a tiny pretrained Qwen2 on a little text and exports it; the loop's self-check loads the
export from the directory and compares token ids and loss with the run's own. A tokenizer of another
family than the model (a GPT-2-style byte-level BPE that keeps digits together, next to a Qwen2
config.json) is the case the check exists for.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_train.contract.config import TrainConfig
from fsdp_train.contract.events import Event, Export, Failure, parse_lines
from fsdp_train.models.parallelize import Topology
from fsdp_train.models.weights import ExportCheck, verify_export
from fsdp_train.run.loop import Host, train
from support.tiny_hf import TINY_QWEN2, byte_level_bpe, documents, save_tiny_model, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CODE = ["x = 12345 + 67890", "def count(n):\n    return n * 2024", "total = 100 + 250  # sum"]


def digit_tokenizer(directory: Path) -> Any:
    """A GPT-2-style byte-level BPE (digits stay together) that merged numbers: no Qwen2 tokenizer."""
    hf = byte_level_bpe(CODE * 20, vocab_size=400)
    hf.save_pretrained(directory)
    return hf


def config(tmp_path: Path, model: Path, **more: Any) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "model": str(model),
            "model_init": "pretrained",
            "data": str(tmp_path / "corpus.jsonl"),
            "steps": 2,
            "seq_len": 32,
            "batch_size_per_rank": 2,
            "learning_rate": 1e-3,
            "mixed_precision": "fp32",
            "probe_size_bytes": 0,
            "validation_split": 0.2,
            "output_path": str(tmp_path / "export"),
            **more,
        }
    )


def exports(capsys: pytest.CaptureFixture[str]) -> list[Event]:
    return [e for e in parse_lines(capsys.readouterr().out.splitlines()) if isinstance(e, (Export, Failure))]


def test_the_export_loads_as_the_trained_model_and_says_so(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = save_tiny_model(tmp_path / "model")
    write_jsonl(tmp_path / "corpus.jsonl", [{"text": d} for d in documents(80)])
    train(config(tmp_path, model), one_rank, Host(node_ip="127.0.0.1", env={}))
    (event,) = exports(capsys)
    assert isinstance(event, Export) and event.verified, event
    assert event.training_loss is not None and event.export_loss is not None
    assert abs(event.export_loss - event.training_loss) <= 0.01 * event.training_loss
    export = tmp_path / "export"
    assert json.loads((export / "config.json").read_text())["use_cache"] is True
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in export.iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


def test_a_tokenizer_of_another_family_is_what_autotokenizer_loads_from_the_export(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoTokenizer

    model = save_tiny_model(tmp_path / "model")
    tokenizer = digit_tokenizer(tmp_path / "tokenizer")
    write_jsonl(tmp_path / "corpus.jsonl", [{"text": c} for c in CODE * 40])
    train(config(tmp_path, model, tokenizer=str(tmp_path / "tokenizer")), one_rank, Host(node_ip="127.0.0.1", env={}))
    (export,) = exports(capsys)
    assert isinstance(export, Export) and export.verified, export
    # Short documents: many per row, so the loss check also covers the document boundaries.
    assert export.export_loss == pytest.approx(export.training_loss, rel=0.01)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    assert [loaded(c)["input_ids"] for c in CODE] == [tokenizer(c)["input_ids"] for c in CODE]


def test_an_export_that_autotokenizer_loads_differently_fails_naming_the_class(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    directory = tmp_path / "export"
    Qwen2ForCausalLM(Qwen2Config(**TINY_QWEN2, vocab_size=400)).save_pretrained(directory)
    trained = digit_tokenizer(tmp_path / "tokenizer")
    AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer")).save_pretrained(directory)  # no pin: as before
    tokens = torch.randint(0, 400, (1, 16))
    check = verify_export(
        directory,
        training_tokenizer=trained,
        texts=CODE,
        batch={"input_ids": tokens, "labels": tokens},
        training_loss=6.0,
        device=torch.device("cpu"),
    )
    assert not check.verified
    assert "AutoTokenizer.from_pretrained(export) loads Qwen2Tokenizer" in check.reason


def test_a_model_that_is_not_the_trained_one_fails_the_loss_check(tmp_path: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    directory = tmp_path / "export"
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**TINY_QWEN2, vocab_size=64)).save_pretrained(directory)
    tokens = torch.randint(0, 64, (2, 16))
    batch = {"input_ids": tokens, "labels": tokens}
    with torch.no_grad():
        loss = float(Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32)(**batch).loss)
    cpu = torch.device("cpu")
    good = verify_export(directory, training_tokenizer=None, texts=[], batch=batch, training_loss=loss, device=cpu)
    assert good == ExportCheck(True, loss, pytest.approx(loss), 0, "")
    bad = verify_export(
        directory, training_tokenizer=None, texts=[], batch=batch, training_loss=loss * 0.9, device=torch.device("cpu")
    )
    assert not bad.verified and "differs from training's" in bad.reason


def test_the_status_folds_both_losses_and_the_verdict() -> None:
    from datetime import UTC, datetime

    from fsdp_operator.api.spec import parse_job
    from fsdp_operator.decide.folding import fold_events
    from fsdp_operator.decide.status import JobStatus

    manifest = {"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", "metadata": {"name": "j"}, "spec": {}}
    job = parse_job(manifest)
    event = Export(rank=0, step=4, path="s3://m/x", verified=True, training_loss=2.5, export_loss=2.5012)
    folded = fold_events(job, JobStatus(), [event], now=datetime.now(UTC))
    assert folded.status.output == {
        "path": "s3://m/x",
        "step": 4,
        "seconds": 0.0,
        "verified": True,
        "trainingLoss": 2.5,
        "exportLoss": 2.5012,
    }


@pytest.mark.parametrize("broken", ["export", "training"])
def test_a_nan_loss_never_passes_the_export_check(tmp_path: Path, broken: str) -> None:
    """NaN compares false with everything: `not drift <= TOL` fails it, `drift > TOL` would let it pass."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    directory = tmp_path / "export"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**TINY_QWEN2, vocab_size=64))
    if broken == "export":
        with torch.no_grad():
            model.lm_head.weight.fill_(float("nan"))  # every logit NaN, so the export's loss is NaN
    model.save_pretrained(directory)
    tokens = torch.randint(0, 64, (2, 16))
    batch = {"input_ids": tokens, "labels": tokens}
    training_loss = float("nan") if broken == "training" else 4.0
    check = verify_export(
        directory, training_tokenizer=None, texts=[], batch=batch, training_loss=training_loss,
        device=torch.device("cpu"),
    )  # fmt: skip
    assert not check.verified and "differs from training's" in check.reason
