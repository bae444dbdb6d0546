"""What `spec.model.overrides` may set: the config fields of each supported model family, typed and bounded.

The overrides become keyword arguments of the model's Hugging Face config (`Qwen2Config(**...)`, or
`AutoConfig.from_pretrained(name, **...)`). There a key that is not a config field is not ignored: it
is a loader option (`trust_remote_code` runs the model repository's Python, `token` puts a credential
into the entrypoint Ray prints, `return_unused_kwargs` changes what the call returns) or an attribute
(`__class__`). So only the fields below pass, with their type and a range that can build a model.

The operator never imports transformers; tests/unit/test_model_overrides.py does, and holds this table
to the `__init__` signature of each config class (names and types), so it cannot drift from the
transformers version the training image pins.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from fsdp_train.contract.known_models import KNOWN_CONFIGS

from fsdp_operator.api.fields import Problems, show, show_key, type_name

ConfigType = Literal["int", "float", "bool", "str"]


@dataclass(frozen=True, slots=True)
class ConfigField:
    """One config field an override may set."""

    type: ConfigType
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[str, ...] = ()


_COUNT = ConfigField("int", minimum=1, maximum=2**31 - 1)
# Sane maxima: what a model this operator can train may have, each far above every released model's value (in
# brackets), and each far below what would overflow a tensor's size or a GPU's memory in one layer.
_VOCAB = ConfigField("int", minimum=1, maximum=2**22)  # 4,194,304 (largest released: 262,144)
_WIDTH = ConfigField("int", minimum=1, maximum=65_536)  # hidden_size (16,384 in Llama 3.1 405B)
_FFN_WIDTH = ConfigField("int", minimum=1, maximum=262_144)  # intermediate_size (53,248)
_LAYERS = ConfigField("int", minimum=1, maximum=1024)  # num_hidden_layers (126), heads (128), head_dim (256)
_CONTEXT = ConfigField("int", minimum=1, maximum=2**24)  # 16,777,216 positions (10M in Llama 4 Scout)
_TOKEN_ID = ConfigField("int", minimum=0, maximum=2**22 - 1)  # below vocab_size (a rule of check_overrides)
_PROBABILITY = ConfigField("float", minimum=0, maximum=1)
_POSITIVE = ConfigField("float", minimum=0, exclusive_minimum=True, maximum=1e12)
# The activations the decoder MLPs of these families accept (transformers' ACT2FN; the test checks them).
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "tanh")

_DECODER_FIELDS: dict[str, ConfigField] = {
    "vocab_size": _VOCAB,
    "hidden_size": _WIDTH,
    "intermediate_size": _FFN_WIDTH,
    "num_hidden_layers": _LAYERS,
    "num_attention_heads": _LAYERS,
    "num_key_value_heads": _LAYERS,
    "hidden_act": ConfigField("str", choices=ACTIVATIONS),
    "max_position_embeddings": _CONTEXT,
    "initializer_range": ConfigField("float", minimum=0, maximum=10),
    "rms_norm_eps": _POSITIVE,
    "tie_word_embeddings": ConfigField("bool"),
    "attention_dropout": _PROBABILITY,
    "pad_token_id": _TOKEN_ID,
    "bos_token_id": _TOKEN_ID,
    "eos_token_id": _TOKEN_ID,
}

_BOOL = ConfigField("bool")
_SOFTCAP = ConfigField("float", minimum=0, exclusive_minimum=True, maximum=1e6)
_WINDOW = {"sliding_window": _CONTEXT}
_GEMMA = {
    **{name: field for name, field in _DECODER_FIELDS.items() if name != "hidden_act"},
    **_WINDOW,
    "hidden_activation": ConfigField("str", choices=ACTIVATIONS),
    "attention_bias": _BOOL,
    "head_dim": _LAYERS,
    "query_pre_attn_scalar": ConfigField("int", minimum=1, maximum=65_536),
    "attn_logit_softcapping": _SOFTCAP,
    "final_logit_softcapping": _SOFTCAP,
    "use_bidirectional_attention": _BOOL,
}

# The families tests/unit/training/test_families.py trains through the bundled path (docs/model-families.md).
FAMILIES: dict[str, dict[str, ConfigField]] = {
    # transformers.Qwen2Config
    "qwen2": {
        **_DECODER_FIELDS,
        **_WINDOW,
        "use_sliding_window": _BOOL,
        "max_window_layers": ConfigField("int", minimum=0, maximum=1024),
    },
    # transformers.LlamaConfig
    "llama": {
        **_DECODER_FIELDS,
        "pretraining_tp": _LAYERS,
        "attention_bias": _BOOL,
        "mlp_bias": _BOOL,
        "head_dim": _LAYERS,
    },
    # transformers.Qwen3Config
    "qwen3": {
        **_DECODER_FIELDS,
        **_WINDOW,
        "use_sliding_window": _BOOL,
        "max_window_layers": ConfigField("int", minimum=0, maximum=1024),
        "attention_bias": _BOOL,
        "head_dim": _LAYERS,
    },
    # transformers.MistralConfig
    "mistral": {**_DECODER_FIELDS, **_WINDOW, "head_dim": _LAYERS},
    # transformers.Gemma2Config, transformers.Gemma3TextConfig (the same fields)
    "gemma2": _GEMMA,
    "gemma3_text": _GEMMA,
    # transformers.Phi3Config
    "phi3": {
        **_DECODER_FIELDS,
        **_WINDOW,
        "resid_pdrop": _PROBABILITY,
        "embd_pdrop": _PROBABILITY,
        "original_max_position_embeddings": _CONTEXT,
    },
    # transformers.Olmo2Config
    "olmo2": {**_DECODER_FIELDS, "attention_bias": _BOOL},
}
"""Config fields per family (the `model_type` of the config); a family's config class is `CONFIG_CLASSES`."""

