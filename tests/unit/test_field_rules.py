"""The declared fields' generic rules, message by message: numbers, maps and lists at and past their bounds.

Each field is declared once (`spec.py`) and checked by `fields.py`; these cases pin the shared checks on a
field of each kind, with the messages written out.
"""

from __future__ import annotations

from typing import Any

import pytest
from fsdp_operator.api import model_configs, schema
from fsdp_operator.api.spec import SpecError, parse_job


def problems(spec: dict[str, Any]) -> list[str]:
    manifest = {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": "job"}, "spec": spec}
    try:
        parse_job(manifest)
    except SpecError as e:
        return e.problems
    return []


def lr(value: Any) -> list[str]:
    return problems({"training": {"learningRate": value}})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("fast", ["spec.training.learningRate: expected number, got string 'fast'"]),
        (True, ["spec.training.learningRate: expected number, got boolean true"]),
        (None, []),  # null: the field is unset (the API server prunes nulls), its default applies
        ([1], ["spec.training.learningRate: expected number, got array"]),
        (float("inf"), ["spec.training.learningRate: must be a finite number, got inf"]),
        (float("nan"), ["spec.training.learningRate: must be a finite number, got nan"]),
        (0, ["spec.training.learningRate: must be greater than 0, got 0"]),
        (1.5, ["spec.training.learningRate: must be at most 1, got 1.5"]),
        (2, ["spec.training.learningRate: must be at most 1, got 2"]),
        (10**400, ["spec.training.learningRate: must be at most 1, got a 1329-bit integer"]),
        (1, []),
        (1e-9, []),
    ],
)
def test_a_number_field(value: Any, expected: list[str]) -> None:
    assert lr(value) == expected


def test_a_huge_integer_is_refused_before_it_becomes_a_float() -> None:
    # 2**1000 still fits a float and is refused by the bound; 2**1024 does not fit one at all.
    assert lr(2**1000) == ["spec.training.learningRate: must be at most 1, got a 1001-bit integer"]
    assert lr(2**1024) == ["spec.training.learningRate: must be at most 1, got a 1025-bit integer"]
    assert lr(2**999) == ["spec.training.learningRate: must be at most 1, got a 1000-bit integer"]


def overrides(value: Any) -> list[str]:
    return problems({"model": {"overrides": value}})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([1], ["spec.model.overrides: expected object, got array"]),
        ("x", ["spec.model.overrides: expected object, got string 'x'"]),
        ({1: 2}, ["spec.model.overrides: keys must be strings, got integer 1"]),
        ({"a" * 65: 1}, ["spec.model.overrides: a key is longer than 64 characters"]),
        ({"num_hidden_layers": True}, ["spec.model.overrides.num_hidden_layers: expected integer, got boolean true"]),
        ({"num_hidden_layers": 1.5}, ["spec.model.overrides.num_hidden_layers: expected integer, got number 1.5"]),
        ({"num_hidden_layers": [2]}, ["spec.model.overrides.num_hidden_layers: expected integer, got array"]),
        ({"num_hidden_layers": 2**31}, ["spec.model.overrides.num_hidden_layers: must be at most 1024, got"]),
        ({"num_hidden_layers": 0}, ["spec.model.overrides.num_hidden_layers: must be at least 1, got 0"]),
        ({"rms_norm_eps": 0}, ["spec.model.overrides.rms_norm_eps: must be greater than 0, got 0.0"]),
        ({"rms_norm_eps": float("nan")}, ["spec.model.overrides.rms_norm_eps: must be a finite number, got nan"]),
        ({"attention_dropout": 2}, ["spec.model.overrides.attention_dropout: must be at most 1, got 2.0"]),
        ({"tie_word_embeddings": 0}, ["spec.model.overrides.tie_word_embeddings: expected boolean, got integer 0"]),
        ({"hidden_act": "evil"}, ["spec.model.overrides.hidden_act: 'evil' is not one of silu, swish, gelu"]),
        # the largest layer count is a well-formed override; 1,024 layers of Qwen2.5-1.5B's width fit no L4
        ({"num_hidden_layers": 1024, "hidden_act": "silu", "tie_word_embeddings": False}, ["spec.training: a rank"]),
        ({"num_hidden_layers": 2.0, "rms_norm_eps": 1, "initializer_range": 0.5}, []),
        ({f"k{i}": i for i in range(65)}, ["spec.model.overrides: more than 64 entries (65)"]),
    ],
)
def test_overrides_are_config_fields_in_their_types(value: Any, expected: list[str]) -> None:
    got = overrides(value)
    assert len(got) == len(expected) and all(g.startswith(e) for g, e in zip(got, expected, strict=True)), got


@pytest.mark.parametrize(
    "key",
    ["trust_remote_code", "token", "return_unused_kwargs", "__class__", "__init__", "revision", "cache_dir", "layers"],
)
def test_an_override_that_is_not_a_config_field_is_refused(key: str) -> None:
    """Keyword arguments of AutoConfig.from_pretrained that are loader options, attributes, or nothing."""
    assert overrides({key: 1}) == [
        f"spec.model.overrides.{key}: not a config field of Qwen2Config (the qwen2 family); overrides may set only: "
        + ", ".join(sorted(model_configs.FAMILIES["qwen2"]))
    ]


