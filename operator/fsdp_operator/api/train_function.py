"""spec.trainFunction: a user's Ray Train function instead of the bundled one. The declaration and its rules.

With it set, the bundled function's own fields (model, data, output, training.*) are refused when they differ
from their defaults, each named by its path: the operator would otherwise accept settings nothing reads.
What the operator still needs stays: workers, network, placement, env, runtimeEnv.pip, runPolicy, and of
training the checkpoint storage (Ray Train's storage_path) and the probe size (the check before the function).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from fsdp_operator.api import fields, formats
from fsdp_operator.api.fields import Problems, show
from fsdp_operator.api.fields import field as declare
from fsdp_operator.api.formats import Grammar

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*"
_CALLABLE = re.compile(rf"{_DOTTED}:{_DOTTED}")


def _callable(value: str) -> str | None:
    if not _CALLABLE.fullmatch(value):
        return "must be package.module:function (Python identifiers, dots between them, one colon)"
    return None


def _code(value: str) -> str | None:
    """An absolute directory on every Ray node (baked into the image, a mounted volume), or an s3:// or gs://
    URI of a .zip: Ray's runtime environment fetches remote code only as a single .zip file (Ray's docs,
    "Environment Dependencies", "Remote URIs")."""
    if not value:
        return None
    if value.startswith("/"):
        return formats.ABSOLUTE_PATH.check(value)
    if not value.startswith(("s3://", "gs://")):
        return "must be an absolute directory or an s3:// or gs:// URI of a .zip file"
    reason = formats.STORAGE_URI.check(value)
    if reason is not None:
        return reason
    if not value.endswith(".zip"):
        return "must name a .zip file: Ray's runtime environment fetches remote code only as one .zip"
    return None


CALLABLE = Grammar("Python callable", _callable, 256, rf"^{_DOTTED}:{_DOTTED}$")
CODE = Grammar("code location", _code, 1024)

MAX_CONFIG_BYTES = 32 * 1024
"""The most `config` may take as JSON: it travels in the Ray job's entrypoint, beside the training config
(command_line.ENTRYPOINT_OVERHEAD keeps room for both far below Linux's limit on one argument)."""
MAX_CONFIG_DEPTH = 32


@dataclass(frozen=True, slots=True)
class TrainFunction:
    """Your own Ray Train function instead of the bundled one, verified the same way (docs/byo-function.md)."""

    callable: str = declare(
        "The per-worker function, package.module:function; it is called with one argument, config.",
        required=True,
        grammar=CALLABLE,
    )
    code: str = declare(
        "Where the package is: an absolute directory on every Ray node (in the image, or a mounted volume), put "
        "first on the Python path; or an s3:// or gs:// URI of a .zip, which Ray's runtime environment fetches "
        "as the job's working directory. Empty: the package is installed in the image (or by runtimeEnv.pip).",
        default="",
        grammar=CODE,
    )
    config: dict[str, Any] = declare(
        "Free-form JSON passed to the function as its config dict (at most 32 KiB as JSON).",
        factory=dict,
    )

    @staticmethod
    def _rules(v: dict[str, Any], path: str, problems: Problems) -> None:
        _check_config(v["config"], f"{path}.config", problems)


def _check_config(config: dict[str, Any], path: str, problems: Problems) -> None:
    reason = _json_problem(config, path)
    if reason is not None:
        problems.append(reason)
        return
    size = len(json.dumps(config, separators=(",", ":"), sort_keys=True).encode())
    if size > MAX_CONFIG_BYTES:
        problems.append(f"{path}: {size} bytes as JSON, more than {MAX_CONFIG_BYTES}")


def _json_problem(value: Any, path: str) -> str | None:
    """Why `value` is no plain JSON a process may be handed (a YAML document may hold .nan, dates, deeper
    nesting than is sane; any string a NUL or a control character), as ``path: reason``; None when it is."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, at, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            return f"{path}: nested deeper than {MAX_CONFIG_DEPTH} levels"
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    return f"{at}: keys must be strings, got {fields.type_name(key)}"
                if (hidden := formats.hidden_character(key)) is not None:
                    return f"{at}: a key {hidden}"
                stack.append((sub, f"{at}.{fields.show_key(key)}", depth + 1))
        elif isinstance(item, list):
            stack += [(sub, f"{at}[{i}]", depth + 1) for i, sub in enumerate(item)]
        elif isinstance(item, str):
            if (hidden := formats.hidden_character(item)) is not None:
                return f"{at}: {hidden}"
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{at}: {show(item)} is not a JSON number"
        elif item is not None and not isinstance(item, bool | int | float):
            return f"{at}: a value of type {fields.type_name(item)} is not JSON"
    return None


ALLOWED_WITH_FUNCTION = ("training.checkpoint.storage", "training.probeSizeBytes")
"""Fields of the bundled function's groups the operator itself uses with any function."""
BUNDLED_GROUPS = ("model", "data", "output", "training")


def check_bundled_fields_unset(spec_values: dict[str, Any], spec_cls: type, path: str, problems: Problems) -> None:
    """With trainFunction set: every field of the bundled function's groups left at its default, each other named."""
    if spec_values.get("train_function") is None:
        return
    for d in fields.declared(spec_cls):
        if d.key in BUNDLED_GROUPS and d.nested is not None:
            defaults = fields.parse(d.nested, {}, d.key, [])
            _name_changed(d.nested, spec_values[d.name], defaults or {}, d.key, path, problems)


def bundled_fields_despite_a_malformed_function(raw_spec: dict[str, Any], spec_cls: type, problems: Problems) -> None:
    """All problems at once: a malformed trainFunction (a bad callable or code) keeps the spec's own rules from
    running, and with them the check that names the bundled function's fields it would not read. Parsed again
    with a well-formed stand-in function, the rest of the spec is checked for those; problems already said (the
    function's own, a malformed field elsewhere) are not repeated."""
    stand_in = {**raw_spec, "trainFunction": {"callable": "package.module:function"}}
    values = fields.parse(spec_cls, stand_in, "spec", [])
    if values is None:
        return  # another group is malformed too: its problem is said already
    bundled: Problems = []
    check_bundled_fields_unset(values, spec_cls, "spec", bundled)
    problems.extend(p for p in bundled if p not in problems)


def _name_changed(
    cls: type, values: dict[str, Any], defaults: dict[str, Any], at: str, path: str, problems: Problems
) -> None:
    for d in fields.declared(cls):
        sub = f"{at}.{d.key}"
        value, default = values.get(d.name), defaults.get(d.name)
        if d.nested is not None and isinstance(value, dict):
            _name_changed(d.nested, value, default if isinstance(default, dict) else {}, sub, path, problems)
        elif sub not in ALLOWED_WITH_FUNCTION and value != default:
            problems.append(
                f"{path}.{sub}: set, but spec.trainFunction runs your own function, which does not read it "
                "(remove it, or pass it in trainFunction.config)"
            )
