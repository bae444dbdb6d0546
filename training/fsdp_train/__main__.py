"""torchrun entry: ``torchrun --nproc-per-node N -m fsdp_train --config-json '{...}'`` (or ``--config FILE``).

Runs the same per-rank loop as the Ray entrypoint. Node rank comes from torchrun (GROUP_RANK);
``FSDP_TRAIN_RANKS_PER_NODE=N`` regroups every N consecutive ranks into one fake node.
"""

from __future__ import annotations

import argparse
import sys

from fsdp_train.contract.config import TrainConfig


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(prog="python -m fsdp_train", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config-json", help="the TrainConfig as one JSON object")
    source.add_argument("--config", help="a file holding the TrainConfig as JSON")
    args = parser.parse_args(argv)
    try:
        if args.config_json is not None:
            return TrainConfig.from_json(args.config_json)
        return TrainConfig.from_file(args.config)
    except (ValueError, OSError) as e:
        parser.error(str(e))
        raise  # parser.error exits; this line only tells type checkers so


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    from fsdp_train.watch.startup import use_bytecode_cache

    use_bytecode_cache(cfg.compile_cache_dir)  # before the heavy imports
    from fsdp_train.run.loop import run_from_env  # torch is imported only once the config is valid

    summary = run_from_env(cfg)
    from fsdp_train.watch.notice import EXIT_INTERRUPTED

    return EXIT_INTERRUPTED if summary.get("interrupted") else 0  # a notice ended the run after its checkpoint


if __name__ == "__main__":
    sys.exit(main())