def test_an_override_is_checked_against_the_family_of_the_model() -> None:
    llama = problems({"model": {"name": "meta-llama/Llama-3.2-1B", "overrides": {"head_dim": 64, "sliding_window": 8}}})
    assert [p.split(";")[0] for p in llama] == [
        "spec.model.overrides.sliding_window: not a config field of LlamaConfig (the llama family)"
    ]
    # A name that says no family: the fields every family has, typed alike.
    other = problems({"model": {"name": "/models/mine", "overrides": {"hidden_size": 64, "token": "x"}}})
    assert [p.split(";")[0] for p in other] == [
        "spec.model.overrides.token: not a config field of the supported model families"
    ]


def test_a_model_of_no_known_family_may_set_only_the_fields_every_family_has() -> None:
    """The intersection, not the union: a field of one family only (Llama's head_dim and pretraining_tp, Qwen2's
    sliding_window) is refused for a model the operator cannot place in a family."""
    common = model_configs.allowed_fields("/models/mine")
    for family, fields_ in model_configs.FAMILIES.items():
        assert set(common) < set(fields_), family
        assert all(fields_[name] == declared for name, declared in common.items()), family
    only_some = set().union(*model_configs.FAMILIES.values()) - set(common)
    assert {"head_dim", "pretraining_tp", "sliding_window", "max_window_layers", "mlp_bias"} <= only_some
    for key in sorted(only_some):
        found = problems({"model": {"name": "/models/mine", "overrides": {key: 1}}})
        assert [p.split(";")[0] for p in found] == [
            f"spec.model.overrides.{key}: not a config field of the supported model families"
        ], key


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("Qwen/Qwen2.5-1.5B", "qwen2"),
        ("Qwen/Qwen2-0.5B-Instruct", "qwen2"),
        ("Qwen/Qwen2.5-Math-7B", "qwen2"),
        ("/models/qwen2.5-local", "qwen2"),
        ("Qwen/Qwen3-0.6B", "qwen3"),
        ("Qwen/Qwen3-30B-A3B", None),
        ("Qwen/Qwen3-VL-8B-Instruct", None),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral"),
        ("mistralai/Mixtral-8x7B-v0.1", None),
        ("google/gemma-2-9b-it", "gemma2"),
        ("google/gemma-3-1b-it", "gemma3_text"),
        ("google/gemma-3-4b-it", None),
        ("microsoft/Phi-3-mini-4k-instruct", "phi3"),
        ("microsoft/Phi-3.5-mini-instruct", "phi3"),
        ("microsoft/Phi-3.5-MoE-instruct", None),
        ("microsoft/Phi-3-small-8k-instruct", None),
        ("allenai/OLMo-2-1124-7B", "olmo2"),
        ("Qwen/Qwen1.5-7B", None),
        ("Qwen/Qwen1.5-MoE-A2.7B", None),
        ("Qwen/Qwen-7B", None),
        ("Qwen/Qwen2-VL-7B-Instruct", None),
        ("Qwen/Qwen2.5-VL-3B-Instruct", None),
        ("Qwen/Qwen2-57B-A14B-MoE", None),
        ("Qwen/Qwen2-Audio-7B", None),
        ("Qwen/Qwen25-1B", None),
        ("meta-llama/Llama-3.2-1B", "llama"),
        ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "llama"),
        ("meta-llama/Llama-4-Scout-17B-16E", None),
        ("meta-llama/Llama-3.2-11B-Vision", None),
        ("gpt2", None),
    ],
)
def test_a_family_is_read_from_the_name_only_when_the_name_says_exactly_that_family(
    name: str, family: str | None
) -> None:
    """Qwen1.5 and Qwen3 are other config classes (Qwen3Config has head_dim, no max_window_layers): Qwen2's fields
    are not theirs, and a pattern loosened to `qwen` would give them those."""
    assert model_configs.family_of(name) == family
    expected = model_configs.FAMILIES[family] if family else model_configs.common_fields()
    assert model_configs.allowed_fields(name) == expected
    if family is None:
        refused = problems({"model": {"name": name, "overrides": {"sliding_window": 8}}})
        assert refused and refused[0].startswith("spec.model.overrides.sliding_window: not a config field"), refused


def test_every_bad_key_and_value_of_a_map_is_reported_and_the_good_ones_stay_quiet() -> None:
    got = overrides({1: 2, "vocab_size": 3, "hidden_size": True, 2: "x"})
    assert got == [
        "spec.model.overrides: keys must be strings, got integer 1",
        "spec.model.overrides: keys must be strings, got integer 2",
    ]
    assert overrides({"vocab_size": 3, "hidden_size": True, "num_hidden_layers": "2"}) == [
        "spec.model.overrides.hidden_size: expected integer, got boolean true",
        "spec.model.overrides.num_hidden_layers: expected integer, got string '2'",
    ]


def test_a_string_value_in_a_map_is_bounded() -> None:
    long = problems({"model": {"overrides": {"hidden_act": "x" * 5000}}})
    assert len(long) == 1 and long[0].startswith("spec.model.overrides.hidden_act: 'xxxx")
    assert len(long[0]) < 300


