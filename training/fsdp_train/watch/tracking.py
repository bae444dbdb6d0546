"""Experiment tracking (MLflow) from one process of a job: rank 0 of the bundled function, or Ray Train's controller
for a user function (each ``ray.train.report`` becomes events there, ``fsdp_train.run.user_function``).

The process's events (``fsdp_train.contract.events.emit``) are its one source: a :class:`Tracker` listens to them,
turns each
into MLflow records on a bounded queue, and a daemon thread sends them in batches. Training never waits on the
tracker and never fails for it: a tracker that is down, refuses a call or falls behind costs the records it could
not take, and is said in a signed ``Tracking`` event that the operator turns into the TrackingHealthy condition (a
Warning), never a failed job. ``close`` waits for the queue to drain at most ``CLOSE_SECONDS``.

One MLflow run per generation of a job: the run carries the job's uid and generation as tags, and an attempt (a
retry, a restart of the worker group, a resume from a checkpoint) finds it by them and continues it (its steps go
on from the checkpoint's). A changed job (a new generation) gets a new run. Without a uid (torchrun) every start
is a new run.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fsdp_train.contract import events
from fsdp_train.contract.config import MERGED_DIR
from fsdp_train.contract.events import Event, Tracking

QUEUE_RECORDS = 100_000
"""Records kept while the tracker lags; more are dropped (and counted) rather than held in memory."""
FLUSH_SECONDS = 1.0
RETRY_SECONDS = 5.0
"""After a failed call, how long the sender waits before it tries again (records keep queueing meanwhile)."""
CLOSE_SECONDS = 60.0
UPLOAD_LIMIT_BYTES = 1 << 30
"""A local export larger than this is linked (its path as a tag), not uploaded into the run's artifacts."""
# Bounded waits for each call the client makes; a user's own values (spec.env) win.
CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    # MLflow 3 keeps its file store in maintenance mode and refuses it without this (a server is the way ahead).
    "MLFLOW_ALLOW_FILE_STORE": "true",
}
NOT_INSTALLED = (
    "the MLflow client is not installed where the job runs: add mlflow-skinny==3.17.2 to spec.runtimeEnv.pip, or "
    "install it in the image (docs/tracking.md)"
)
UID_TAG, GENERATION_TAG, JOB_TAG, ATTEMPT_TAG = (
    "fsdp.dev/uid",
    "fsdp.dev/generation",
    "fsdp.dev/job",
    "fsdp.dev/attempt",
)
_UID = re.compile(r"[A-Za-z0-9-]{1,64}")
_METRIC_NAME = re.compile(r"[^A-Za-z0-9_\-. /]")  # what MLflow accepts in a metric or parameter name


@dataclass(frozen=True, slots=True)
class Settings:
    """The entrypoint's ``tracking`` config (the operator's ``tracking_entry.entry``)."""

    uri: str
    experiment: str
    run_name: str
    registered_model: str = ""
    job: str = ""
    uid: str = ""
    generation: int = 0
    attempt: int = 0
    instance_type: str = ""
    operator_version: str = ""
    param_names: dict[str, str] = field(default_factory=dict)
    """The run's parameter name for each training field a spec field sets (`seq_len`: `training.seqLen`)."""

    @classmethod
    def from_dict(cls, d: Any) -> Settings:
        if not isinstance(d, dict):
            raise ValueError("tracking must be a mapping.")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"tracking.{unknown[0]} is not a known field (known: {', '.join(known)}).")
        for name in ("uri", "experiment", "run_name"):
            if not isinstance(d.get(name), str) or not d[name]:
                raise ValueError(f"tracking.{name} must be a non-empty string.")
        names = d.get("param_names", {})
        if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
            raise ValueError("tracking.param_names must map strings to strings.")
        for name, value in d.items():
            if name == "param_names":
                continue
            want = int if name in ("generation", "attempt") else str
            if isinstance(value, bool) or not isinstance(value, want):
                raise ValueError(f"tracking.{name} must be {'an integer' if want is int else 'a string'}.")
        if d.get("uid") and not _UID.fullmatch(d["uid"]):
            raise ValueError("tracking.uid must be a Kubernetes uid (letters, digits, '-').")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def param_name(self, train_field: str) -> str:
        """A training field's parameter name: as in the spec where a spec field sets it, else `train.<field>`."""
        return self.param_names.get(train_field) or f"train.{train_field}"

    @property
    def is_server(self) -> bool:
        return self.uri.startswith(("http://", "https://"))


