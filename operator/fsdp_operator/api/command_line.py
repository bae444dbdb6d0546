"""What Linux lets a process start with: the training config as one argument of Ray's entrypoint, beside the job's own
environment (checked by spec.parse_job for every accepted job)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from fsdp_operator.api.fields import Problems

# Linux refuses to start a process when one of its arguments or environment strings is longer than
# MAX_ARG_STRLEN (32 pages: 131072 bytes, the closing NUL included; execve(2), "Limits on size of arguments and
# environment"), and when all of them together pass a quarter of the stack limit (2 MiB with the usual 8 MiB).
# Ray runs the entrypoint as `/bin/sh -c ENTRYPOINT`: the training config travels in that one argument
# (render.submission), the runtime environment's variables in the environment.
MAX_ARG_STRLEN = 131072
ENTRYPOINT_OVERHEAD = 8192
"""What the entrypoint holds besides the training config (the command, Ray Train's scaling, the job name and
checkpoint storage, each shell-quoted): room kept for it below MAX_ARG_STRLEN."""
ENVIRONMENT_BUDGET = 1024 * 1024
"""The part of execve's 2 MiB the job's own variables and entrypoint may take (Ray, the image and Kubernetes
set variables of their own)."""


def command_line_bytes(value: Any) -> int:
    """Bytes `value` takes as JSON in the entrypoint, shell-quoted as render.submission quotes it."""
    return len(shlex.quote(json.dumps(value, separators=(",", ":"), sort_keys=True)).encode())


def check(
    config: dict[str, Any], env_vars: Mapping[str, str], spec_path: Callable[[str], str], problems: Problems
) -> None:
    """The training config `config` (TrainConfig.to_dict) fits one argument, and beside `env_vars` the budget;
    `spec_path(name)` is the spec field a TrainConfig field comes from."""
    size = command_line_bytes(config)
    limit = MAX_ARG_STRLEN - 1 - ENTRYPOINT_OVERHEAD
    if size > limit:
        largest = max(config, key=lambda name: command_line_bytes(config[name]))
        problems.append(
            f"{spec_path(largest)}: the training config would be a {size}-byte command-line "
            f"argument, and Linux starts no process with one over {MAX_ARG_STRLEN} bytes (the entrypoint keeps "
            f"{limit} for it); this field takes {command_line_bytes(config[largest])}: shorten it"
        )
        return
    environment = sum(len(f"{name}={value}".encode()) + 1 for name, value in env_vars.items())
    if environment + size > ENVIRONMENT_BUDGET:
        problems.append(
            f"spec.runtimeEnv.envVars: {environment} bytes of environment next to a {size}-byte training config; "
            f"the job's own may take {ENVIRONMENT_BUDGET} bytes of the 2 MiB Linux allows a process for both"
        )
