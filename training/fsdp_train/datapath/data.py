"""The training data: read the user's documents, tokenize them, pack them into ``seq_len`` sequences,
and hand every rank its samples in an order that a resumed run reproduces exactly.

One pipeline, two front ends. Under Ray, Ray Data reads the source and tokenizes in ``map_batches``
(``ray_datasets``); under torchrun the same ``Tokenize`` runs over pyarrow's readers
(``load_packed``). Both feed the same ``pack_documents``, and the packed sequences reach the loop
through a ``DataLoader`` (``fsdp_train.datapath.feed``) whose sampler is torch's ``DistributedSampler`` plus a
start offset (``ResumableSampler``), so where a run stands is two numbers, epoch and step in epoch, that the
checkpoint carries (``DataPosition``).

How documents become packed sequences, and what a position in them is, lives in ``fsdp_train.datapath.packing``
(pure numpy); reading needs no torch, the loader parts import it.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fsdp_train.datapath.packing import (
    DataReport,
    Packed,
    pack_documents,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

    from fsdp_train.contract.config import TrainConfig
from fsdp_train.datapath.tokenizer_choice import TokenizerChoice, choose_tokenizer
from fsdp_train.state.storage import DataUnavailable, filesystem, on_one_rank_per_node

EXTENSIONS: dict[str, tuple[str, ...]] = {
    "jsonl": (".jsonl", ".json", ".jsonl.gz", ".json.gz"),
    "parquet": (".parquet", ".pq"),
    "text": (".txt", ".text", ".md", ".txt.gz"),
}


CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
"""Roles a chat row may use (the chat templates' roles); any other makes the row bad."""
NO_TARGETS = "no target token (a chat needs an assistant turn, a text some text)"
MISSING_FIELD = "field missing or null"
MAX_BAD_SHARE = 0.05
"""Above this share of bad rows in the training data the job fails ``DataUnavailable``; below, they are
dropped and counted (docs/data.md)."""


class BadRow(ValueError):
    """One row that cannot be trained on; the message says why (counted per file, not fatal alone)."""


# --- where the documents are ----------------------------------------------------------------------


def infer_format(path: str) -> str | None:
    lower = path.lower()
    for fmt, endings in EXTENSIONS.items():
        if lower.endswith(endings):
            return fmt
    return None


@dataclass(frozen=True, slots=True)
class Source:
    """A readable data source: its files (sorted, so every reader sees them in one order) and format."""

    uri: str
    fs: pafs.FileSystem
    files: tuple[str, ...]
    format: str
    sizes: tuple[int, ...] = ()

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps([self.uri, self.format, self.files, self.sizes]).encode()).hexdigest()[:16]


def open_source(uri: str, fmt: str = "") -> Source:
    """List the files of ``uri`` (a file, a directory or a prefix); ``DataUnavailable`` when there are none."""
    import pyarrow.fs as pafs

    try:
        fs, path = filesystem(uri)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            infos = [info]
        elif info.type == pafs.FileType.Directory:
            infos = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.is_file]
        else:
            raise DataUnavailable(f"data source {uri} does not exist")
    except DataUnavailable:
        raise
    except Exception as e:  # pyarrow raises OSError, ArrowInvalid, ...: all mean "cannot read it"
        raise DataUnavailable(f"cannot read data source {uri}: {type(e).__name__}: {e}") from e
    names = sorted((i for i in infos if not i.base_name.startswith((".", "_"))), key=lambda i: i.path)
    chosen = fmt or next((f for f in map(infer_format, (i.path for i in names)) if f), None)
    if chosen is None:
        known = ", ".join(e for endings in EXTENSIONS.values() for e in endings)
        raise DataUnavailable(f"data source {uri}: no file with a known extension ({known}); set data.format")
    if info.type == pafs.FileType.Directory:
        names = [i for i in names if infer_format(i.path) == chosen] if not fmt else names
    if not names:
        raise DataUnavailable(f"data source {uri} holds no {chosen} files")
    return Source(uri, fs, tuple(i.path for i in names), chosen, tuple(int(i.size or 0) for i in names))