@dataclass(frozen=True, slots=True)
class _Metric:
    key: str
    value: float
    step: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class _Tag:
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class _Param:
    """A parameter known only once the ranks resolved it (`auto`, the device): by its training field's name."""

    name: str
    value: str


@dataclass(frozen=True, slots=True)
class _Export:
    path: str
    step: int


@dataclass(frozen=True, slots=True)
class _Document:
    name: str
    content: dict[str, Any]


_CLOSE = object()
Record = _Metric | _Tag | _Param | _Export | _Document

EXPERIMENT_KIND_TAG, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
"""MLflow 3's UI shows an experiment by its kind: without it, one with these runs was listed with GenAI's
"Evaluation runs"; `custom_model_development` is its model-training view (the UI's own name for the kind)."""

RESOLVED_ON_RANKS = ("precision", "sharding")
"""Training fields whose value the ranks resolve (`auto`, fp32 on a CPU): logged as what ran, from rank 0's `Resolved`
event before the first step (a run that fails before its summary has them too)."""


def metric_name(name: str) -> str:
    """`name` with the characters MLflow refuses in a metric name replaced by '_', at most 250 characters."""
    return _METRIC_NAME.sub("_", name)[:250] or "_"


def records_of(event: Event, learning_rate: Callable[[int], float] | None = None) -> list[Record]:
    """What one event of the process becomes in the run (pure: no I/O)."""
    now = int(event.time * 1000) if math.isfinite(event.time) else int(time.time() * 1000)
    out: list[Record] = []

    def metric(key: str, value: float | None, step: int = 0) -> None:
        if value is not None and math.isfinite(value):
            out.append(_Metric(metric_name(key), float(value), step, now))

    if isinstance(event, events.Step):
        metric("loss", event.loss, event.step)
        if learning_rate is not None:
            metric("learning_rate", learning_rate(event.step), event.step)
        metric("tokens_per_second", event.tokens_per_second, event.step)
        metric("tokens_per_second_per_device", event.tokens_per_second_per_device, event.step)
        metric("mfu", event.mfu, event.step)
        metric("step_seconds", event.step_seconds or None, event.step)
        metric("peak_memory_bytes", event.peak_memory_bytes or None, event.step)
        if event.samples_seen:
            metric("epoch", event.epoch, event.step)
        for name, value in sorted(event.extra.items()):  # a user function's own, the bundled one's grad_norm
            metric(name, value, event.step)
    elif isinstance(event, events.Evaluation):
        metric("eval_loss", event.loss, event.step)
    elif isinstance(event, events.Timings):
        metric("time_to_first_step_seconds", event.to_first_step_seconds)
        for key in ("startup_seconds", "probe_seconds", "build_seconds", "first_step_seconds"):
            metric(f"startup.{key}", getattr(event, key))
    elif isinstance(event, events.Probe):
        metric(f"probe.{event.scope}.allreduce_busbw_gbps", event.allreduce_busbw_gbps)
        metric(f"probe.{event.scope}.allgather_busbw_gbps", event.allgather_busbw_gbps)
    elif isinstance(event, events.Transport):
        out.append(_Tag(f"nccl.transport.rank{event.rank}", event.transport))
    elif isinstance(event, events.Checkpoint):
        out.append(_Tag("checkpoint.path", event.path[:5000]))
        metric("checkpoint_step", event.step, event.step)
    elif isinstance(event, events.Export):
        out.append(_Export(event.path, event.step))
    elif isinstance(event, events.Resolved) and event.rank == 0:
        out += [_Param(name, str(getattr(event, name))) for name in RESOLVED_ON_RANKS if getattr(event, name)]
    elif isinstance(event, events.Summary) and event.rank == 0:
        out.append(_Document("summary.json", {k: v for k, v in events.as_dict(event).items() if k != "time"}))
        metric("final_loss", event.final_loss)
        metric("mean_tokens_per_second", event.tokens_per_second)
        metric("mean_mfu", event.mfu)
        metric("run_seconds", event.seconds)
    elif isinstance(event, events.Failure):
        out.append(_Tag("failure", f"rank {event.rank}: {event.message}"[:5000]))
    return out