CONFIG_CLASSES = {
    "qwen2": "Qwen2Config",
    "llama": "LlamaConfig",
    "qwen3": "Qwen3Config",
    "mistral": "MistralConfig",
    "gemma2": "Gemma2Config",
    "gemma3_text": "Gemma3TextConfig",
    "phi3": "Phi3Config",
    "olmo2": "Olmo2Config",
}

# Fields of these classes deliberately left out, and why (the test requires every field to be here or above).
LEFT_OUT = {
    "use_cache": "the training function sets it (False): a KV cache has no use in training",
    "rope_parameters": "a nested object (RoPE scaling); not a scalar override",
    "layer_types": "a list, derived from use_sliding_window and max_window_layers",
}

# Known model ids and name patterns -> family; a name that matches none is checked against the fields every family
# has. Exact on purpose: Qwen1.5 and Qwen3 (Qwen3Config: head_dim, no max_window_layers) are not Qwen2, nor are
# the Qwen2 models of another architecture (Qwen2-VL, Qwen2-MoE, Qwen2-Audio; their own config classes), nor
# Llama 4 or Llama 3.2 Vision (Llama4Config, MllamaConfig).
_NAME_FLAGS = re.IGNORECASE | re.DOTALL
_FAMILY_OF_NAME = (
    (
        re.compile(r"(?<![a-z0-9])qwen-?2(?:\.5)?(?![0-9.])(?!.*(?:vl|moe|audio|omni))", _NAME_FLAGS),
        "qwen2",
    ),
    (re.compile(r"^(?!.*llama[-_ ]?4)(?!.*vision).*llama", _NAME_FLAGS), "llama"),
    # Qwen3's dense models (not Qwen3-30B-A3B and the other mixtures, nor the VL and Omni models)
    (re.compile(r"(?<![a-z0-9])qwen-?3(?![0-9.])(?!.*(?:vl|moe|omni|-a\d+b))", _NAME_FLAGS), "qwen3"),
    (re.compile(r"(?<![a-z0-9])mistral-(?:7b|nemo)", _NAME_FLAGS), "mistral"),
    (re.compile(r"(?<![a-z0-9])gemma-?2(?![0-9.])", _NAME_FLAGS), "gemma2"),
    # Gemma 3's text-only sizes; the larger ones are image-text models (Gemma3Config)
    (re.compile(r"(?<![a-z0-9])gemma-?3-(?:1b|270m)(?![0-9])", _NAME_FLAGS), "gemma3_text"),
    # Phi-3 and 3.5 mini and medium (Phi-3-small has its own config class; the MoE and vision models theirs)
    (re.compile(r"(?<![a-z0-9])phi-?3(?:\.5)?-(?:mini|medium)(?!.*(?:moe|vision))", _NAME_FLAGS), "phi3"),
    (re.compile(r"(?<![a-z0-9])olmo-?2(?![0-9])", _NAME_FLAGS), "olmo2"),
)


