"""PyTorch's collective flight recorder, read without trusting it: which collective each rank entered and finished.

With ``TORCH_FR_BUFFER_SIZE`` (formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``) above 0, each process group keeps a ring
of its last collectives (NCCL's, and gloo's in torch 2.13); ``torch._C._distributed_c10d._dump_fr_trace()`` (and
``TORCH_NCCL_DUMP_ON_TIMEOUT``'s files) write it as a pickle: ``{"version", "pg_config", "pg_status",
"entries": [{"profiling_name": "nccl:all_reduce", "collective_seq_id", "input_sizes", "state", "retired", ...}]}``.

:func:`load` reads such a pickle with an unpickler that refuses every global (only the pickle protocol's own
dicts, lists, tuples, strings, numbers, booleans and None come out): a dump file from elsewhere can hold any
pickle, and unpickling one runs whatever it names. :func:`summarize` gives each process group's last entered and
last completed collective; :func:`summary` is this rank's, one line, for its ``Stall`` event.

``python -m fsdp_train.watch.flight DUMP...`` prints the summary of each dump file.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BUFFER_ENVS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
MAX_DUMP_BYTES = 64 * 1024 * 1024
"""A dump larger than this is refused unread (a ring of 2000 entries with stacks is a few MiB)."""


class NotADump(ValueError):
    """The bytes are no flight-recorder dump this parser reads (or they hold something it refuses)."""


class _OnlyData(pickle.Unpickler):
    """Refuses every global: no class, no function, nothing but the protocol's built-in containers and scalars."""

    def find_class(self, module: str, name: str) -> Any:
        raise NotADump(f"the dump names {module}.{name}; a flight-recorder dump holds plain data only")


def load(data: bytes) -> dict[str, Any]:
    """The dump's top-level mapping. Raises :class:`NotADump` for anything else, never runs code of the dump."""
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_DUMP_BYTES:
        raise NotADump("not bytes, or larger than a flight-recorder dump is")
    try:
        value = _OnlyData(io.BytesIO(bytes(data))).load()
    except NotADump:
        raise
    except Exception as e:  # a truncated or corrupt pickle raises any of several errors
        raise NotADump(f"not a pickle this parser reads: {type(e).__name__}: {e}") from None
    if not isinstance(value, dict) or not isinstance(value.get("entries", []), list):
        raise NotADump("no mapping with an entries list at the top")
    return value


@dataclass(frozen=True, slots=True)
class Collective:
    name: str
    """``all_reduce`` (the backend's prefix, ``nccl:``, removed)."""
    seq: int
    """The process group's collective sequence number (``collective_seq_id``)."""
    sizes: str
    """The input tensors' shapes and element type (``[1000] Float``)."""
    state: str

    def text(self) -> str:
        return f"{self.name} #{self.seq}" + (f" ({self.sizes})" if self.sizes else "")


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group: str
    """The process group's name and description (``0 default_pg``)."""
    entered: Collective | None
    completed: Collective | None

    def text(self) -> str:
        entered = f"{self.entered.text()} entered" if self.entered else "nothing entered"
        completed = f"#{self.completed.seq} completed" if self.completed else "none completed"
        return f"{entered}, {completed} (group {self.group})"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else -1


def _sizes(entry: Mapping[str, Any]) -> str:
    sizes, dtypes = entry.get("input_sizes"), entry.get("input_dtypes")
    shapes = [
        "[" + ",".join(str(d) for d in s if isinstance(d, int)) + "]"
        for s in (sizes[:4] if isinstance(sizes, list) else [])
        if isinstance(s, list)
    ]
    kinds = sorted({d for d in (dtypes or []) if isinstance(d, str)})[:2] if isinstance(dtypes, list) else []
    return " ".join([",".join(shapes), *kinds]).strip()


def _collective(entry: Mapping[str, Any]) -> Collective | None:
    seq = _int(entry.get("collective_seq_id"))
    name = entry.get("profiling_name")
    if seq < 0 or not isinstance(name, str) or entry.get("is_p2p") is True:
        return None
    state = entry.get("state") if isinstance(entry.get("state"), str) else ""
    return Collective(name.rsplit(":", 1)[-1][:64], seq, _sizes(entry)[:128], str(state)[:16])


def _completed(entry: Mapping[str, Any]) -> bool:
    """Finished on this rank: NCCL marks it ``completed``; gloo's entries say ``retired`` once their work ended."""
    return entry.get("state") == "completed" or entry.get("retired") is True


def summarize(dump: Mapping[str, Any]) -> list[GroupSummary]:
    """Each process group's last entered and last completed collective (by sequence number), in group order."""
    groups: dict[str, tuple[Collective | None, Collective | None]] = {}
    for entry in dump.get("entries") or []:
        if not isinstance(entry, Mapping):
            continue
        found = _collective(entry)
        if found is None:
            continue
        pg = entry.get("process_group")
        group = " ".join(str(p)[:64] for p in pg) if isinstance(pg, list | tuple) else str(entry.get("pg_id", ""))
        entered, completed = groups.get(group, (None, None))
        if entered is None or found.seq > entered.seq:
            entered = found
        if _completed(entry) and (completed is None or found.seq > completed.seq):
            completed = found
        groups[group] = (entered, completed)
    return [GroupSummary(g, e, c) for g, (e, c) in sorted(groups.items())]


def stuck(groups: list[GroupSummary]) -> GroupSummary | None:
    """The group whose last entered collective has not completed (the one a rank waits in), else the busiest."""
    waiting = [g for g in groups if g.entered and (g.completed is None or g.completed.seq < g.entered.seq)]
    pool = waiting or groups
    return max(pool, key=lambda g: g.entered.seq if g.entered else -1, default=None)


def recording(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process's groups record (a buffer size above 0 in the environment)."""
    env = os.environ if environ is None else environ
    for name in BUFFER_ENVS:
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return True
    return False


def dump_bytes() -> bytes:
    """This process's flight recorder now (collectives, without stack traces), as torch pickles it."""
    import torch._C._distributed_c10d as c10d

    take = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)  # older: NCCL only
    if take is None:
        raise NotADump("this torch has no flight recorder")
    return bytes(take(True, False, False))


def summary() -> str:
    """This rank's flight-recorder line for a ``Stall``: the group it waits in; empty when none recorded."""
    found = stuck(summarize(load(dump_bytes())))
    return found.text() if found is not None else ""


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    status = 0
    for path in paths:
        try:
            with open(path, "rb") as f:
                groups = summarize(load(f.read(MAX_DUMP_BYTES + 1)))
        except (OSError, NotADump) as e:
            print(f"{path}: {e}")
            status = 1
            continue
        for group in groups:
            print(f"{path}: {group.text()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
