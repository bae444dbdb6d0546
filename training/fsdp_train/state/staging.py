"""Host buffers for asynchronous checkpoints: pinned once per run and reused by every save (``HostStager``)."""

from __future__ import annotations

import math
from concurrent.futures import Future
from typing import Any

from torch import nn
from torch.optim import Optimizer


class HostArena:
    """One host allocation (pinned on CUDA) that the stager's buffers are carved from.

    Pinning is what costs (19 GB took 11-17 s on an H200, and the step that ran beside it waited that long), and
    the optimizer's moments, two thirds of the state, exist only after the first step. Their size is known
    before it (AdamW keeps two moments shaped like each parameter), so one block is pinned in the background
    from the start, while the first step compiles, and the buffers are carved from it after the first step.
    Written here because torch has no arena for host tensors: its caching host allocator pins per tensor.
    """

    ALIGN = 64

    @classmethod
    def aligned(cls, nbytes: int) -> int:
        """`nbytes` rounded up to the block's alignment."""
        return -(-nbytes // cls.ALIGN) * cls.ALIGN

    def __init__(self, nbytes: int, pin: bool) -> None:
        import torch

        self._block = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin and nbytes > 0)
        self._used = 0

    def take(self, shape: Any, dtype: Any) -> Any:
        """A tensor of ``shape`` and ``dtype`` from the block, or None once the block is too small."""
        nbytes = math.prod(shape) * dtype.itemsize
        start = self.aligned(self._used)
        if nbytes == 0 or start + nbytes > self._block.numel():
            return None
        self._used = start + nbytes
        return self._block[start : start + nbytes].view(dtype).view(shape)


def state_bytes(model: nn.Module, optimizer: Optimizer) -> int:
    """The host bytes a checkpoint of this rank's shards takes: its parameters, and AdamW's two moments of each
    (other optimizers: the parameters only; their state is buffered tensor by tensor after the first step)."""
    import torch

    moments = 2 if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) else 0
    total = 0
    for parameter in model.parameters():
        local = getattr(parameter, "_local_tensor", parameter)
        total += HostArena.aligned(local.numel() * local.element_size()) * (1 + moments) + HostArena.ALIGN  # + step
    return total


def host_buffers(state: Any, pin: bool, arena: HostArena | None = None) -> Any:
    """Empty host tensors shaped like ``state``'s tensors (pinned when ``pin``), in the same structure, carved
    from ``arena`` while it has room.

    Not torch's ``_create_cpu_state_dict``: for a DTensor it first copies the whole tensor to host memory
    (``DTensor.to("cpu")``), from whatever thread calls it and on that thread's stream, where only the
    allocation is wanted here. A DTensor's buffer keeps its spec (mesh, placements, global shape).
    """
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(state, DTensor):
        make: Any = DTensor  # its constructor is untyped
        return make(host_buffers(state._local_tensor, pin, arena), state._spec, requires_grad=False)
    if isinstance(state, torch.Tensor):
        carved = arena.take(state.shape, state.dtype) if arena is not None else None
        if carved is not None:
            return carved
        return torch.empty(state.shape, dtype=state.dtype, pin_memory=pin and state.numel() > 0)
    if isinstance(state, dict):
        return {key: host_buffers(value, pin, arena) for key, value in state.items()}
    if isinstance(state, list | tuple):
        values = [host_buffers(value, pin, arena) for value in state]
        return tuple(values) if isinstance(state, tuple) else values
    return state  # a number, a string, None: copied from the state at each save, not buffered


class HostStager:
    """DCP's ``AsyncStager``: the state copied into host buffers that live as long as the run.

    Written here because torch's ``DefaultStager`` cannot be reused across saves in torch 2.11 (its second
    ``stage`` failed inside it on an H200), and a stager per save pins its host memory anew each time: 6.5-8.8 s
    for 19 GB, which the step after the save waited for. The buffers (pinned on CUDA, ``host_buffers``) are made
    once, by ``prepare`` in a background thread, from the block ``reserve`` began pinning before the first step
    (``HostArena``), and every save copies into them with ``_copy_state_dict`` on a side stream; the future it
    returns is done once the copy is.
    """

    _synchronize_after_execute = False

    def __init__(self) -> None:
        import torch

        cuda: Any = torch.cuda  # Stream and Event are untyped
        self._cuda = cuda.is_available()
        self._stream: Any = cuda.Stream() if self._cuda else None
        self._buffers: Future[dict[str, Any]] | None = None
        self._arena: Future[HostArena] | None = None
        self._executor: Any = None

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False  # the optimizer's pre-hook waits for the copy instead (DirectoryCheckpoints._wait_staged)

    def _pool(self) -> Any:
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsdp-ckpt-stage")
        return self._executor

    @property
    def prepared(self) -> bool:
        return self._buffers is not None

    def reserve(self, nbytes: int) -> None:
        """Begin allocating (and pinning) ``nbytes`` of host memory in the background, for ``prepare`` to carve."""
        if self._arena is None:
            self._arena = self._pool().submit(HostArena, nbytes, self._cuda)

    def prepare(self, state_dict: dict[str, Any]) -> None:
        """Make the host buffers for ``state_dict``'s shapes in the background, once (after ``reserve``'s block)."""
        if self._buffers is None:
            arena = self._arena
            self._arena = None  # carved once: buffers made anew (a changed layout) are allocated one by one

            def make() -> dict[str, Any]:
                buffers: dict[str, Any] = host_buffers(state_dict, self._cuda, arena.result() if arena else None)
                return buffers

            self._buffers = self._pool().submit(make)

    def stage(self, state_dict: dict[str, Any], retried: bool = False) -> Future[dict[str, Any]]:
        import torch
        from torch.distributed._state_dict_utils import CompanionMismatch, _copy_state_dict

        self.prepare(state_dict)
        assert self._buffers is not None
        buffers = self._buffers.result()
        try:
            if self._stream is None:
                staged = _copy_state_dict(state_dict, buffers, type_check=False)
                done: Future[dict[str, Any]] = Future()
                done.set_result(staged)
                return done
            # The copies run on a side stream, after what the training stream has queued (the step's update).
            self._stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self._stream):
                staged = _copy_state_dict(state_dict, buffers, non_blocking=True, type_check=False)
                cuda: Any = torch.cuda
                copied = cuda.Event()
                copied.record(self._stream)
        except (CompanionMismatch, RuntimeError):
            # The state's layout or a shape changed since the buffers were made: make them anew, once.
            if retried:
                raise
            self._buffers = None
            return self.stage(state_dict, retried=True)

        def when_copied(source: dict[str, Any]) -> dict[str, Any]:
            # ``source`` keeps the copied tensors referenced until the copy is done: their memory is not reused first.
            copied.synchronize()
            return staged

        staging: Future[dict[str, Any]] = self._pool().submit(when_copied, state_dict)
        return staging

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._buffers = None
        self._arena = None
