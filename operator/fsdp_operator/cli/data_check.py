"""`fsdpctl data check -f JOB.yaml`: the job's data pipeline on its first rows, here, before any GPU is asked for.

The training function's own code runs (``fsdp_train.datapath.data``): the job's tokenizer, its chat template and
loss masks, the bad-row rules and the packing. It prints the rows read, the rows that cannot be trained
on (per file, with field and reason), token and target counts, the packed rows, and one rendered
sample with its targets marked. Exit codes as for every fsdpctl command: 0 the rows can be trained on,
1 a finding (the job would fail ``DataUnavailable`` on these rows), 2 unusable input.
"""

from __future__ import annotations

import argparse
from typing import Any

TARGET_OPEN, TARGET_CLOSE = "[[", "]]"
"""Marks around the target tokens (the ones the loss is on) in the rendered sample."""


def add_parser(sub: Any) -> None:
    """Register `data check` on fsdpctl's subcommands."""
    p = sub.add_parser("data", help="check a job's data on this machine before it runs")
    what = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    c = what.add_parser(
        "check", help="run the job's data pipeline on its first rows: tokens, targets, bad rows, a rendered sample"
    )
    c.add_argument("-f", "--file", required=True, help="FSDPTrainingJob YAML, or - for stdin")
    c.add_argument("--rows", type=int, default=1000, help="rows to read from the start of the data (default: 1000)")
    c.set_defaults(func=cmd_data_check)


def cmd_data_check(args: argparse.Namespace) -> int:
    from fsdp_operator.cli.quiet import quiet_library_warnings

    quiet_library_warnings()
    from fsdp_train.contract.config import RANDOM_DATA, TrainConfig

    from fsdp_operator.api.render import train_config
    from fsdp_operator.cli.inputs import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_OK, load_job

    if args.rows < 1:
        print("error: --rows must be at least 1")
        return EXIT_BAD_INPUT
    cfg = TrainConfig.from_dict(train_config(load_job(args.file)))
    if cfg.data == RANDOM_DATA:
        print("spec.data: random tokens; there is no data to check")
        return EXIT_OK
    try:
        return EXIT_OK if check(cfg, args.rows) else EXIT_FINDING
    except Exception as e:  # a source or tokenizer that cannot be read: one line, no traceback
        print(f"error: {type(e).__name__}: {e}")
        return EXIT_FINDING


def check(cfg: Any, rows: int) -> bool:
    """Print the report for the first ``rows`` rows of ``cfg.data``; False when the job would fail on them."""
    from fsdp_train.datapath.data import (
        Tokenize,
        check_rows,
        eos_is_target,
        load_tokenizer_choice,
        open_source,
        read_tables,
        tokenizer_location,
    )
    from fsdp_train.datapath.packing import TARGET, DataReport, pack_documents
    from fsdp_train.state.storage import DataUnavailable

    tokenize = Tokenize(tokenizer_location(cfg, None), cfg.data_field, cfg.data_kind)
    source = open_source(cfg.data, cfg.data_format)
    batches: list[dict[str, Any]] = []
    left = rows
    for table in read_tables(source, cfg.data_field):
        if left <= 0:
            break
        batches.append(tokenize(table.slice(0, left)))
        left -= min(left, table.num_rows)
    report = DataReport()
    tokenizer = tokenize.tokenizer
    packed, _ = pack_documents(
        batches,
        seq_len=cfg.seq_len,
        eos_id=int(tokenizer.eos_token_id),
        eos_is_target=eos_is_target(cfg.data_kind),
        report=report,
    )
    tokens = sum(len(ids) for b in batches for ids in b["input_ids"])
    targets = int(((packed.flags & TARGET) != 0).sum())
    files = len(source.files)
    print(f"model: {model_family(cfg)}")
    print(f"data: {cfg.data} ({source.format}, {files} files, field {cfg.data_field!r}, kind {cfg.data_kind})")
    print(f"tokenizer: {tokenize.tokenizer_location}: {load_tokenizer_choice(tokenize.tokenizer_location).why}")
    print(f"rows read: {report.total_rows} (the first {rows} at most)")
    print(f"bad rows: {report.total_bad}" + (f" ({report.describe(cfg.data_field)})" if report.total_bad else ""))
    print(f"tokens: {tokens:,}, of them targets: {targets:,}")
    print(f"packed: {packed.documents} documents into {len(packed)} rows of {cfg.seq_len} tokens")
    # The first packed row as training sees it: a document's first token is no target there (nothing in its
    # document comes before it), and the EOS that joins documents is one only for kind chat.
    sample = first_document(packed) if len(packed) else None
    if sample is not None:
        print(f"sample (targets between {TARGET_OPEN} and {TARGET_CLOSE}):")
        print(render_sample(tokenizer, list(sample[0]), list(sample[1])))
    try:
        check_rows(report, cfg)
    except DataUnavailable as e:
        print(f"verdict: the job would fail DataUnavailable: {e}")
        return False
    if not targets:
        print("verdict: the job would fail DataUnavailable: no target token in these rows")
        return False
    print("verdict: trainable")
    return True


def model_family(cfg: Any) -> str:
    """The model's architecture and family as its config names them, and the attention the training path gives it
    (``fsdp_train.contract.families``); or why the config could not be read here."""
    from fsdp_train.contract.config import ConfigError
    from fsdp_train.contract.families import DOCUMENT_ATTENTION, architecture, attention_for
    from fsdp_train.contract.known_models import KNOWN_CONFIGS

    try:
        from transformers import AutoConfig, PretrainedConfig

        if cfg.model in KNOWN_CONFIGS and cfg.model_init == "random":
            known = dict(KNOWN_CONFIGS[cfg.model])
            config = AutoConfig.for_model(known.pop("model_type"), **known)
        else:
            config = AutoConfig.from_pretrained(cfg.model)
        assert isinstance(config, PretrainedConfig)
    except Exception as e:  # a hub id this machine cannot reach, a directory without config.json
        return f"{cfg.model} (its config could not be read here: {type(e).__name__}: {str(e)[:200]})"
    name = f"{cfg.model}: {architecture(config)} (model_type {config.model_type})"
    try:
        attention, why = attention_for(config)
    except ConfigError as e:
        return f"{name}; the job would fail: {e}"
    return f"{name}; attention: " + ("the document attention" if attention == DOCUMENT_ATTENTION else why)


def first_document(packed: Any) -> tuple[list[int], list[int]]:
    """The first document of the first packed row, through the EOS that ends it: (ids, target marks)."""
    from fsdp_train.datapath.packing import DOC_START, TARGET

    ids = [int(i) for i in packed.input_ids[0]]
    flags = [int(f) for f in packed.flags[0]]
    end = next((i for i in range(1, len(flags)) if flags[i] & DOC_START), len(flags))
    return ids[:end], [f & TARGET for f in flags[:end]]


def render_sample(tokenizer: Any, ids: list[int], mask: list[int]) -> str:
    """The row's text, with each run of target tokens wrapped in the target marks."""
    parts: list[str] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or bool(mask[i]) != bool(mask[start]):
            text = tokenizer.decode(ids[start:i])
            parts.append(f"{TARGET_OPEN}{text}{TARGET_CLOSE}" if mask[start] else text)
            start = i
    return "".join(parts)