def flat_params(prefix: str, values: Mapping[str, Any]) -> dict[str, str]:
    """Nested settings as MLflow parameters (``train.seq_len``), each value at most MLflow's 6000 characters."""
    out: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(f"{name}.", value))
        else:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
            out[metric_name(name)] = text[:6000]
    return out


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:300]


class Tracker:
    """The run of this process: records queued by :meth:`on_event`, sent by a daemon thread."""

    def __init__(
        self,
        settings: Settings,
        *,
        params: Callable[[], Mapping[str, str]],
        learning_rate: Callable[[int], float] | None = None,
        rank: int = 0,
        client: Any = None,
    ) -> None:
        self.settings = settings
        self.params = params
        """Computed by the sender, once, for a new run (a data source's fingerprint lists its files)."""
        self.learning_rate = learning_rate
        self.rank = rank
        self._client = client
        self._queue: queue.Queue[object] = queue.Queue(QUEUE_RECORDS)
        self.run_id = ""
        self.experiment_id = ""
        self.problem = ""
        self.lost = 0
        self.sent = 0
        self._thread = threading.Thread(target=self._serve, name="fsdp-tracking", daemon=True)

    # --- the training side: never blocks, never raises ------------------------------------------------------

    def start(self) -> Tracker:
        for name, value in CLIENT_ENV.items():
            os.environ.setdefault(name, value)
        events.LISTENERS.append(self.on_event)
        self._thread.start()
        return self

    def on_event(self, event: Event) -> None:
        if isinstance(event, Tracking):
            return
        try:
            for record in records_of(event, self.learning_rate):
                self._queue.put_nowait(record)
        except queue.Full:
            self.lost += 1
        except Exception as e:  # nothing a tracker does may fail a training step
            self._say(f"could not record a {event.kind} event: {_short(e)}")

    def close(self, status: str = "FINISHED", timeout: float = CLOSE_SECONDS) -> None:
        """Mark the run ended (``FINISHED``, ``FAILED``) after what is queued; wait at most `timeout` seconds."""
        if self.on_event in events.LISTENERS:
            events.LISTENERS.remove(self.on_event)
        try:
            self._queue.put(("end", status), timeout=timeout)
            self._queue.put(_CLOSE, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._say(f"the tracker did not take the last {self._queue.qsize()} records within {timeout:.0f}s")

    # --- the sender thread --------------------------------------------------------------------------------

    def _serve(self) -> None:
        try:  # at once: importing MLflow and finding the run overlap the job's start-up, not its end
            self._connect()
        except Exception as e:  # the first batch tries again
            self._say(_short(e))
        while True:
            batch = self._take()
            closing = _CLOSE in batch
            try:
                self._deliver([item for item in batch if item is not _CLOSE])
            except Exception as e:  # any failure of the tracker is a Warning, never the job's
                self.lost += len(batch)
                self._say(f"{_short(e)} ({self.lost} records not logged so far)")
                if not closing:
                    time.sleep(RETRY_SECONDS)
            else:
                if self.problem and not self.lost:
                    self._say("")
            if closing:
                return

    def _take(self) -> list[object]:
        items = [self._queue.get()]
        deadline = time.monotonic() + FLUSH_SECONDS
        while len(items) < 5000 and items[-1] is not _CLOSE:
            try:
                items.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return items

    def _deliver(self, batch: list[object]) -> None:
        client = self._connect()
        metrics = [r for r in batch if isinstance(r, _Metric)]
        tags = {r.key: r.value for r in batch if isinstance(r, _Tag)}
        from mlflow.entities import Metric, RunTag

        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics in one batch
            chunk = [Metric(m.key, m.value, m.timestamp_ms, m.step) for m in metrics[i : i + 1000]]
            client.log_batch(self.run_id, metrics=chunk, synchronous=True)
        if tags:
            client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)
        self.sent += len(metrics) + len(tags)
        for param in (r for r in batch if isinstance(r, _Param)):
            self._log_param(client, param)
        for item in batch:
            if isinstance(item, _Export):
                self._export(client, item)
            elif isinstance(item, _Document):
                client.log_dict(self.run_id, item.content, item.name)
            elif isinstance(item, tuple) and item[0] == "end":
                client.set_terminated(self.run_id, str(item[1]))

    def _log_param(self, client: Any, param: _Param) -> None:
        from mlflow.exceptions import MlflowException

        name = metric_name(self.settings.param_name(param.name))
        try:
            client.log_param(self.run_id, name, param.value)
        except MlflowException as e:  # a resumed attempt that resolved another value: the first one stays
            self._say(f"parameter {name} stays as the first attempt logged it ({_short(e)})")

    def _connect(self) -> Any:
        if self._client is None:
            try:
                from mlflow.tracking import MlflowClient
            except ImportError as e:
                raise RuntimeError(f"{NOT_INSTALLED} ({e})") from e

            self._client = MlflowClient(tracking_uri=self.settings.uri, registry_uri=self.settings.uri)
        if not self.run_id:
            self.experiment_id, self.run_id, resumed = resolve_run(self._client, self.settings, self.params)
            self._say("", announce=True)
            if resumed:
                print(f"fsdp_train: tracking continues MLflow run {self.run_id}", flush=True)
        return self._client

    def _export(self, client: Any, export: _Export) -> None:
        local = export.path.removeprefix("file://") if export.path.startswith(("/", "file://")) else None
        size = _size(Path(local)) if local is not None else None
        source = export.path
        if local is not None and size is not None and size <= UPLOAD_LIMIT_BYTES:
            client.log_artifacts(self.run_id, local, artifact_path="export")
            source = f"{client.get_run(self.run_id).info.artifact_uri.rstrip('/')}/export"
            if (Path(local) / MERGED_DIR).is_dir():  # a LoRA export with its merged model: that is the version
                source = f"{source}/{MERGED_DIR}"
        client.set_tag(self.run_id, "export.uri", export.path[:5000])
        client.set_tag(self.run_id, "export.step", str(export.step))
        name = self.settings.registered_model
        if name and export.path.rstrip("/").split("/")[-1].startswith("step_"):
            return  # an intermediate export (output.everyCheckpoint): only the final one becomes a version
        if name:
            from mlflow.exceptions import MlflowException

            try:
                client.create_registered_model(name)
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            client.create_model_version(name, source, run_id=self.run_id, tags={"export.uri": export.path[:5000]})

    def _say(self, problem: str, *, announce: bool = False) -> None:
        """A signed ``Tracking`` event when the tracker's state changes (or the run is first known)."""
        if problem == self.problem and not announce:
            return
        self.problem = problem
        events.emit(Tracking(rank=self.rank, run_id=self.run_id, url=self.url, problem=problem))

    @property
    def url(self) -> str:
        if not (self.run_id and self.settings.is_server):
            return ""
        return f"{self.settings.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"