def family_of(model_name: str) -> str | None:
    """The family of a model id or path, when its name says it (Qwen/Qwen2.5-1.5B: qwen2); else None."""
    for pattern, family in _FAMILY_OF_NAME:
        if pattern.search(model_name):
            return family
    return None


def common_fields() -> dict[str, ConfigField]:
    """The fields every family has, declared alike in each (the intersection)."""
    first, *others = FAMILIES.values()
    return {name: declared for name, declared in first.items() if all(f.get(name) == declared for f in others)}


def allowed_fields(model_name: str) -> dict[str, ConfigField]:
    """The fields an override of `model_name` may set: its family's, or those every family has (`common_fields`)."""
    family = family_of(model_name)
    return FAMILIES[family] if family is not None else common_fields()


def check_overrides(model_name: str, overrides: dict[str, Any], path: str, problems: Problems) -> dict[str, Any]:
    """`overrides` with each value in its field's type (an integral float for an integer field becomes one).

    Every key that is not a config field of the model's family, every value of the wrong type or out of
    range is a problem at `path.<key>`.
    """
    allowed = allowed_fields(model_name)
    family = family_of(model_name)
    scope = f"{CONFIG_CLASSES[family]} (the {family} family)" if family else "the supported model families"
    checked: dict[str, Any] = {}
    for key, value in overrides.items():
        sub = f"{path}.{show_key(key)}"
        declared = allowed.get(key)
        if declared is None:
            problems.append(
                f"{sub}: not a config field of {scope}; overrides may set only: {', '.join(sorted(allowed))}"
            )
            continue
        typed = _typed(declared, value, sub, problems)
        if typed is not None:
            checked[key] = typed
    if len(checked) == len(overrides):
        _check_architecture(model_name, checked, path, problems)
    return checked


def _check_architecture(model_name: str, overrides: dict[str, Any], path: str, problems: Problems) -> None:
    """What the model built from the overrides needs of them together (transformers 5's attention layers).

    Judged on the model's own config with the overrides applied where the operator knows it (the ids the
    training function builds offline, fsdp_train.contract.known_models), else on the overrides alone: a rule whose
    fields are not all known is not judged here, and a rule none of whose fields is overridden neither.
    """
    base = {k: v for k, v in KNOWN_CONFIGS.get(model_name, {}).items() if isinstance(v, int)}
    config: dict[str, Any] = {**base, **overrides}

    def judged(*fields: str) -> bool:
        return all(config.get(f) is not None for f in fields) and any(f in overrides for f in fields)

    def named(field: str) -> str:
        return (
            f"{path}.{field} ({config[field]})" if field in overrides else f"{model_name}'s {field} ({config[field]})"
        )

    def at(*fields: str) -> str:
        return f"{path}.{next(f for f in fields if f in overrides)}"

    if judged("hidden_size", "num_attention_heads") and config["hidden_size"] % config["num_attention_heads"]:
        # Each head takes hidden_size / heads of the hidden state (LlamaConfig refuses it; Qwen2 fails in forward).
        problems.append(
            f"{at('num_attention_heads', 'hidden_size')}: {named('hidden_size')} is not a multiple of "
            f"{named('num_attention_heads')}"
        )
    if judged("num_attention_heads", "num_key_value_heads") and (
        config["num_attention_heads"] % config["num_key_value_heads"]
    ):
        # Grouped-query attention repeats each key/value head heads / kv_heads times (repeat_kv): it fails otherwise.
        problems.append(
            f"{at('num_key_value_heads', 'num_attention_heads')}: {named('num_attention_heads')} is not a multiple "
            f"of {named('num_key_value_heads')} (each key/value head serves a whole group of heads)"
        )
    head_dim = config.get("head_dim")
    if head_dim is None and judged("hidden_size", "num_attention_heads"):
        whole, rest = divmod(config["hidden_size"], config["num_attention_heads"])
        head_dim = None if rest else whole
    touched = any(f in overrides for f in ("head_dim", "hidden_size", "num_attention_heads"))
    if head_dim is not None and head_dim % 2 and touched:
        # Rotary embeddings rotate the two halves of each head against each other (rotate_half): no odd size.
        problems.append(
            f"{at('head_dim', 'num_attention_heads', 'hidden_size')}: the attention head size ({head_dim}) is odd; "
            "rotary position embeddings need an even one"
        )
    for token in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if token in overrides and judged(token, "vocab_size") and config[token] >= config["vocab_size"]:
            # pad: nn.Embedding refuses a padding_idx outside it; bos/eos: transformers warns of "unexpected behavior".
            problems.append(f"{path}.{token}: {config[token]} is not an id of the vocabulary ({named('vocab_size')})")