def read_tables(source: Source, column: str) -> Iterator[pa.Table]:
    """The documents of every file, one table per file: the column ``column`` and the file's ``path``."""
    import pyarrow as pa
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    for path in source.files:
        try:
            if source.format == "parquet":
                table = pq.read_table(path, filesystem=source.fs, columns=[column])
            else:
                compression = "gzip" if path.endswith(".gz") else None
                with source.fs.open_input_stream(path, compression=compression) as stream:
                    raw = stream.read()
                if source.format == "text":
                    lines = [line for line in raw.decode("utf-8").splitlines() if line.strip()]
                    table = pa.table({column: pa.array(lines, pa.string())})
                else:
                    table = pajson.read_json(io.BytesIO(raw))
        except Exception as e:
            raise DataUnavailable(f"cannot read {source.uri} ({path}): {type(e).__name__}: {e}") from e
        if column not in table.column_names:
            raise DataUnavailable(
                f"{path} has no column {column!r} (columns: {', '.join(table.column_names)}); set data.field"
            )
        yield table.select([column]).append_column("path", pa.array([path] * table.num_rows, pa.string()))


# --- tokenizing ---------------------------------------------------------------------------------------


@functools.cache
def load_tokenizer(location: str) -> Any:
    """The tokenizer at ``location`` (a directory, an ``s3://`` prefix or a hub id), fetched to this node
    first: Ray Data runs the tokenizing tasks on any node of the cluster. See :func:`choose_tokenizer`."""
    return load_tokenizer_choice(location).tokenizer


@functools.cache
def load_tokenizer_choice(location: str) -> TokenizerChoice:
    """:func:`load_tokenizer` with why that class."""
    from fsdp_train.state.storage import TOKENIZER_FILE_PATTERNS, fetch

    choice = choose_tokenizer(fetch(location, patterns=TOKENIZER_FILE_PATTERNS))
    if choice.tokenizer.eos_token_id is None:
        raise ValueError(f"training.tokenizer: the tokenizer in {location} has no EOS token to separate documents.")
    return choice


