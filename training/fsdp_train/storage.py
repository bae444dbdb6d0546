"""Where files are read from (local, s3://, hf://) and the one-rank-per-node guard; below data and weights."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
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
