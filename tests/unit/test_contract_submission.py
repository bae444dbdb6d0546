"""The operator -> trainer contract: a job's spec, through `render.submission()`, is the config the loop runs.

The entrypoint string the operator submits is split as a shell would, handed to `fsdp_train.run.ray_entry`'s
own `main()` (its argument parser and config parser), and the `RayJobConfig` it would run is compared,
field by field, with values written down here for every example, and for a sample of accepted specs.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.api import render
from fsdp_operator.api.spec import SpecError, parse_job
from fsdp_train.contract.config import TrainConfig
from fsdp_train.run import ray_entry
from fsdp_train.run.ray_entry import RayJobConfig
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PACKAGE = "/opt/fsdp_train"
SID = "tiny-cpu-0123abcd-1"

TINY_OVERRIDES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
}

# spec.health's defaults as the ranks receive them (fsdp_train.watch.health.HealthConfig).
DEFAULT_HEALTH = {"enabled": True, "hang_timeout_seconds": None, "window_steps": 20}

# What the loop runs for each example, written out in full (defaults included): the values every example shares
# once, here, and each example's own below (an example's own value replaces a shared one).
SHARED_TRAIN: dict[str, Any] = {
    "model_overrides": {},
    "grad_accum": 1,
    "lr_schedule": "constant",
    "warmup_steps": 0,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "activation_checkpointing": False,
    "loss_chunk_tokens": 4096,
    "reshard_after_forward": True,
    "seed": 0,
    "data": "random",
    "checkpoint_path": "",
    "checkpoint_interval": 0,
    "min_cross_node_gbps": 25.0,
}
# The examples that read a data set: the data fields none of them sets.
SHARED_DATA: dict[str, Any] = {
    "data_format": "",
    "data_field": "text",
    "data_kind": "text",
    "tokenizer": "",
    "validation_data": "",
    "shuffle_seed": 0,
    "epochs": 0,
    "export_every_checkpoint": False,
}
# The GPU examples: Qwen2.5-1.5B's pretrained weights, compiled, in bf16, on eight GPUs.
GPU_TRAIN: dict[str, Any] = {
    "model": "Qwen/Qwen2.5-1.5B",
    "model_init": "pretrained",
    "seq_len": 2048,
    "sharding": "auto",
    "mixed_precision": "bf16",
    "compile": True,
    "probe_size_bytes": 67108864,
}
# The two examples that fine-tune the model `fsdpctl local make-model` makes, on its sample, on CPU.
TINY_FINETUNE: dict[str, Any] = {
    **SHARED_DATA,
    "model": "/tmp/fsdp-tiny-model",
    "model_init": "pretrained",
    "steps": 40,
    "seq_len": 64,
    "batch_size_per_rank": 2,
    "sharding": "hybrid",
    "mixed_precision": "fp32",
    "compile": False,
    "data": "/tmp/fsdp-tiny-model/sample.jsonl",
    "validation_split": 0.1,
    "eval_every_steps": 10,
    "probe_size_bytes": 1048576,
}
# The GPU examples that fine-tune on chat conversations (supervised): the same data, schedule and checkpoints.
GPU_CHAT: dict[str, Any] = {
    **GPU_TRAIN,
    **SHARED_DATA,
    "steps": 2000,
    "batch_size_per_rank": 2,
    "grad_accum": 4,
    "lr_schedule": "cosine",
    "warmup_steps": 50,
    "data": "s3://my-bucket/sft/conversations/",
    "data_format": "jsonl",
    "data_field": "messages",
    "data_kind": "chat",
    "validation_split": 0.02,
    "eval_every_steps": 100,
    "epochs": 2,
    "checkpoint_interval": 200,
}
CPU_SCALING: dict[str, Any] = {"num_workers": 4, "use_gpu": False, "resources_per_worker": {"CPU": 1.0}}
GPU_SCALING: dict[str, Any] = {"num_workers": 8, "use_gpu": True, "resources_per_worker": {"CPU": 1.0, "GPU": 1.0}}


def expected(name: str, scaling: dict[str, Any], storage_path: str | None, train: dict[str, Any]) -> RayJobConfig:
    """One example's `RayJobConfig`: its own training values over the shared ones, no retries in Ray, the default
    health settings."""
    return RayJobConfig(
        train=TrainConfig(**{**SHARED_TRAIN, **train}),
        **scaling,
        max_failures=0,
        storage_path=storage_path,
        name=name,
        health=DEFAULT_HEALTH,
    )


EXPECTED: dict[str, RayJobConfig] = {
    "tiny-cpu.yaml": expected(
        "tiny-cpu",
        CPU_SCALING,
        None,
        {
            "model": "Qwen/Qwen2.5-1.5B",
            "model_init": "random",
            "model_overrides": TINY_OVERRIDES,
            "steps": 20,
            "seq_len": 64,
            "batch_size_per_rank": 2,
            "learning_rate": 0.001,
            "sharding": "hybrid",
            "mixed_precision": "fp32",
            "compile": False,
            "probe_size_bytes": 1048576,
        },
    ),
    "tiny-finetune.yaml": expected(
        "tiny-finetune",
        CPU_SCALING,
        "/tmp/fsdp-tiny-checkpoints",
        {
            **TINY_FINETUNE,
            "learning_rate": 0.01,
            "output_path": "/tmp/fsdp-tiny-export",
            "checkpoint_path": "/tmp/fsdp-tiny-checkpoints",
        },
    ),
    "tiny-lora.yaml": expected(
        "tiny-lora",
        CPU_SCALING,
        "/tmp/fsdp-tiny-lora-checkpoints",
        {
            **TINY_FINETUNE,
            "learning_rate": 0.02,
            "output_path": "/tmp/fsdp-tiny-lora",
            "export_merged": True,
            "checkpoint_path": "/tmp/fsdp-tiny-lora-checkpoints",
            "lora_rank": 8,
            "lora_alpha": 16,
        },
    ),
    "qwen2.5-7b-lora.yaml": expected(
        "qwen25-7b-lora",
        GPU_SCALING,
        "s3://my-bucket/checkpoints/qwen25-7b-lora",
        {
            **GPU_CHAT,
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "learning_rate": 2e-4,
            "activation_checkpointing": True,
            "loss_chunk_tokens": 1024,
            "output_path": "s3://my-bucket/adapters/qwen25-7b-lora",
            "export_merged": True,
            "checkpoint_path": "s3://my-bucket/checkpoints/qwen25-7b-lora",
            "lora_rank": 16,
            "lora_alpha": 32,
        },
    ),
    "qwen2.5-14b-qlora.yaml": expected(
        "qwen25-14b-qlora",
        GPU_SCALING,
        "s3://my-bucket/checkpoints/qwen25-14b-qlora",
        {
            **GPU_CHAT,
            "model": "Qwen/Qwen2.5-14B-Instruct",
            "learning_rate": 2e-4,
            "activation_checkpointing": True,
            "loss_chunk_tokens": 1024,
            "output_path": "s3://my-bucket/adapters/qwen25-14b-qlora",
            "checkpoint_path": "s3://my-bucket/checkpoints/qwen25-14b-qlora",
            "lora_rank": 16,
            "lora_alpha": 32,
            "lora_quantize_base": "nf4",
        },
    ),
    "qwen2.5-1.5b-efa.yaml": expected(
        "qwen25-1p5b-efa",
        GPU_SCALING,
        None,
        {
            **GPU_TRAIN,
            "steps": 100,
            "batch_size_per_rank": 1,
            "learning_rate": 2e-5,
        },
    ),
    "qwen2.5-1.5b-efa-tuned.yaml": expected(
        "qwen25-1p5b-efa-tuned",
        GPU_SCALING,
        "s3://my-bucket/qwen25-1p5b",
        {
            **GPU_TRAIN,
            "steps": 100,
            "batch_size_per_rank": 2,
            "grad_accum": 8,
            "learning_rate": 2e-5,
            "reshard_after_forward": False,
            "checkpoint_path": "s3://my-bucket/qwen25-1p5b",
            "checkpoint_interval": 50,
        },
    ),
    "qwen2.5-1.5b-sft.yaml": expected(
        "qwen25-1p5b-sft",
        GPU_SCALING,
        "s3://my-bucket/checkpoints/qwen25-1p5b-sft",
        {
            **GPU_CHAT,
            "model": "Qwen/Qwen2.5-1.5B-Instruct",
            "learning_rate": 1e-5,
            "shuffle_seed": 1,
            "output_path": "s3://my-bucket/models/qwen25-1p5b-sft",
            "checkpoint_path": "s3://my-bucket/checkpoints/qwen25-1p5b-sft",
        },
    ),
}

# The runtime environment every submission carries, besides the job's own runtimeEnv.envVars.
RUNTIME_ENV_VARS = {
    "TORCH_FR_BUFFER_SIZE": "2000",
    "RAY_DEDUP_LOGS": "0",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    "PYTHONUNBUFFERED": "1",
    "NCCL_DEBUG_FILE": "/tmp/ray/nccl.%h.%p.log",
    # The event lines are ASCII written below Python's text layer; this keeps the rest of the output readable.
    "PYTHONIOENCODING": "utf-8",
}


def through_the_entrypoint(manifest: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[RayJobConfig, Any]:
    """Render the submission, run its entrypoint's own `main()` up to the point where it would start Ray."""
    job = parse_job(manifest)
    submission = render.submission(job, SID, PACKAGE)
    argv = shlex.split(submission.entrypoint)
    assert argv[:3] == ["python", "-m", "fsdp_train.run.ray_entry"]
    seen: list[RayJobConfig] = []

    def capture(config: RayJobConfig) -> dict[str, Any]:
        seen.append(config)
        return {"steps": config.train.steps}

    monkeypatch.setattr(ray_entry, "run", capture)
    for key in ray_entry.RAY_LOG_ENV:
        monkeypatch.setenv(key, "unset")  # main() writes these; monkeypatch puts the old values back
    assert ray_entry.main(argv[3:]) == 0
    (config,) = seen
    return config, submission


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_every_example_reaches_the_loop_field_by_field(example: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = yaml.safe_load((EXAMPLES / example).read_text())
    config, submission = through_the_entrypoint(manifest, monkeypatch)
    want = EXPECTED[example]
    for name in TrainConfig.__dataclass_fields__:
        assert getattr(config.train, name) == getattr(want.train, name), f"train.{name}"
    assert config == want
    assert submission.submission_id == SID
    assert submission.runtime_env == {"py_modules": [PACKAGE], "env_vars": RUNTIME_ENV_VARS}
    assert submission.metadata == {"fsdp.dev/job": want.name, "fsdp.dev/namespace": "default"}


def test_every_example_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(EXPECTED)


def test_the_log_settings_the_entrypoint_needs_are_in_the_submission() -> None:
    """Ray reads RAY_DEDUP_LOGS at import: the runtime env must carry what the entrypoint also sets."""
    assert ray_entry.RAY_LOG_ENV.items() <= RUNTIME_ENV_VARS.items()


def test_runtime_env_of_the_job_reaches_the_submission(monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    manifest["spec"]["runtimeEnv"] = {
        "pip": ["datasets==3.0.0"],
        "envVars": {"HF_HOME": "/cache"},
    }
    _, submission = through_the_entrypoint(manifest, monkeypatch)
    assert submission.runtime_env["pip"] == ["datasets==3.0.0"]
    assert submission.runtime_env["env_vars"] == {**RUNTIME_ENV_VARS, "HF_HOME": "/cache"}


def test_an_entrypoint_config_is_one_shell_word_whatever_the_spec_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quotes, `$`, `;` and backticks in a value must reach the trainer verbatim, not be split or expanded."""
    manifest = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    manifest["metadata"]["name"] = "quote-test"
    manifest["spec"]["model"]["name"] = '/models/it\'s-$HOME-"dir";`id`'
    config, submission = through_the_entrypoint(manifest, monkeypatch)
    assert config.train.model == '/models/it\'s-$HOME-"dir";`id`'
    assert len(shlex.split(submission.entrypoint)) == 5


# --- a sample of accepted specs --------------------------------------------------------------------------

# spec.training key -> (TrainConfig field, values hypothesis may draw), bounds taken from the CRD.
TRAINING_FIELDS: dict[str, tuple[str, st.SearchStrategy[Any]]] = {
    "steps": ("steps", st.integers(10, 100_000)),
    "seqLen": ("seq_len", st.integers(8, 65_536)),
    "batchSizePerRank": ("batch_size_per_rank", st.integers(1, 64)),
    "gradientAccumulation": ("grad_accum", st.integers(1, 64)),
    "learningRate": ("learning_rate", st.floats(1e-8, 1.0)),
    "lrSchedule": ("lr_schedule", st.sampled_from(["constant", "cosine"])),
    "warmupSteps": ("warmup_steps", st.integers(0, 9)),
    "sharding": ("sharding", st.sampled_from(["full", "hybrid", "auto"])),
    "mixedPrecision": ("mixed_precision", st.sampled_from(["bf16", "fp32"])),
    "activationCheckpointing": ("activation_checkpointing", st.booleans()),
    "compile": ("compile", st.booleans()),
    "reshardAfterForward": ("reshard_after_forward", st.booleans()),
    "lossChunkTokens": ("loss_chunk_tokens", st.integers(0, 1 << 20)),
    "seed": ("seed", st.integers(0, 2**31 - 1)),
    "probeSizeBytes": ("probe_size_bytes", st.integers(0, 1 << 30)),
    "precision": ("precision", st.sampled_from(["bf16", "fp8", "auto"])),
    "compileCacheDir": ("compile_cache_dir", st.sampled_from(["", "/shared/compile-cache"])),
}
CHECKPOINT_FIELDS = {"storage": "checkpoint_path", "intervalSteps": "checkpoint_interval"}
LORA_FIELDS: dict[str, tuple[str, st.SearchStrategy[Any]]] = {
    "rank": ("lora_rank", st.integers(1, 4096)),
    "alpha": ("lora_alpha", st.integers(1, 65_536)),
    "dropout": ("lora_dropout", st.floats(0.0, 0.9)),
    "targetModules": ("lora_target_modules", st.lists(st.sampled_from(["q_proj", "v_proj", "down_proj"]), max_size=3)),
    "quantizeBase": ("lora_quantize_base", st.sampled_from(["none", "nf4"])),
}


@st.composite
def training_specs(draw: st.DrawFn) -> dict[str, Any]:
    chosen = draw(st.sets(st.sampled_from(sorted(TRAINING_FIELDS))))
    training = {key: draw(TRAINING_FIELDS[key][1]) for key in sorted(chosen)}
    if draw(st.booleans()):
        training["checkpoint"] = {
            "storage": draw(st.sampled_from(["s3://bucket/run", "/shared/ckpt", "file:///data/c"])),
            "intervalSteps": draw(st.integers(0, 1000)),
        }
    if draw(st.booleans()):
        lora = draw(st.sets(st.sampled_from(sorted(LORA_FIELDS))))
        training["lora"] = {key: draw(LORA_FIELDS[key][1]) for key in sorted(lora)}
    return training


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(training=training_specs(), replicas=st.integers(1, 4))
def test_accepted_training_specs_reach_the_loop_unchanged(
    training: dict[str, Any], replicas: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    manifest["spec"]["training"] = training
    manifest["spec"]["workers"]["replicas"] = replicas
    try:
        parse_job(manifest)
    except SpecError:
        reject()  # the sample is of specs the operator accepts (hybrid sharding on one worker is not)
    config, _ = through_the_entrypoint(manifest, monkeypatch)
    for key, value in training.items():
        if key == "checkpoint":
            for sub, name in CHECKPOINT_FIELDS.items():
                assert getattr(config.train, name) == value[sub], f"training.checkpoint.{sub}"
            assert config.storage_path == value["storage"]
        elif key == "lora":
            for sub, (name, _) in LORA_FIELDS.items():
                if sub in value:
                    assert getattr(config.train, name) == value[sub], f"training.lora.{sub}"
            assert config.train.lora_rank == value.get("rank", 16)  # a lora section turns LoRA on
        else:
            assert getattr(config.train, TRAINING_FIELDS[key][0]) == value, f"training.{key}"
    assert config.num_workers == 2 * replicas  # ranksPerWorker 2 in tiny-cpu.yaml
    assert config.max_failures == 0  # retries are the operator's, under a new submission id


def test_the_table_names_every_training_field_of_the_crd() -> None:
    crd = yaml.safe_load((EXAMPLES.parent / "crds" / "fsdptrainingjob.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    training = spec["properties"]["training"]["properties"]
    assert set(training) == {*TRAINING_FIELDS, "checkpoint", "lora"}
    assert set(training["lora"]["properties"]) == set(LORA_FIELDS)
    # gracePeriodSeconds is the worker pods' terminationGracePeriodSeconds (render.py), not the function's config.
    assert set(training["checkpoint"]["properties"]) == {*CHECKPOINT_FIELDS, "gracePeriodSeconds"}


def test_the_entrypoint_rejects_what_the_operator_never_sends() -> None:
    """Unknown keys fail loudly (a renamed field on one side must not be silently dropped)."""
    with pytest.raises(ValueError, match=r"^tarin is not a known entrypoint field"):
        RayJobConfig.from_dict({"tarin": {}})
    with pytest.raises(ValueError, match=r"^training\.grad_acum is not a known field"):
        RayJobConfig.from_dict({"train": {"grad_acum": 2}})
    assert json.loads(json.dumps(EXPECTED["tiny-cpu.yaml"].train.to_dict()))["grad_accum"] == 1
