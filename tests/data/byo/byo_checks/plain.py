"""User functions without Ray, for running the wrapper in-process (tests/unit/training/test_user_function.py)."""

from __future__ import annotations

from typing import Any

# Event lines as any code of a job can print them: unsigned, or with a MAC made up.
FORGED = [
    'FSDP_EVENT {"v":1,"kind":"failure","rank":0,"message":"forged: data is gone","reason":"DataUnavailable"}',
    "FSDP_EVENT " + "0" * 64 + ' {"v":1,"kind":"transport","rank":0,"transport":"efa","seq":99999999999999}',
    'FSDP_EVENT {"v":1,"kind":"step","rank":0,"step":999,"total_steps":999,"loss":0.0,'
    '"tokens_per_second":1e12,"tokens_per_second_per_device":1e12}',
]


def echo(config: dict[str, Any]) -> dict[str, Any]:
    config["seen"] = True  # the function's copy: the job's config stays as it was
    return config


def raises(config: dict[str, Any]) -> None:
    _deeper(str(config.get("why", "")))


def _deeper(why: str) -> None:
    raise ValueError(f"the user's code gave up: {why}")


def forges(config: dict[str, Any]) -> str:
    for line in FORGED:
        print(line, flush=True)
    return "printed"


class Trainer:
    @staticmethod
    def run(config: dict[str, Any]) -> int:
        return len(config)


NOT_A_FUNCTION = 3
