"""Library start-up chatter kept off the terminal of the local commands (make-model, data check).

torchao logs a warning for each optional compiled kernel it cannot load (CUDA builds on a CPU machine),
and torch's pytree a deprecation warning for each Enum torchao registers: neither says anything about the
user's model or data. Both are Python loggers; torch's logging set-up (at `import torch`) would reset a
level set before it, so torch is imported first. Real errors (ERROR and above) still show.
"""

from __future__ import annotations

import logging

CHATTY_LOGGERS = ("torchao", "torch.utils._pytree")


def quiet_library_warnings() -> None:
    try:
        import torch  # noqa: F401 - its logging set-up first, then the levels below hold
    except ImportError:
        return
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:  # transformers' "Writing model shards" bar: the command prints what it wrote when it is done
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    except ImportError:
        pass
