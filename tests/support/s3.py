"""A real S3 endpoint on loopback: moto's standalone server, reached like AWS through ``AWS_ENDPOINT_URL``."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class S3:
    endpoint: str
    bucket: str

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach this endpoint as it would reach AWS (boto3, pyarrow, s3fs)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip

    def upload(self, local: Path, key: str) -> str:
        """Upload a file, or every file under a directory, to ``key``; return its ``s3://`` URI."""
        client = self.client()
        if local.is_dir():
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                client.upload_file(str(path), self.bucket, f"{key}/{path.relative_to(local).as_posix()}")
        else:
            client.upload_file(str(local), self.bucket, key)
        return f"s3://{self.bucket}/{key}"

    def download(self, key: str, local: Path) -> Path:
        """Download every object under the prefix ``key`` into ``local``."""
        client = self.client()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=key.rstrip("/") + "/")
        for page in pages:
            for item in page.get("Contents", []):
                target = local / item["Key"][len(key.rstrip("/")) + 1 :]
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(self.bucket, item["Key"], str(target))
        return local

    def keys(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def copy_prefix(self, source: str, target: str) -> None:
        client = self.client()
        for key in self.keys(source.rstrip("/") + "/"):
            client.copy_object(
                Bucket=self.bucket, Key=target.rstrip("/") + key[len(source.rstrip("/")) :],
                CopySource={"Bucket": self.bucket, "Key": key},
            )  # fmt: skip


@contextlib.contextmanager
def moto_s3(bucket: str = "") -> Iterator[S3]:
    """moto's ``ThreadedMotoServer`` on 127.0.0.1 with one bucket; the environment points at it meanwhile.

    The bucket gets a name of its own unless one is given: moto keeps its state in the process, so the
    objects of an earlier server would still be there under the same bucket name.
    """
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    bucket = bucket or f"data-{uuid.uuid4().hex[:8]}"
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    s3 = S3(f"http://127.0.0.1:{port}", bucket)
    saved = {k: os.environ.get(k) for k in s3.env}
    os.environ.update(s3.env)
    try:
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()