def _size(path: Path) -> int | None:
    try:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else None
    except OSError:
        return None


def run_filter(settings: Settings) -> str:
    """MLflow's search filter for the run of the job's uid and generation (the uid checked by `Settings`)."""
    return f"tags.`{UID_TAG}` = '{settings.uid}' and tags.`{GENERATION_TAG}` = '{settings.generation}'"


def resolve_run(client: Any, settings: Settings, params: Callable[[], Mapping[str, str]]) -> tuple[str, str, bool]:
    """(experiment id, run id, resumed): the run of this job's uid and generation, made when there is none."""
    from mlflow.entities import Param, RunStatus
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(settings.experiment)
    if experiment is None:
        try:
            experiment_id = client.create_experiment(settings.experiment, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
        except MlflowException:  # made meanwhile by another job
            experiment_id = client.get_experiment_by_name(settings.experiment).experiment_id
    else:
        experiment_id = experiment.experiment_id
        if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):  # never another kind someone chose
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    if settings.uid:
        found = client.search_runs(
            [experiment_id],
            filter_string=run_filter(settings),
            max_results=1,
            order_by=["attributes.start_time ASC"],
        )
        if found:
            run_id = found[0].info.run_id
            client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            client.set_tag(run_id, ATTEMPT_TAG, str(settings.attempt))
            return experiment_id, run_id, True
    tags = {JOB_TAG: settings.job, ATTEMPT_TAG: str(settings.attempt)}
    if settings.uid:
        tags.update({UID_TAG: settings.uid, GENERATION_TAG: str(settings.generation)})
    run = client.create_run(experiment_id, run_name=settings.run_name, tags=tags)
    run_id = run.info.run_id
    items = [Param(k, v) for k, v in sorted(params().items())]
    for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters in one batch
        client.log_batch(run_id, params=items[i : i + 100], synchronous=True)
    return experiment_id, run_id, False