@dataclass(slots=True)
class Tokenize:
    """Documents -> token ids and loss masks; a class so that Ray Data builds the tokenizer once per actor.

    ``kind: text``: every token is a target. ``kind: chat``: the conversation is rendered with the
    tokenizer's chat template and only the tokens of assistant turns (their content and the template's
    end-of-turn marker) are targets. Which characters belong to a turn comes from rendering the
    conversation up to it, so any template whose renderings of prefixes are prefixes works; token
    offsets then map characters to tokens.
    """

    tokenizer_location: str
    column: str
    kind: str
    _tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_location)
        return self._tokenizer

    def __call__(self, batch: pa.Table | dict[str, Any]) -> dict[str, list[Any]]:
        names = batch.column_names if hasattr(batch, "column_names") else list(batch)
        paths = _column(batch, "path") if "path" in names else []
        if self.column not in names:
            where = paths[0] if paths else "the data"
            fields = ", ".join(n for n in names if n != "path")
            raise DataUnavailable(f"{where} has no field {self.column!r} (fields: {fields}); set data.field")
        docs = _column(batch, self.column)
        ids: list[list[int]] = []
        masks: list[list[int]] = []
        problems: list[str] = []
        if self.kind == "chat":
            for doc in docs:
                try:
                    row_ids, row_mask = self.chat(doc)
                    problem = "" if any(row_mask) else NO_TARGETS
                except BadRow as e:
                    row_ids, row_mask, problem = [], [], str(e)
                ids.append(row_ids if not problem else [])
                masks.append(row_mask if not problem else [])
                problems.append(problem)
        else:
            problems = [_text_problem(doc) for doc in docs]
            texts = [doc for doc, problem in zip(docs, problems, strict=True) if not problem]
            encoded = iter(self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
            for problem in problems:
                row = [] if problem else list(next(encoded))
                ids.append(row)
                masks.append([1] * len(row))
        return {
            "input_ids": ids,
            "loss_mask": masks,
            "problem": problems,
            "path": paths or [""] * len(docs),
        }

    def chat(self, messages: Any) -> tuple[list[int], list[int]]:
        """Token ids and loss mask of one conversation; ``BadRow`` names what is wrong with it."""
        if messages is None:
            raise BadRow(MISSING_FIELD)
        if hasattr(messages, "tolist"):
            messages = messages.tolist()
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise BadRow("not a list of {role, content} messages")
        unknown = sorted({m["role"] for m in messages} - CHAT_ROLES)
        if unknown:
            raise BadRow(f"unknown role {unknown[0]!r} (roles: {', '.join(sorted(CHAT_ROLES))})")
        if not any(m["role"] == "assistant" for m in messages):
            raise BadRow(NO_TARGETS)
        tok = self.tokenizer
        render: Callable[..., str] = tok.apply_chat_template
        text = render(messages, tokenize=False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = len(render(messages[:i], tokenize=False, add_generation_prompt=True)) if i else 0
            end = len(render(messages[: i + 1], tokenize=False))
            spans.append((start, end))
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [int(any(s <= a and b <= e and b > a for s, e in spans)) for a, b in enc["offset_mapping"]]
        return list(enc["input_ids"]), mask


def _column(batch: Any, name: str) -> list[Any]:
    values = batch[name]
    return values.to_pylist() if hasattr(values, "to_pylist") else list(values)


def _text_problem(doc: Any) -> str:
    if doc is None:
        return MISSING_FIELD
    if not isinstance(doc, str):
        return f"not a string ({type(doc).__name__})"
    return "" if doc.strip() else NO_TARGETS


# --- the whole pipeline under torchrun, cached per node ------------------------------------------------


CACHE_DIR_ENV = "FSDP_TRAIN_DATA_CACHE"


@dataclass(frozen=True, slots=True)
class Prepared:
    train: Packed
    validation: Packed | None


def tokenizer_location(cfg: TrainConfig, model_dir: str | None) -> str:
    return cfg.tokenizer or model_dir or cfg.model


def eos_is_target(kind: str) -> bool:
    # Text: the model learns where documents end. Chat: only assistant turns are targets, and the
    # template's end-of-turn marker already ends each of them.
    return kind == "text"


def packed(cfg: TrainConfig, tokenized: Callable[[str], Iterator[dict[str, Any]]], eos: int) -> Prepared:
    """The documents of ``cfg.data`` (and ``cfg.validation_data``) packed into rows, the held-out part split off, the
    rows checked against what the run needs (``check_rows``); both readers end here."""
    pack = functools.partial(
        pack_documents, seq_len=cfg.seq_len, eos_id=eos, eos_is_target=eos_is_target(cfg.data_kind)
    )
    report = DataReport()
    train, held_out = pack(
        tokenized(cfg.data), validation_fraction=cfg.validation_split, seed=cfg.shuffle_seed, report=report
    )
    check_rows(report, cfg)
    if cfg.validation_data:
        held_out, _ = pack(tokenized(cfg.validation_data))
    return Prepared(train, held_out if cfg.has_validation else None)


def prepare_local(cfg: TrainConfig, tokenizer_dir: str, *, batch_rows: int = 1024) -> Prepared:
    """Read, tokenize and pack with pyarrow's readers (torchrun, one process per node does it)."""
    tokenize = Tokenize(tokenizer_dir, cfg.data_field, cfg.data_kind)

    def tokenized(uri: str) -> Iterator[dict[str, Any]]:
        source = open_source(uri, cfg.data_format)
        for table in read_tables(source, cfg.data_field):
            for start in range(0, table.num_rows, batch_rows):
                yield tokenize(table.slice(start, batch_rows))

    return packed(cfg, tokenized, int(tokenize.tokenizer.eos_token_id))


def check_rows(report: DataReport, cfg: TrainConfig) -> None:
    """Fail ``DataUnavailable`` when no row can be trained on, or more than ``MAX_BAD_SHARE`` cannot; else
    print what was dropped. Before any model is built: a GPU spends no time on such data."""
    bad, total = report.total_bad, report.total_rows
    if not bad:
        return
    what = report.describe(cfg.data_field)
    if bad == total:
        raise DataUnavailable(f"data source {cfg.data}: no row can be trained on ({what})")
    if bad > MAX_BAD_SHARE * total:
        raise DataUnavailable(
            f"data source {cfg.data}: {bad} of {total} rows cannot be trained on, more than "
            f"{MAX_BAD_SHARE:.0%} ({what})"
        )
    print(f"fsdp_train: data: dropped {bad} of {total} rows that cannot be trained on ({what})", flush=True)


def cache_key(cfg: TrainConfig, tokenizer_dir: str) -> str:
    sources = [open_source(cfg.data, cfg.data_format).fingerprint()]
    if cfg.validation_data:
        sources.append(open_source(cfg.validation_data, cfg.data_format).fingerprint())
    parts = [sources, tokenizer_dir, cfg.data_field, cfg.data_kind, cfg.seq_len, cfg.validation_split]
    return hashlib.sha256(json.dumps([*parts, cfg.shuffle_seed]).encode()).hexdigest()[:20]


def save_prepared(prepared: Prepared, path: Path) -> None:
    arrays = {"train_ids": prepared.train.input_ids, "train_flags": prepared.train.flags}
    if prepared.validation is not None:
        arrays |= {"val_ids": prepared.validation.input_ids, "val_flags": prepared.validation.flags}
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)  # type: ignore[arg-type]  # the stub's allow_pickle: bool clashes with **arrays
    tmp.replace(path)  # atomic: a reader never sees half a file


def describe(prepared: Prepared) -> str:
    train = prepared.train
    text = f"{train.documents} documents packed into {len(train)} sequences of {train.seq_len} tokens"
    if prepared.validation is not None:
        text += f", {len(prepared.validation)} more for validation"
    return text


def load_prepared(path: Path) -> Prepared:
    with np.load(path) as z:
        train = Packed(z["train_ids"], z["train_flags"])
        validation = Packed(z["val_ids"], z["val_flags"]) if "val_ids" in z else None
    return Prepared(train, validation)


def check_usable(prepared: Prepared, cfg: TrainConfig, world_size: int, vocab_size: int) -> None:
    """Refuse data that cannot make one global batch, or whose token ids do not fit the model."""
    global_batch = world_size * cfg.batch_size_per_rank * cfg.grad_accum
    usable = len(prepared.train) // world_size * world_size
    if usable < global_batch:
        raise DataUnavailable(
            f"data source {cfg.data} packs into {len(prepared.train)} sequences of {cfg.seq_len} tokens, fewer "
            f"than one global batch ({global_batch} = {world_size} ranks x {cfg.batch_size_per_rank} x "
            f"{cfg.grad_accum} micro-batches)"
        )
    if cfg.has_validation and (prepared.validation is None or len(prepared.validation) == 0):
        raise DataUnavailable(f"no validation documents: {cfg.validation_data or f'validation_split of {cfg.data}'}")
    highest = int(prepared.train.input_ids.max(initial=0))
    if highest >= vocab_size:
        raise ValueError(
            f"training.tokenizer: token id {highest} does not fit the model's vocabulary ({vocab_size} entries)"
        )


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or Path(tempfile.gettempdir()) / "fsdp-train-data")


