"""The multiprocessing context a test starts its CPU ranks with: forked from a forkserver that imported torch.

Not `spawn`: a spawned rank imports torch, the training package and its test module again, about 4 CPU-s each, and
a default run starts some fifty ranks. Not `fork`: a pytest process runs threads (kopf, asyncio, HTTP servers)
whose locks a fork would copy held. The forkserver is one small single-threaded process per pytest process; the
modules below are imported there once, and each rank is a fork of it. A rank gets its environment from the
forkserver (as it was when it started), so what a rank needs is passed as arguments, never set in os.environ.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

PRELOADED = (
    "torch",
    "torch.distributed",
    "fsdp_train.run.loop",
    "fsdp_train.state.checkpoint",
    "fsdp_train.watch.health",
    "support.cpu_ranks",
    "support.notice_ranks",
)
"""Imported once in the forkserver (a module that fails to import there is skipped by multiprocessing)."""


def rank_context() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))  # read when the forkserver starts: the first rank of a process
    return context
