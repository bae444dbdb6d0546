"""Ray job entrypoint: ``python -m fsdp_train.run.ray_entry --config-json '<JSON>'`` runs the loop in TorchTrainer.

The JSON: ``{"train": {TrainConfig}, "scaling": {"num_workers": 4, "use_gpu": false,
"resources_per_worker": {"CPU": 1}}, "max_failures": 0, "storage_path": "/shared/or/s3://..." | null,
"name": "job-name"}``. Ray's checkpoints go to ``storage_path`` (or, when that is null, to the training
config's ``checkpoint_path``) under ``name``; a restarted worker group resumes from the latest one.
Exits 1 with a one-line ``fsdp_train: training failed: ...`` on stderr when training fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsdp_train.contract.config import TrainConfig
from fsdp_train.run.user_function import FunctionConfig
from fsdp_train.watch.tracking import Settings

if TYPE_CHECKING:
    from fsdp_train.models.parallelize import Topology

# Per-rank event lines survive Ray's log handling only without dedup and without Train's print patch
# (../shared/notes/environment.md). Train V2 passes RAY_TRAIN_* variables from driver to workers.
RAY_LOG_ENV = {"RAY_DEDUP_LOGS": "0", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}

_TOP_KEYS = {"train", "scaling", "max_failures", "storage_path", "name", "function", "health", "tracking"}
_SCALING_KEYS = {"num_workers", "use_gpu", "resources_per_worker"}


@dataclass(kw_only=True, slots=True)
class RayJobConfig:
    """The entrypoint's whole input: the training config plus how Ray should run it."""

    train: TrainConfig
    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] = field(default_factory=dict)
    max_failures: int = 0
    """Worker-group restarts Ray may make before the job fails."""
    storage_path: str | None = None
    name: str = "fsdp-train"
    function: FunctionConfig | None = None
    """A user's Ray Train function to run instead of the bundled one (``fsdp_train.run.user_function``)."""
    health: dict[str, Any] | None = None
    """``fsdp_train.watch.health.HealthConfig`` as a mapping (checked here, built on each rank)."""
    tracking: dict[str, Any] | None = None
    """Where rank 0 (or, for a user function, Ray Train's controller) logs the run (``fsdp_train.watch.tracking``)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RayJobConfig:
        if not isinstance(d, dict):
            raise ValueError("the entrypoint config must be a JSON object.")
        unknown = sorted(set(d) - _TOP_KEYS)
        if unknown:
            raise ValueError(f"{unknown[0]} is not a known entrypoint field (known: {', '.join(sorted(_TOP_KEYS))}).")
        scaling = d.get("scaling") or {}
        if not isinstance(scaling, dict):
            raise ValueError("scaling must be a mapping.")
        unknown = sorted(set(scaling) - _SCALING_KEYS)
        if unknown:
            raise ValueError(f"scaling.{unknown[0]} is not a known field (known: {', '.join(sorted(_SCALING_KEYS))}).")
        num_workers = scaling.get("num_workers", 1)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers <= 0:
            raise ValueError(f"scaling.num_workers must be an integer greater than 0, got {num_workers!r}.")
        use_gpu = scaling.get("use_gpu", False)
        if not isinstance(use_gpu, bool):
            raise ValueError(f"scaling.use_gpu must be true or false, got {use_gpu!r}.")
        resources = scaling.get("resources_per_worker") or {}
        if not isinstance(resources, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in resources.values()
        ):
            raise ValueError(f"scaling.resources_per_worker must map names to numbers, got {resources!r}.")
        max_failures = d.get("max_failures", 0)
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < -1:
            raise ValueError(f"max_failures must be an integer of -1 (unlimited) or more, got {max_failures!r}.")
        storage_path = d.get("storage_path")
        if storage_path is not None and not isinstance(storage_path, str):
            raise ValueError(f"storage_path must be a string or null, got {storage_path!r}.")
        name = d.get("name") or "fsdp-train"
        if not isinstance(name, str):
            raise ValueError(f"name must be a string, got {name!r}.")
        return cls(
            train=TrainConfig.from_dict(d.get("train") or {}),
            num_workers=num_workers,
            use_gpu=use_gpu,
            resources_per_worker={k: float(v) for k, v in resources.items()},
            max_failures=max_failures,
            storage_path=storage_path or None,
            name=name,
            function=FunctionConfig.from_dict(d["function"]) if d.get("function") is not None else None,
            health=_health(d.get("health")),
            tracking=Settings.from_dict(d["tracking"]).to_dict() if d.get("tracking") is not None else None,
        )

    @property
    def run_storage(self) -> str | None:
        """Where Ray keeps the run's checkpoints; None: Ray's default (``~/ray_results``)."""
        return self.storage_path or self.train.checkpoint_path or None


def _health(raw: Any) -> dict[str, Any] | None:
    from fsdp_train.watch.health import HealthConfig

    return HealthConfig.from_dict(raw).to_dict() if raw is not None else None


def with_key(fn: Callable[[dict[str, Any]], Any], key_hex: str) -> Callable[[dict[str, Any]], Any]:
    """`fn` as each Ray Train worker runs it, signing with the attempt's key from its first statement.

    The key travels inside the function (pickled to Ray Train's controller, then to each worker), not in the job's
    runtime environment: Ray gives that to every worker of the job (Ray Data's tasks, every task a rank starts), keeps
    it readable in ``ray.get_runtime_context().runtime_env`` and records the workers' copy in Ray Train's run state.
    Not in ``train_loop_config`` either: Ray Train records that in its run state too (its dashboard shows it).
    """

    def per_worker(loop_config: dict[str, Any]) -> Any:
        from fsdp_train.contract.events import take_key, use_key

        # First: no data, dependency, model config or user code has run in this process yet. A key still in its
        # environment (a runtime environment that set it) leaves the environment too.
        take_key()
        use_key(key_hex)
        return fn(loop_config)

    return per_worker


def train_fn_per_worker(loop_config: dict[str, Any]) -> dict[str, Any]:
    """What each Ray Train worker runs: the torchrun loop with Ray's topology and checkpoints (under `with_key`)."""
    from fsdp_train.watch.startup import use_bytecode_cache

    use_bytecode_cache(str(loop_config["train"].get("compile_cache_dir", "")))  # before the heavy imports
    from fsdp_train.datapath.data import prepare_from_ray
    from fsdp_train.run.loop import Host, prepare_torchrun, train
    from fsdp_train.state.checkpoint import Checkpointer, NoCheckpoints, RayCheckpoints
    from fsdp_train.watch.health import HealthConfig

    cfg = TrainConfig.from_dict(loop_config["train"])
    topo, node_ip = ray_worker(bool(loop_config.get("use_gpu")))
    checkpointer: Checkpointer = RayCheckpoints() if cfg.checkpoint_path else NoCheckpoints()
    # With datasets the driver's Ray Data pipeline prepared the rows; without, the ranks read the source.
    prepare = prepare_from_ray if loop_config.get("ray_data") else prepare_torchrun
    host = Host(node_ip=node_ip, checkpointer=checkpointer, prepare_data=prepare)
    host.health = HealthConfig.from_dict(loop_config.get("health"))
    tracker = tracking_for_rank(loop_config, topo, cfg)
    try:
        summary = train(cfg, topo, host)
    except BaseException:
        if tracker is not None:
            tracker.close("FAILED")
        raise
    if tracker is not None:
        tracker.close("FINISHED")
    return summary


def tracking_for_rank(loop_config: dict[str, Any], topo: Topology, cfg: TrainConfig) -> Any:
    """Rank 0's MLflow tracker (``fsdp_train.watch.tracking``) when the job names one; None otherwise."""
    from fsdp_train.watch import tracking

    raw, train = loop_config.get("tracking"), loop_config["train"]
    return tracking.start(
        raw,
        train,
        world_size=topo.world_size,
        rank=topo.rank,
        learning_rate=cfg.learning_rate_at,
        fingerprint=lambda: tracking.data_fingerprint(train, topo.world_size),
    )


def ray_worker(use_gpu: bool) -> tuple[Topology, str]:
    """This Ray Train worker's ``Topology`` and node address, from Ray Train's context."""
    import ray.train
    import ray.util

    from fsdp_train.models.parallelize import Topology

    ctx = ray.train.get_context()
    device_index = None
    if use_gpu:
        import ray.train.torch

        device_index = ray.train.torch.get_device().index
    topo = Topology.from_values(
        rank=ctx.get_world_rank(),
        world_size=ctx.get_world_size(),
        local_rank=ctx.get_local_rank(),
        local_world_size=ctx.get_local_world_size(),
        node_rank=ctx.get_node_rank(),
        device_index=device_index,
    )
    node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return topo, node_ip


def user_fn_per_worker(loop_config: dict[str, Any]) -> Any:
    """What each Ray Train worker runs for a user function (under `with_key`, which takes the key before the user's
    code is imported): the bundled reports, then the function."""
    from fsdp_train.run.user_function import run_user_function
    from fsdp_train.watch import report

    function = FunctionConfig.from_dict(loop_config["function"])
    topo, node_ip = ray_worker(bool(loop_config.get("use_gpu")))
    device = report.rank_device(topo)
    if device.type == "cuda":
        report.prepare_nccl_debug(os.environ)

    def verify() -> object:
        return report.verify_link(
            topo, node_ip=node_ip, device=device, env=os.environ, probe_size_bytes=function.probe_size_bytes
        )

    from fsdp_train.run.user_function import reported_step
    from fsdp_train.watch.health import HealthConfig, watching_reports
    from fsdp_train.watch.notice import finish_user_function

    # After a notice (fsdp_train.watch.notice.interrupted), the interruption is reported and marks rank 0's return
    # value.
    with watching_reports(topo.rank, HealthConfig.from_dict(loop_config.get("health")), reported_step):
        return finish_user_function(run_user_function(function, topo.rank, verify))


def reported_metrics_callback(storage: str | None, key_hex: str = "", job: RayJobConfig | None = None) -> Any:
    """A ``ray.train.UserCallback``: in Ray Train's controller, each ``ray.train.report`` of a user function
    becomes signed events (``user_function.events_from_report``), under the controller's own emitter name, with the
    attempt's key `key_hex` the callback carries there (pickled with it; not in the job's runtime environment)."""
    import ray.train

    from fsdp_train.contract import events
    from fsdp_train.run.user_function import checkpoint_uri, events_from_report

    class ReportedMetrics(ray.train.UserCallback):
        def __init__(self) -> None:
            self.reports = 0
            self.tracker: Any = None
            """The job's MLflow run in the controller (``fsdp_train.watch.tracking.Tracker``), once the first report
            came."""

        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            if self.reports == 0:
                # The controller is a process of its own: the key came with this callback.
                events.take_key()
                events.use_key(key_hex, emitter=events.CONTROLLER)
                if job is not None and job.tracking is not None and job.function is not None:
                    # Each report goes to the job's run from here (the tracker lives as long as the controller).
                    from fsdp_train.watch import tracking

                    params = {"function": job.function.to_dict()}
                    self.tracker = tracking.start(job.tracking, params, world_size=job.num_workers, rank=0)
            self.reports += 1
            path = checkpoint_uri(storage, str(checkpoint.path)) if checkpoint is not None else None
            for event in events_from_report(
                metrics[0] if metrics else {}, reports=self.reports, world_size=len(metrics), checkpoint_path=path
            ):
                events.emit(event)

    return ReportedMetrics()


def tracker_closer(reported: Any) -> Any:
    """A Ray Train controller callback that sends what the report callback's tracker still holds when the run ends,
    and marks the run ended: the controller's process ends with the run, and the tracker's sender thread with it, so
    the last report, queued for the next batch, never reached MLflow (a 12-step function had steps 1..11 there).

    Ray Train's public ``UserCallback`` has no hook at the run's end; ``ControllerCallback`` (a developer API of Ray
    Train V2) has ``after_controller_finish``, called in the controller with the run's result. Both callbacks travel
    to the controller in one ``RunConfig``, so `reported` there is the callback that started the tracker."""
    from ray.train.v2._internal.execution.callback import ControllerCallback

    class CloseTracker(ControllerCallback):
        def after_controller_finish(self, result: Any) -> None:
            if reported.tracker is not None:
                reported.tracker.close("FAILED" if getattr(result, "error", None) is not None else "FINISHED")

    return CloseTracker()


def one_line(error: BaseException) -> str:
    """The root cause in one line: the last ``SomeError: message`` line of the text, else its first line after the
    error's reason (the project's own reason its Failure event carries, such as DataUnavailable; else its type)."""
    from fsdp_train.contract.events import safe_str
    from fsdp_train.contract.failures import own_reason

    lines = [line.strip() for line in safe_str(error).splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Interrupt")) and " " not in head:
            return line
    return f"{own_reason(error) or type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def run(job: RayJobConfig) -> dict[str, Any]:
    """Fit the TorchTrainer; return rank 0's summary. ``RAY_LOG_ENV`` must be in the environment already."""
    import ray
    import ray.train
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if job.function is None:
        # Before Ray and before the tokenizer is fetched: a missing data file is said as such, in seconds, not as
        # a hub error a minute later.
        from fsdp_train.run import preflight

        preflight.check(preflight.data_problems(job.train), reason=preflight.DATA_UNAVAILABLE)
        preflight.check(preflight.tokenizer_problems(job.train))
    if not ray.is_initialized():
        ray.init()
    datasets = driver_datasets(job.train) if job.function is None else {}
    from fsdp_train.contract.events import signing_key

    key = signing_key()  # taken by `main` from the environment, before `ray.init` could hand it to every worker
    callbacks: list[Any] = []
    if job.function is not None:
        reported = reported_metrics_callback(job.run_storage, key, job)
        callbacks = [reported, tracker_closer(reported)]
    trainer = TorchTrainer(
        # Train V2 hands rank 0's return value back
        with_key(train_fn_per_worker if job.function is None else user_fn_per_worker, key),
        train_loop_config={
            "train": job.train.to_dict(),
            "use_gpu": job.use_gpu,
            "ray_data": bool(datasets),
            "tracking": job.tracking,
            **({"function": job.function.to_dict()} if job.function is not None else {}),
            **({"health": job.health} if job.health is not None else {}),
        },
        datasets=datasets or None,
        # Every worker reads the packed rows whole and takes its samples in the sampler's order
        # (fsdp_train.datapath.data.ray_datasets says why): no split by Ray.
        dataset_config=ray.train.DataConfig(datasets_to_split=[]),
        scaling_config=ScalingConfig(
            num_workers=job.num_workers,
            use_gpu=job.use_gpu,
            resources_per_worker=job.resources_per_worker or None,
        ),
        run_config=RunConfig(
            name=job.name,
            storage_path=job.run_storage,
            failure_config=FailureConfig(max_failures=job.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            callbacks=callbacks,
        ),
    )
    try:
        result = trainer.fit()
    finally:
        # Disconnect first, so that Ray's own shutdown chatter comes before the job's last line.
        ray.shutdown()
    if job.function is not None and job.tracking is not None:
        from fsdp_train.watch.tracking import finish_run

        finish_run(Settings.from_dict(job.tracking), "FAILED" if result.error is not None else "FINISHED")
    if result.error is not None:
        raise result.error
    summary = getattr(result, "return_value", None)
    if job.function is not None:
        # A user function's return value is its own (it may hold anything), not the job's summary; only the wrapper's
        # mark of an interruption (fsdp_train.watch.notice) is read.
        interrupted = summary.get("interrupted") if isinstance(summary, dict) and len(summary) == 1 else None
        return {"interrupted": interrupted} if isinstance(interrupted, dict) else {}
    return summary if isinstance(summary, dict) else {}


def driver_datasets(cfg: TrainConfig) -> dict[str, Any]:
    """Ray Data's read-tokenize-pack pipeline for a data source (none for random tokens)."""
    from fsdp_train.contract.config import RANDOM_DATA

    if cfg.data == RANDOM_DATA:
        return {}
    from fsdp_train.datapath.data import ray_datasets, tokenizer_location

    # The location, not a copy on this (head) node: the tokenizing tasks fetch it where they run.
    return ray_datasets(cfg, tokenizer_location(cfg, cfg.model if cfg.model_init == "pretrained" else None))


def main(argv: list[str] | None = None) -> int:
    from fsdp_train.contract.events import DRIVER, take_key

    # The driver's own events (a data failure) are signed too, in a sequence of their own (they say rank 0, as rank
    # 0's process does); the key leaves its environment.
    take_key(emitter=DRIVER)
    # Before Ray is imported: it reads RAY_DEDUP_LOGS once, at import.
    os.environ.update(RAY_LOG_ENV)
    parser = argparse.ArgumentParser(prog="python -m fsdp_train.run.ray_entry", description=__doc__)
    parser.add_argument("--config-json", required=True, help="the entrypoint config as one JSON object")
    args = parser.parse_args(argv)
    try:
        job = RayJobConfig.from_dict(json.loads(args.config_json))
    except ValueError as e:  # json.JSONDecodeError is a ValueError too
        print(f"fsdp_train: invalid config: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        summary = run(job)
    except Exception as e:
        from fsdp_train.contract.events import emit, safe_str
        from fsdp_train.contract.failures import failure_of, own_reason

        if own_reason(e):  # the driver's own failure (the data pipeline runs here): tell the operator why
            emit(failure_of(0, e))
        print(f"{type(e).__name__}: {safe_str(e)}", file=sys.stderr, flush=True)
        print(f"fsdp_train: training failed: {one_line(e)}", file=sys.stderr, flush=True)
        return 1
    if isinstance(stopped := summary.get("interrupted"), dict):
        from fsdp_train.watch.notice import EXIT_INTERRUPTED

        # The attempt ends here: a node goes away. The operator starts the next one, which resumes from the checkpoint.
        print(
            f"fsdp_train: interrupted by a notice: {json.dumps(stopped, sort_keys=True)}", file=sys.stderr, flush=True
        )
        return EXIT_INTERRUPTED
    print(f"fsdp_train: training finished: {json.dumps(summary, sort_keys=True)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