def _typed(declared: ConfigField, value: Any, path: str, problems: Problems) -> Any:
    if declared.type == "bool":
        if not isinstance(value, bool):
            problems.append(f"{path}: expected boolean, got {_shown(value)}")
            return None
        return value
    if declared.type == "str":
        if not isinstance(value, str):
            problems.append(f"{path}: expected string, got {_shown(value)}")
            return None
        if declared.choices and value not in declared.choices:
            problems.append(f"{path}: {show(value)} is not one of {', '.join(declared.choices)}")
            return None
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        expected = "integer" if declared.type == "int" else "number"
        problems.append(f"{path}: expected {expected}, got {_shown(value)}")
        return None
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{path}: must be a finite number, got {show(value)}")
        return None
    if declared.type == "int":
        if isinstance(value, float):
            if not value.is_integer():
                problems.append(f"{path}: expected integer, got number {show(value)}")
                return None
            value = int(value)
    else:
        value = float(value)
    if declared.minimum is not None:
        if declared.exclusive_minimum and value <= declared.minimum:
            problems.append(f"{path}: must be greater than {_num(declared.minimum)}, got {show(value)}")
            return None
        if value < declared.minimum:
            problems.append(f"{path}: must be at least {_num(declared.minimum)}, got {show(value)}")
            return None
    if declared.maximum is not None and value > declared.maximum:
        problems.append(f"{path}: must be at most {_num(declared.maximum)}, got {show(value)}")
        return None
    return value


def _shown(value: Any) -> str:
    scalar = not isinstance(value, dict | list) and value is not None
    return f"{type_name(value)} {show(value)}" if scalar else type_name(value)


def _num(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


def openapi_properties() -> dict[str, dict[str, Any]]:
    """The CRD schema of every field some family has (a field two families share is declared alike)."""
    properties: dict[str, dict[str, Any]] = {}
    for fields_ in FAMILIES.values():
        for name, declared in sorted(fields_.items()):
            families = ", ".join(f for f, other in FAMILIES.items() if name in other)
            schema: dict[str, Any] = {
                "type": {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}[declared.type],
                "description": f"The model config's {name} ({families}).",
            }
            if declared.choices:
                schema["enum"] = list(declared.choices)
            if declared.minimum is not None:
                schema["minimum"] = int(declared.minimum) if declared.type == "int" else declared.minimum
                if declared.exclusive_minimum:
                    schema["exclusiveMinimum"] = True
            if declared.maximum is not None:
                schema["maximum"] = int(declared.maximum) if declared.type == "int" else declared.maximum
            if properties.setdefault(name, schema) != schema:
                raise ValueError(f"model config field {name} is declared differently in two families")
    return dict(sorted(properties.items()))


def reference_rows() -> list[tuple[str, str, str]]:
    """(field, type and range, families) for the field reference (docs/api.md)."""
    rows = []
    names = sorted({name for fields_ in FAMILIES.values() for name in fields_})
    for name in names:
        families = [f for f, fields_ in FAMILIES.items() if name in fields_]
        declared = FAMILIES[families[0]][name]
        words = declared.type if declared.type != "str" else f"one of {', '.join(declared.choices)}"
        if declared.minimum is not None:
            words += f", {'>' if declared.exclusive_minimum else '>='} {_num(declared.minimum)}"
        if declared.maximum is not None:
            words += f", <= {_num(declared.maximum)}"
        rows.append((name, words, ", ".join(families)))
    return rows
