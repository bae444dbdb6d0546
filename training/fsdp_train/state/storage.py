"""Where files are read from (local, s3://, hf://), model sources fetched to the node, and the one-rank-per-node
guard; below data and weights. No torch import at module level (`fsdpctl data check` reads data through it)."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow.fs as pafs


class DataUnavailable(RuntimeError):
    """The data source cannot be read, holds no documents, or too few for one global batch."""

    reason = "DataUnavailable"


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem for a location, and the path inside it.

    ``s3://`` honours ``AWS_ENDPOINT_URL`` (S3-compatible stores, moto in tests); ``hf://datasets/``
    goes through huggingface_hub's fsspec filesystem; anything else is a local (or mounted) path.
    """
    import pyarrow.fs as pafs

    if uri.startswith("hf://"):
        from huggingface_hub import HfFileSystem

        return pafs.PyFileSystem(pafs.FSSpecHandler(HfFileSystem())), uri.removeprefix("hf://")
    if uri.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        fs = pafs.S3FileSystem(endpoint_override=endpoint, region=region) if endpoint else pafs.S3FileSystem()
        return fs, uri.removeprefix("s3://")
    if uri.startswith("file://"):
        return pafs.LocalFileSystem(), uri.removeprefix("file://")
    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)  # type: ignore[no-any-return]
    return pafs.LocalFileSystem(), uri


@contextlib.contextmanager
def on_one_rank_per_node(local_rank: int, what: str) -> Iterator[None]:
    """Run the body (which acts on local rank 0 only), then let every rank learn whether it failed.

    Every rank reaches the exchange, so no rank waits forever for a failed one; the failed rank re-raises
    its own error and the others raise one that names it.
    """
    import torch.distributed as dist

    error: BaseException | None = None
    try:
        yield
    except Exception as e:
        error = e
    texts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(texts, f"{type(error).__name__}: {error}" if error else "")
    if error is not None:
        raise error
    failed = next((t for t in texts if t), "")
    if failed.startswith(f"{DataUnavailable.__name__}: "):
        raise DataUnavailable(failed.split(": ", 1)[1])
    if failed:
        raise RuntimeError(f"{what} failed on another rank: {failed}")


MODEL_CACHE_ENV = "FSDP_TRAIN_MODEL_CACHE"
HF_FILE_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
TOKENIZER_FILE_PATTERNS = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja"]


def is_remote(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def cache_root() -> Path:
    return Path(os.environ.get(MODEL_CACHE_ENV) or Path(tempfile.gettempdir()) / "fsdp-train-models")


def fetch(location: str, *, patterns: list[str] | None = None) -> str:
    """A local directory holding ``location``: itself when local, else a node-local copy.

    ``s3://`` (and other pyarrow URIs) are copied with pyarrow's filesystems; a Hugging Face id goes
    through ``huggingface_hub.snapshot_download`` (the hub's own cache and resumable downloads).
    Call it on one process per node, then make the others wait (``fetch_on_each_node``).
    """
    if location.startswith("file://"):
        location = location.removeprefix("file://")
    if not is_remote(location):
        if Path(location).is_dir() or location.startswith(("/", ".")):
            return location
        from huggingface_hub import snapshot_download

        return str(snapshot_download(location, allow_patterns=patterns or HF_FILE_PATTERNS))
    import pyarrow.fs as pafs

    wanted = patterns or HF_FILE_PATTERNS
    target = cache_root() / hashlib.sha256(json.dumps([location, wanted]).encode()).hexdigest()[:16]
    done = target / ".complete"
    if done.exists():
        return str(target)
    fs, path = filesystem(location)
    root = path.rstrip("/")
    files = [
        info.path
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=False))
        if info.is_file and any(fnmatch.fnmatch(info.base_name, pattern) for pattern in wanted)
    ]
    if not files:
        raise FileNotFoundError(f"{location} holds no Hugging Face model files ({', '.join(wanted)})")
    cache_root().mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="fetch-", dir=cache_root()))
    local = pafs.LocalFileSystem()
    for file in files:
        pafs.copy_files(
            file, str(staging / file.rsplit("/", 1)[-1]), source_filesystem=fs, destination_filesystem=local
        )
    (staging / ".complete").touch()
    try:
        staging.rename(target)
    except OSError:  # another process on this node fetched it first: keep theirs
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def fetch_on_each_node(location: str, *, local_rank: int, patterns: list[str] | None = None) -> str:
    """``fetch`` on local rank 0 of every node while the other ranks wait; every rank gets the path."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return fetch(location, patterns=patterns)
    path = ""
    with on_one_rank_per_node(local_rank, f"fetching {location}"):
        if local_rank == 0:
            path = fetch(location, patterns=patterns)
    if local_rank != 0:
        path = fetch(location, patterns=patterns)  # now a cache hit (or a local path)
    return path