def start(
    raw: Mapping[str, Any] | None,
    train: Mapping[str, Any],
    *,
    world_size: int,
    rank: int,
    learning_rate: Callable[[int], float] | None = None,
    fingerprint: Callable[[], str] | None = None,
) -> Tracker | None:
    """Rank 0's tracker for the entrypoint's ``tracking`` config `raw`, started; None on other ranks or without one."""
    if not raw or rank != 0:
        return None
    try:
        settings = Settings.from_dict(dict(raw))

        def params() -> dict[str, str]:
            return job_params(settings, train, world_size=world_size, fingerprint=fingerprint() if fingerprint else "")

        return Tracker(settings, params=params, learning_rate=learning_rate, rank=rank).start()
    except Exception as e:  # a tracker that cannot start is a Warning, never the job's failure
        events.emit(Tracking(rank=rank, problem=f"tracking could not start: {_short(e)}"))
        return None


def data_fingerprint(train: Mapping[str, Any], world_size: int) -> str:
    """A short digest of what decides the run's trajectory, the data files' names and sizes included."""
    import hashlib

    from fsdp_train.contract.config import TrainConfig
    from fsdp_train.datapath.fingerprint import run_fingerprint

    values = run_fingerprint(TrainConfig.from_dict(dict(train)), world_size)
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def job_params(
    settings: Settings, train: Mapping[str, Any], *, world_size: int, fingerprint: str = ""
) -> dict[str, str]:
    """The run's parameters: the resolved training config, model, data source and fingerprint, world size,
    instance type and the operator's version."""
    # Named as in the spec where a spec field sets them (`training.seqLen`), else as the function's (`train.*`); the
    # values the ranks resolve (`auto`, fp32 on a CPU) come from their `Resolved` event (`RESOLVED_ON_RANKS`).
    params: dict[str, str] = {}
    for key, value in train.items():
        if key not in RESOLVED_ON_RANKS:
            params.update(flat_params("", {settings.param_name(key): value}))
    params.update(
        {
            "model": str(train.get("model", "")),
            "data.source": str(train.get("data", "")),
            "world_size": str(world_size),
            "instance_type": settings.instance_type or "",
            "operator_version": settings.operator_version or "",
            "job": settings.job,
        }
    )
    if fingerprint:
        params["fingerprint"] = fingerprint
    return {k: v for k, v in params.items() if v != ""}


def finish_run(settings: Settings, status: str, timeout: float = CLOSE_SECONDS) -> None:
    """From the driver: mark this generation's run ended, when there is one (a user function's run, which Ray
    Train's controller logs to and cannot close). Waits at most `timeout`; any failure is only printed."""

    def end() -> None:
        try:
            for name, value in CLIENT_ENV.items():
                os.environ.setdefault(name, value)
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=settings.uri)
            experiment = client.get_experiment_by_name(settings.experiment)
            if experiment is None or not settings.uid:
                return
            found = client.search_runs(
                [experiment.experiment_id],
                filter_string=run_filter(settings),
                max_results=1,
            )
            if found:
                client.set_terminated(found[0].info.run_id, status)
        except Exception as e:  # the job's outcome is Ray's, not the tracker's
            print(f"fsdp_train: could not mark the MLflow run {status}: {_short(e)}", flush=True)

    thread = threading.Thread(target=end, daemon=True)
    thread.start()
    thread.join(timeout)