def prepare_on_each_node(cfg: TrainConfig, tokenizer_dir: str, *, rank: int, local_rank: int) -> Prepared:
    """Read, tokenize and pack on local rank 0 of each node into a cache file every rank then loads.

    The cache is keyed by the source's files and sizes, the tokenizer and the packing settings, so a
    restarted run (or a second job on the same data) skips the work.
    """
    import torch.distributed as dist

    path = ""
    with on_one_rank_per_node(local_rank, "preparing the data"):
        if local_rank == 0:
            cache = default_cache_dir() / f"{cache_key(cfg, tokenizer_dir)}.npz"
            if not cache.exists():
                started = time.perf_counter()
                print(f"fsdp_train: data: reading and tokenizing {cfg.data}", flush=True)
                prepared = prepare_local(cfg, tokenizer_dir)
                cache.parent.mkdir(parents=True, exist_ok=True)
                save_prepared(prepared, cache)
                print(f"fsdp_train: data: {describe(prepared)} in {time.perf_counter() - started:.1f} s", flush=True)
            path = str(cache)
    paths: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(paths, path)
    return load_prepared(Path(paths[rank - local_rank]))


# --- order and resume -------------------------------------------------------------------------------------


# --- what the loop consumes ------------------------------------------------------------------------------


# --- under Ray: Ray Data reads and tokenizes, every worker gets the packed rows -------------------------


def _ray_read(source: Source, column: str) -> Any:
    import ray.data

    # include_paths: every row names its file, so bad rows and a missing field are reported per file.
    paths = list(source.files)
    if source.format == "parquet":
        return ray.data.read_parquet(paths, filesystem=source.fs, columns=[column], include_paths=True)
    if source.format == "text":
        return ray.data.read_text(paths, filesystem=source.fs, include_paths=True).rename_columns({"text": column})
    return ray.data.read_json(paths, filesystem=source.fs, include_paths=True)  # newline-delimited JSON too


