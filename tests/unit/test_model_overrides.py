"""The table of what `spec.model.overrides` may set (fsdp_operator.api.model_configs), held to transformers itself.

The operator never imports transformers; this test does, so the table cannot drift from the config
classes of the pinned version: every scalar `__init__` parameter of each family's config class is in
the table (in the same type) or left out with a reason, and nothing else is in the table.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import pytest
from fsdp_operator.api import model_configs
from fsdp_operator.api.spec import SpecError, parse_job

transformers = pytest.importorskip("transformers")

SCALARS = {int: "int", float: "float", bool: "bool", str: "str"}


def _scalar_type(annotation: Any) -> str | None:
    """The table's type for an annotation: its one scalar (a float that also takes int is a float)."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    found = {SCALARS[a] for a in (args or (annotation,)) if a in SCALARS}
    if found == {"int", "float"}:
        return "float"
    return found.pop() if len(found) == 1 else None


def _own_parameters(config_class: type) -> dict[str, Any]:
    """The `__init__` parameters of a config class beyond those every PreTrainedConfig has."""
    base = set(inspect.signature(transformers.PreTrainedConfig.__init__).parameters)
    parameters = inspect.signature(config_class.__init__).parameters
    return {
        name: p.annotation
        for name, p in parameters.items()
        if name not in base and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }


@pytest.mark.parametrize("family", sorted(model_configs.FAMILIES))
def test_the_table_is_the_config_class(family: str) -> None:
    config_class = getattr(transformers, model_configs.CONFIG_CLASSES[family])
    assert config_class.model_type == family
    own = _own_parameters(config_class)
    table = model_configs.FAMILIES[family]
    assert set(table) | set(model_configs.LEFT_OUT) >= set(own), "new config fields: add them or leave them out"
    assert set(table) <= set(own), f"not fields of {config_class.__name__}: {set(table) - set(own)}"
    for name, declared in table.items():
        assert _scalar_type(own[name]) == declared.type, (name, own[name])


def test_the_left_out_fields_are_fields() -> None:
    everywhere = set().union(
        *(_own_parameters(getattr(transformers, c)) for c in model_configs.CONFIG_CLASSES.values())
    )
    assert set(model_configs.LEFT_OUT) <= everywhere


def test_the_activations_are_transformers_activations() -> None:
    from transformers.activations import ACT2FN

    assert set(model_configs.ACTIVATIONS) <= set(ACT2FN)


def test_the_loader_options_are_not_config_fields() -> None:
    """Loader options and attributes that reached AutoConfig.from_pretrained: none is a field, so none passes."""
    for family in model_configs.FAMILIES:
        own = _own_parameters(getattr(transformers, model_configs.CONFIG_CLASSES[family]))
        for key in ("trust_remote_code", "token", "return_unused_kwargs", "revision", "__class__"):
            assert key not in own and key not in model_configs.FAMILIES[family]


def _job(overrides: dict[str, Any]) -> Any:
    return parse_job(
        {
            "apiVersion": "fsdp.dev/v1alpha1",
            "kind": "FSDPTrainingJob",
            "metadata": {"name": "j"},
            "spec": {"model": {"name": "Qwen/Qwen2.5-1.5B", "init": "random", "overrides": overrides}},
        }
    )


def test_accepted_overrides_build_the_config() -> None:
    """What the operator accepts, Qwen2Config takes: every field, at its smallest allowed value."""
    smallest: dict[str, Any] = {}
    for name, declared in model_configs.FAMILIES["qwen2"].items():
        smallest[name] = {
            "int": int(declared.minimum or 0),
            "float": (declared.minimum or 0.0) + (1e-6 if declared.exclusive_minimum else 0.0),
            "bool": True,
            "str": declared.choices[0] if declared.choices else "x",
        }[declared.type]
    smallest["hidden_size"] = 2  # one head of 2: the smallest head rotary embeddings can rotate (an even size)
    job = _job(smallest)
    config = transformers.Qwen2Config(**job.spec.model.overrides)
    for name, value in smallest.items():
        assert getattr(config, name) == pytest.approx(value), name


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"trust_remote_code": 1}, "spec.model.overrides.trust_remote_code: not a config field of Qwen2Config"),
        ({"token": "hf_s3cr3t"}, "spec.model.overrides.token: not a config field of Qwen2Config"),
        ({"return_unused_kwargs": 1}, "spec.model.overrides.return_unused_kwargs: not a config field"),
        ({"__class__": "x"}, "spec.model.overrides.__class__: not a config field"),
        ({"num_hidden_layers": "2"}, "spec.model.overrides.num_hidden_layers: expected integer, got string '2'"),
        ({"vocab_size": -5}, "spec.model.overrides.vocab_size: must be at least 1, got -5"),
    ],
)
def test_the_reported_overrides_are_refused_with_the_field_path(overrides: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError) as refused:
        _job(overrides)
    assert str(refused.value).splitlines()[-1].strip().startswith(problem) or problem in str(refused.value)
    assert "s3cr3t" not in str(refused.value)


def test_the_crd_types_the_overrides_too() -> None:
    """The API server (the emulated one applies the CRD's schema and prunes as a real one) refuses a wrong type
    or an impossible value before the operator sees it, and drops what is not a config field of any family."""
    from fsdp_operator.api import generate
    from fsdp_operator.local.server import validation

    crd = generate.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def stored(overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
        obj = {"spec": {"model": {"overrides": overrides}}}
        pruned, unknown = validation.prune(obj, crd)
        return pruned["spec"]["model"]["overrides"], unknown, validation.validate(pruned, crd)

    assert stored({"num_hidden_layers": 2, "rms_norm_eps": 1e-6, "tie_word_embeddings": False})[1:] == ([], [])
    assert stored({"num_hidden_layers": "2"})[2]
    assert stored({"vocab_size": -5})[2]
    assert stored({"hidden_act": "evil"})[2]
    kept, unknown, errors = stored({"trust_remote_code": 1, "hidden_size": 64})
    assert kept == {"hidden_size": 64} and unknown == ["spec.model.overrides.trust_remote_code"] and not errors