def test_a_list_field_at_and_past_its_item_bound() -> None:
    env = [{"name": f"NCCL_V{i}", "value": "x"} for i in range(129)]
    assert problems({"network": {"env": env[:128]}}) == []
    assert problems({"network": {"env": env}}) == ["spec.network.env: more than 128 items (129)"]
    assert problems({"network": {"env": {"name": "V"}}}) == ["spec.network.env: expected array, got object"]


# --- rules of particular shapes ----------------------------------------------------------------------------


def tolerations(*items: dict[str, Any]) -> list[str]:
    return problems({"workers": {"tolerations": list(items)}})


def test_toleration_rules_as_kubernetes_has_them() -> None:
    path = "spec.workers.tolerations[0]"
    # No operator means Equal: with no key that would tolerate nothing sensible, so it is refused.
    assert tolerations({"value": "x"}) == [
        f"{path}.operator: must be Exists when key is empty (that tolerates every taint)"
    ]
    # Kubernetes takes it (it tolerates every taint); a job may not, as it tolerates control-plane taints too.
    assert tolerations({"operator": "Exists"}) == [
        f"{path}: an empty key with operator Exists tolerates every taint, the control-plane taints included; "
        "name the taints to tolerate"
    ]
    assert tolerations({"key": "k", "value": "v"}) == []
    assert tolerations({"key": "k", "operator": "Exists", "value": "v"}) == [
        f"{path}.value: must be empty when operator is Exists"
    ]
    assert tolerations({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}) == []
    assert tolerations({"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}) == [
        f"{path}.effect: must be NoExecute when tolerationSeconds is set"
    ]
    assert tolerations({"key": "k", "operator": "Exists", "tolerationSeconds": 30}) == [
        f"{path}.effect: must be NoExecute when tolerationSeconds is set"
    ]


def test_operator_owned_prefixes_cover_their_family_only() -> None:
    from fsdp_operator.api.env_rules import operator_owned

    for name in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "NCCL_DEBUG_SUBSYS", "RAY_AUTH_TOKEN", " fi_provider "):
        assert operator_owned(name), name
    for name in ("FIX", "FILE", "NCCL_ALGO", "RAY_ADDRESS_X", "MY_FI_PROVIDER"):
        assert operator_owned(name) is None, name


def test_not_a_job_says_what_it_got() -> None:
    from fsdp_operator.api.spec import NotAJobError

    with pytest.raises(NotAJobError) as missing:
        parse_job({"metadata": {"name": "x"}})
    assert str(missing.value) == (
        "expected apiVersion: fsdp.dev/v1alpha1 and kind: FSDPTrainingJob, "
        "got apiVersion: (missing) and kind: (missing)"
    )
    with pytest.raises(NotAJobError) as pod:
        parse_job({"apiVersion": "v1", "kind": "Pod"})
    assert str(pod.value).endswith("got apiVersion: v1 and kind: Pod")


def test_a_spec_error_reads_one_problem_per_line() -> None:
    assert str(SpecError(["a: x", "b: y"])) == "a: x\nb: y"


def test_a_one_gpu_worker_asks_ray_for_its_gpu_and_the_entrypoint_is_canonical_json() -> None:
    import json
    import shlex

    from fsdp_operator.api import render

    workers = {"replicas": 2, "instanceType": "g6.xlarge", "gpusPerWorker": 1, "efaPerWorker": 0, "cpu": "3",
               "memory": "12Gi"}  # fmt: skip
    manifest = {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": "one", "uid": "u"},
                "spec": {"workers": workers, "network": {"transport": "socket"}}}  # fmt: skip
    sub = render.submission(parse_job(manifest), "one-1", "/pkg")
    assert sub.config["scaling"] == {"num_workers": 2, "use_gpu": True, "resources_per_worker": {"CPU": 1, "GPU": 1}}
    argv = shlex.split(sub.entrypoint)
    assert argv[:4] == ["python", "-m", "fsdp_train.run.ray_entry", "--config-json"] and len(argv) == 5
    # The same job always gives the same text: compact and key-sorted.
    assert argv[4] == json.dumps(json.loads(argv[4]), separators=(",", ":"), sort_keys=True)


def test_evaluation_without_validation_data_is_refused_with_the_field_named() -> None:
    data = {"source": "s3://bucket/corpus", "evalEverySteps": 10}
    assert problems({"data": data}) == [
        "spec.data.evalEverySteps: needs spec.data.validationSplit or spec.data.validationSource: there is nothing "
        "to evaluate."
    ]
    assert problems({"data": {**data, "validationSplit": 0.1}}) == []
    assert problems({"data": {**data, "validationSource": "s3://bucket/held-out"}}) == []


def test_a_null_inside_a_map_or_a_list_is_named_as_null() -> None:
    assert overrides({"hidden_size": None}) == ["spec.model.overrides.hidden_size: expected integer, got null"]
    assert problems({"runtimeEnv": {"pip": [None]}}) == ["spec.runtimeEnv.pip[0]: expected string, got null"]
