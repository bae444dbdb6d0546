"""What decides a run's trajectory, stored beside each checkpoint: a rerun with other settings is refused."""

from __future__ import annotations

import json
from typing import Any

from fsdp_train.contract.config import RANDOM_DATA, TrainConfig

TRAJECTORY_FIELDS = (
    "model",
    "model_init",
    "model_overrides",
    "seed",
    "data",
    "data_format",
    "data_field",
    "data_kind",
    "tokenizer",
    "validation_split",
    "validation_data",
    "shuffle_seed",
    "document_mask",
    "epochs",
    "steps",
    "seq_len",
    "learning_rate",
    "lr_schedule",
    "warmup_steps",
    "weight_decay",
    "max_grad_norm",
    "mixed_precision",
    "precision",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "lora_quantize_base",
)
"""The settings that decide a run's trajectory: a checkpoint resumes only a run with the same values
(``steps`` and ``epochs`` too: the learning-rate schedule depends on the length)."""


def run_fingerprint(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """What decides the trajectory: the ``TRAJECTORY_FIELDS``, the global batch, and the data files' listing."""
    values: dict[str, Any] = {name: getattr(cfg, name) for name in TRAJECTORY_FIELDS}
    values["global_batch"] = world_size * cfg.batch_size_per_rank * cfg.grad_accum
    if cfg.data != RANDOM_DATA:
        from fsdp_train.datapath.data import open_source

        # File names and sizes: new content under the same location is another run.
        values["data_files"] = open_source(cfg.data, cfg.data_format).fingerprint()
    stored: dict[str, Any] = json.loads(json.dumps(values, sort_keys=True, default=str))  # as stored, for comparing
    return stored
