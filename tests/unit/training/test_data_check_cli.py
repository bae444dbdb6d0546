"""`fsdpctl data check`: the job's own data pipeline on its first rows, on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fsdp_operator.cli.main import main
from support.tiny_hf import conversations, save_tiny_model, write_jsonl


def job(tmp_path: Path, data: Path, model: Path) -> Path:
    manifest = {
        "apiVersion": "fsdp.dev/v1alpha1",
        "kind": "FSDPTrainingJob",
        "metadata": {"name": "sft"},
        "spec": {
            "model": {"name": str(model), "init": "pretrained"},
            "data": {"source": str(data), "format": "jsonl", "kind": "chat", "field": "messages"},
            "training": {"steps": 10, "seqLen": 64},
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("model"))


def test_good_chat_rows_print_counts_and_a_sample_with_its_targets_marked(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_jsonl(tmp_path / "chat" / "a.jsonl", [{"messages": c} for c in conversations(30)])
    assert main(["data", "check", "-f", str(job(tmp_path, data.parent, model)), "--rows", "20"]) == 0
    out = capsys.readouterr().out
    assert "rows read: 20 (the first 20 at most)" in out
    assert f"model: {model}: Qwen2ForCausalLM (model_type qwen2); attention: the document attention" in out
    assert "bad rows: 0" in out
    assert "packed: 20 documents into" in out
    first = conversations(30)[0]
    # Only the assistant's reply (and its end-of-turn marker) is a target.
    assert f"[[{first[2]['content']}<|im_end|>\n]]" in out
    assert f"[[{first[1]['content']}" not in out
    assert out.rstrip().endswith("verdict: trainable")


def test_human_bot_rows_are_named_and_the_verdict_is_a_finding(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roles = {"user": "human", "assistant": "bot"}
    rows = [{"messages": [{**m, "role": roles.get(m["role"], m["role"])} for m in c]} for c in conversations(10)]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    assert main(["data", "check", "-f", str(job(tmp_path, data, model))]) == 1
    out = capsys.readouterr().out
    assert f"bad rows: 10 ({data}: 10 of 10 rows, field 'messages': unknown role 'bot'" in out
    assert "verdict: the job would fail DataUnavailable: data source" in out
    assert "Traceback" not in out


def test_the_sample_is_the_packed_document_whose_first_token_is_no_target(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Training never predicts a document's first token (nothing of its document comes before it)."""
    from transformers import AutoTokenizer

    data = write_jsonl(tmp_path / "text.jsonl", [{"text": "the red fox jumps over the lazy dog"}] * 4)
    manifest = yaml.safe_load(job(tmp_path, data, model).read_text())
    manifest["spec"]["data"] = {"source": str(data), "format": "jsonl"}
    path = tmp_path / "text-job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["data", "check", "-f", str(path), "--rows", "4"]) == 0
    out = capsys.readouterr().out
    tokenizer = AutoTokenizer.from_pretrained(model)
    first = tokenizer.decode(tokenizer("the red fox")["input_ids"][:1])
    sample = out.split("sample (targets between [[ and ]]):\n", 1)[1].splitlines()[0]
    assert sample.startswith(first + "[[") and sample.endswith("<|endoftext|>]]"), sample
    assert "tokenizer: " in out and "AutoTokenizer" in out  # which class, and why


def test_the_model_family_it_resolved_and_the_attention_it_gets_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    tiny = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    gemma = tmp_path / "gemma"
    config = AutoConfig.for_model("gemma3_text", **tiny, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    AutoModelForCausalLM.from_config(config).save_pretrained(gemma)
    save_tiny_model(tmp_path / "tokenizer")  # its tokenizer only: the job names it in data.tokenizer
    data = write_jsonl(tmp_path / "chat" / "a.jsonl", [{"messages": c} for c in conversations(10)])
    manifest = yaml.safe_load(job(tmp_path, data.parent, gemma).read_text())
    manifest["spec"]["data"]["tokenizer"] = str(tmp_path / "tokenizer")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    assert main(["data", "check", "-f", str(tmp_path / "job.yaml")]) == 0
    out = capsys.readouterr().out
    assert f"model: {gemma}: Gemma3ForCausalLM (model_type gemma3_text); attention: Gemma3ForCausalLM has " in out
    assert "sliding-window layers" in out

    missing = yaml.safe_load((tmp_path / "job.yaml").read_text())
    missing["spec"]["model"]["name"] = str(tmp_path / "nowhere")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(missing))
    main(["data", "check", "-f", str(tmp_path / "job.yaml")])
    assert f"model: {tmp_path / 'nowhere'} (its config could not be read here: " in capsys.readouterr().out
