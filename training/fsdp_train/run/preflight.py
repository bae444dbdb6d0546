"""Preflight: what a job needs from outside, checked in seconds before anything slow, each problem naming its field.

The code directory of a user function (and its package in it), a local data source, the model's config and
the tokenizer (a local directory, or a hub id: in this node's Hugging Face cache, else asked of the hub once,
briefly). `fsdpctl run-local` runs every check before it starts a cluster; in a cluster the Ray driver checks
the data source before it fetches the tokenizer, and each rank checks the code or the model before its first
collective. A hub that cannot be reached is said as such, a model the hub does not have as not found.

No torch import here (run-local calls it in the operator's own process); `fsdp_train.models.model` is imported only
when the model's name may be one it builds without downloading.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsdp_train.contract.config import RANDOM_DATA, TrainConfig

MODEL_FIELD, TOKENIZER_FIELD, DATA_FIELD, VALIDATION_FIELD = (
    "spec.model.name",
    "spec.data.tokenizer",
    "spec.data.source",
    "spec.data.validationSource",
)
CODE_FIELD, CALLABLE_FIELD = "spec.trainFunction.code", "spec.trainFunction.callable"
HUB_TIMEOUT_SECONDS = 10.0
"""How long one question to the hub may take (a model's metadata: a few hundred bytes)."""
REMOTE = ("s3://", "gs://", "hf://")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class PreflightFailed(RuntimeError):
    """What a job needs is not there; the message names every field (``; ``-separated)."""

    reason = "PreflightFailed"

    def __init__(self, problems: list[str], *, reason: str = "PreflightFailed") -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
        self.reason = reason


def _local(location: str) -> str | None:
    """The local path of `location`, or None for a remote location or a hub id."""
    if location.startswith("file://"):
        return location.removeprefix("file://")
    if location.startswith(("/", ".")):
        return location
    return None


def hub_problem(repo: str, wanted: str, timeout: float = HUB_TIMEOUT_SECONDS) -> str:
    """Why hub id `repo` cannot give this node `wanted` (a file name), or '' when it can (cached, or on the hub)."""
    try:
        from huggingface_hub import HfApi, try_to_load_from_cache
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError:  # pragma: no cover - installed with transformers
        return ""
    try:
        cached = try_to_load_from_cache(repo, wanted)
    except Exception:  # an id the cache cannot even name (the spec's grammar admits more than the hub's)
        cached = None
    if isinstance(cached, str):
        return ""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return f"{repo} is not in this node's Hugging Face cache, and HF_HUB_OFFLINE is set"
    try:
        HfApi().model_info(repo, timeout=timeout)
    except GatedRepoError:
        return f"{repo} is gated on the hub: set HF_TOKEN (spec.env) to a token that was granted access"
    except RepositoryNotFoundError:
        return f"{repo} not found on the Hugging Face hub (nor in this node's cache); check the name"
    except Exception as e:  # httpx / OSError / timeouts: nothing answered
        detail = " ".join(str(e).split())[:160] or type(e).__name__
        return f"{repo}: hub unreachable from this node ({type(e).__name__}: {detail}) and not in its cache"
    return ""


def _builds_without_download(cfg: TrainConfig) -> bool:
    if cfg.model_init != "random":
        return False
    from fsdp_train.contract.known_models import KNOWN_CONFIGS

    return cfg.model in KNOWN_CONFIGS


def model_problems(cfg: TrainConfig, *, hub: Callable[[str, str], str] = hub_problem) -> list[str]:
    """The model's config (and, for init pretrained, its directory) reachable."""
    if _builds_without_download(cfg) or cfg.model.startswith(REMOTE):
        return []
    path = _local(cfg.model)
    if path is None:
        problem = hub(cfg.model, "config.json")
        return [f"{MODEL_FIELD}: {problem}"] if problem else []
    if not Path(path).is_dir():
        return [f"{MODEL_FIELD}: {cfg.model} not found (no such directory on this node)"]
    if not (Path(path) / "config.json").is_file():
        return [f"{MODEL_FIELD}: {cfg.model} holds no config.json (a save_pretrained directory has one)"]
    return []


def tokenizer_problems(cfg: TrainConfig, *, hub: Callable[[str, str], str] = hub_problem) -> list[str]:
    """The tokenizer of a data job (data.tokenizer, else the model's own) reachable."""
    if cfg.data == RANDOM_DATA:
        return []
    location = cfg.tokenizer or cfg.model
    field = TOKENIZER_FIELD if cfg.tokenizer else f"{MODEL_FIELD} (the tokenizer: spec.data.tokenizer is empty)"
    if location.startswith(REMOTE):
        return []
    path = _local(location)
    if path is None:
        problem = hub(location, "tokenizer_config.json")
        return [f"{field}: {problem}"] if problem else []
    if not Path(path).is_dir():
        return [f"{field}: {location} not found (no such directory on this node)"]
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        return [f"{field}: {location} holds no tokenizer ({', '.join(TOKENIZER_FILES)})"]
    return []


def data_problems(cfg: TrainConfig) -> list[str]:
    """A local data source (and validation source) exists; remote ones are listed by the data pipeline itself."""
    problems = []
    for field, location in ((DATA_FIELD, cfg.data), (VALIDATION_FIELD, cfg.validation_data)):
        if not location or location == RANDOM_DATA:
            continue
        path = _local(location)
        if path is not None and not Path(path).exists():
            problems.append(f"{field}: {location} not found (no such file or directory on this node)")
    return problems


def function_problems(callable_: str, code: str) -> list[str]:
    """A user function's code directory exists and its top-level package can be found (nothing is imported)."""
    if code.startswith(("s3://", "gs://")):
        return []  # Ray's runtime environment fetches it; its own error names the URI
    package = callable_.partition(":")[0].split(".")[0]
    if code:
        if not Path(code).is_dir():
            return [f"{CODE_FIELD}: {code} not found (no such directory on this node)"]
        found = (Path(code) / package).is_dir() or (Path(code) / f"{package}.py").is_file()
        return [] if found else [f"{CALLABLE_FIELD}: no package or module {package!r} in {code} ({CODE_FIELD})"]
    if _find(package) is None:
        return [
            f"{CALLABLE_FIELD}: no module {package!r} is installed here, and {CODE_FIELD} is empty "
            "(set it to the directory that holds the package)"
        ]
    return []


def _find(package: str) -> Any:
    try:
        return importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None


def job_problems(
    cfg: TrainConfig, function: tuple[str, str] | None = None, *, hub: Callable[[str, str], str] = hub_problem
) -> list[str]:
    """Every check at once (run-local, before a cluster starts): data first, then tokenizer, model, code."""
    if function is not None:
        return function_problems(*function)
    answers: dict[tuple[str, str], str] = {}

    def asked_once(repo: str, wanted: str) -> str:
        if (repo, "") not in answers:  # one question per repository: the hub's answer holds for all its files
            answers[(repo, "")] = hub(repo, wanted)
        return answers[(repo, "")]

    model = model_problems(cfg, hub=asked_once)
    tokenizer = tokenizer_problems(cfg, hub=asked_once)
    path = _local(cfg.model)
    if not cfg.tokenizer and model and (path is None or not Path(path).is_dir()):
        tokenizer = []  # the model's own tokenizer, where the model is not: said once, under spec.model.name
    return [*data_problems(cfg), *tokenizer, *model]


def check(problems: list[str], *, reason: str = "PreflightFailed") -> None:
    """Raise :class:`PreflightFailed` when there are problems."""
    if problems:
        raise PreflightFailed(problems, reason=reason)


def check_rank(cfg: TrainConfig) -> None:
    """A rank of the bundled function, before its first collective: the data source, then the model."""
    check(data_problems(cfg), reason=DATA_UNAVAILABLE)
    check(model_problems(cfg))


DATA_UNAVAILABLE = "DataUnavailable"
"""The operator's reason for a data source that cannot be read: not retried (another attempt reads the same)."""
