"""What every `fsdpctl` command shares: exit codes, and reading a manifest or a job from a file or stdin."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fsdp_operator.api import manifest_yaml
from fsdp_operator.api.spec import Job, NotAJobError, parse_job

EXIT_OK, EXIT_FINDING, EXIT_BAD_INPUT = 0, 1, 2


class InputError(Exception):
    """The input cannot be used at all (missing file, not YAML, not an FSDPTrainingJob)."""


def load_manifest(path: str) -> Any:
    """The single YAML document in `path` (`-` for stdin), read as kubectl would (see manifest_yaml)."""
    limit = manifest_yaml.MAX_REQUEST_BYTES + 1  # never read more than can be refused
    try:
        if path == "-":
            if sys.stdin is None:  # started with standard input closed (`<&-`): Python sets it to None
                raise InputError("-: standard input is closed; give a file, or pipe the manifest in")
            stdin = getattr(sys.stdin, "buffer", None)  # a text-only stdin (a test's StringIO) has no buffer
            data = stdin.read(limit) if stdin is not None else sys.stdin.read(limit).encode()
        else:
            with Path(path).open("rb") as f:
                data = f.read(limit)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from e
    except ValueError as e:  # a standard input closed inside this process: "I/O operation on closed file"
        raise InputError(f"{path}: cannot read: {e}") from e
    try:
        docs = [doc for doc in manifest_yaml.load_all(manifest_yaml.decode(data)) if doc is not None]
    except manifest_yaml.ManifestError as e:
        raise InputError(f"{path}: {e}") from e
    if len(docs) != 1:
        raise InputError(f"{path}: expected one YAML document (an FSDPTrainingJob), found {len(docs)}")
    return docs[0]


def load_job(path: str) -> Job:
    """A typed job from a file; InputError when it is not a job, SpecError when the job is invalid."""
    return load_job_from(path, load_manifest(path))


def load_job_from(path: str, manifest: Any) -> Job:
    try:
        return parse_job(manifest)
    except NotAJobError as e:
        raise InputError(f"{path}: {e}") from e
