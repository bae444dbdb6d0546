"""`fsdpctl local make-model`: a model and tokenizer made offline load like published ones; the example uses them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fsdp_operator.api.spec import parse_job
from fsdp_operator.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-finetune.yaml"


def test_make_model_writes_what_auto_classes_load_and_the_tokenizer_learned_the_text(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    text = tmp_path / "notes.txt"
    text.write_text("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 50)
    assert main(["local", "make-model", str(tmp_path / "m"), "--text", str(text), "--vocab-size", "400"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert model.config.model_type == "qwen2" and model.config.vocab_size >= len(tokenizer)
    line = "return n if n < 2 else fibonacci(n - 1)"
    ids = tokenizer(line)["input_ids"]
    assert tokenizer.decode(ids) == line
    assert len(ids) < len(line) / 2  # merges learned from the text, not bytes
    assert tokenizer.eos_token == "<|endoftext|>"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    assert not (tmp_path / "m" / "sample.jsonl").exists()  # the user's own data is what they train on


def test_without_text_a_sample_corpus_comes_with_it_and_the_example_points_there(tmp_path: Path) -> None:
    assert main(["local", "make-model", str(tmp_path / "m")]) == 0
    rows = (tmp_path / "m" / "sample.jsonl").read_text().splitlines()
    assert len(rows) == 400 and all('"text"' in row for row in rows)
    job = parse_job(yaml.safe_load(EXAMPLE.read_text()))
    assert job.spec.model.init == "pretrained" and job.spec.workers.gpus_per_worker == 0
    assert "fsdpctl local make-model " + job.spec.model.name in EXAMPLE.read_text()
    assert job.spec.data.source == job.spec.model.name + "/sample.jsonl"


def test_unreadable_text_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", "make-model", str(tmp_path / "m"), "--text", str(tmp_path / "missing.txt")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'missing.txt'}: not a file"