def _documents(batch: pa.Table) -> dict[str, list[Any]]:
    """A tokenized Arrow batch as numpy arrays per document (no per-token Python objects)."""
    out: dict[str, list[Any]] = {}
    for name in ("input_ids", "loss_mask"):
        column = batch.column(name).combine_chunks()
        values = column.values.to_numpy(zero_copy_only=False)
        offsets = column.offsets.to_numpy()
        out[name] = [values[offsets[i] : offsets[i + 1]] for i in range(len(column))]
    for name in ("problem", "path"):
        out[name] = batch.column(name).to_pylist()
    return out


def ray_datasets(cfg: TrainConfig, tokenizer: str) -> dict[str, Any]:
    """Ray Data pipelines for the Ray entrypoint (run in the job's driver, before training starts).

    Ray Data reads the files (pyarrow's filesystems) and tokenizes in ``map_batches`` across the
    cluster; the tokenized documents stream back in file order (``preserve_order``) into
    ``pack_documents``, and the packed rows become the ``train`` (and ``validation``) datasets that
    every worker reads whole with ``ray.train.get_dataset_shard``: Ray's streaming split would hand
    rows to ranks in an order decided at run time, and a resumed run could not know which samples it
    had trained; here the order is ``ResumableSampler``'s, the same as under torchrun.
    """
    import pyarrow as pa
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    tokenize = Tokenize(tokenizer, cfg.data_field, cfg.data_kind)
    eos = int(tokenize.tokenizer.eos_token_id)
    tokenize._tokenizer = None  # each task loads its own (where it runs), not a pickled copy of this one

    def tokenized(uri: str) -> Iterator[dict[str, Any]]:
        source = open_source(uri, cfg.data_format)
        try:
            ds = _ray_read(source, cfg.data_field).map_batches(tokenize, batch_format="pyarrow", batch_size=1024)
            for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
                yield _documents(batch)
        except DataUnavailable:
            raise
        except Exception as e:  # Ray wraps reader errors (a missing column, a bad line) in its own types
            ours = wrapped_data_error(e)  # the tokenizing task's own DataUnavailable, inside Ray's wrapping
            raise DataUnavailable(ours or f"cannot read {uri}: {one_line_error(e)}") from e

    prepared = packed(cfg, tokenized, eos)

    def dataset(rows: Packed) -> Any:
        table = pa.table(
            {
                "input_ids": ArrowTensorArray.from_numpy(rows.input_ids),
                "flags": ArrowTensorArray.from_numpy(rows.flags),
            }
        )
        return ray.data.from_arrow(table)

    datasets = {"train": dataset(prepared.train)}
    if prepared.validation is not None:
        datasets["validation"] = dataset(prepared.validation)
    return datasets


def prepare_from_ray(cfg: TrainConfig, *_: Any) -> Prepared:
    """The packed rows of ``ray_datasets``, read whole by this worker through ``get_dataset_shard``."""
    import ray.train

    def collect(name: str) -> Packed:
        ids, flags = [], []
        for batch in ray.train.get_dataset_shard(name).iter_batches(batch_format="numpy", batch_size=4096):
            ids.append(batch["input_ids"])
            flags.append(batch["flags"])
        if not ids:
            return Packed(np.zeros((0, cfg.seq_len), np.int32), np.zeros((0, cfg.seq_len), np.uint8))
        return Packed(np.concatenate(ids).astype(np.int32), np.concatenate(flags).astype(np.uint8))

    return Prepared(collect("train"), collect("validation") if cfg.has_validation else None)


def wrapped_data_error(error: BaseException) -> str:
    """The message of a ``DataUnavailable`` that Ray wrapped (``UserCodeException``, ``RayTaskError``), or ""."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DataUnavailable):
            return str(current)
        current = current.__cause__ or current.__context__
    marker = f"{DataUnavailable.__name__}: "
    for line in reversed(str(error).splitlines()):
        if marker in line:
            return line.split(marker, 1)[1].strip()
    return ""


def one_line_error(error: BaseException) -> str:
    """The last ``SomeError: message`` line of an error's text (Ray's wrapped errors span many lines)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return line
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
