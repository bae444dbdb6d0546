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


def test_jsonl_text_trains_the_tokenizer_on_its_documents_not_its_keys(tmp_path: Path) -> None:
    """`--text chat.jsonl`: the contents are the text; `role`, `content` and the JSON around them are not."""
    import json

    from transformers import AutoTokenizer, GenerationConfig

    rows = [
        {"messages": [{"role": "user", "content": "bonjour le monde"}, {"role": "assistant", "content": "salut"}]},
        {"text": "un deux trois quatre"},
    ]
    text = tmp_path / "chat.jsonl"
    text.write_text("".join(json.dumps(r) + "\n" for r in rows * 200))
    assert main(["local", "make-model", str(tmp_path / "m"), "--text", str(text), "--vocab-size", "400"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    learned = set(tokenizer.get_vocab())
    assert not [t for t in learned if "content" in t or "role" in t or '":' in t]
    assert len(tokenizer("bonjour le monde")["input_ids"]) <= 3  # merged from the documents
    # A chat model stops at the end of its turn, not only at the end of a document.
    generation = GenerationConfig.from_pretrained(tmp_path / "m")
    assert set(generation.eos_token_id) == {tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")}


def test_make_model_prints_no_library_warnings(tmp_path: Path) -> None:
    """No torchao kernel-loading or pytree deprecation lines, no progress bar: stderr stays empty."""
    import subprocess
    import sys

    fsdpctl = Path(sys.executable).with_name("fsdpctl")
    done = subprocess.run(
        [str(fsdpctl), "local", "make-model", str(tmp_path / "m")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
