"""An in-memory MLflow client: the calls `fsdp_train.watch.tracking` makes, with the limits a real server enforces.

What the tracker sends is kept per run (metrics by key as (step, value) lists, params, tags, documents, artifacts,
status) to be read back by the tests. Like MLflow: a batch over 1000 metrics or 100 params is refused, a param
logged again with another value raises, a registered model made twice raises RESOURCE_ALREADY_EXISTS. `down`
makes every call raise (a tracker that is not there) until it is set back to 0; each refused call counts it down.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, RESOURCE_ALREADY_EXISTS


@dataclass
class FakeRun:
    run_id: str
    experiment_id: str
    name: str
    tags: dict[str, str]
    status: str = "RUNNING"
    metrics: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    times: dict[str, list[int]] = field(default_factory=dict)
    """Each metric's timestamps (ms), in the order of `metrics`."""
    params: dict[str, str] = field(default_factory=dict)
    documents: dict[str, Any] = field(default_factory=dict)
    artifacts: list[tuple[str, str]] = field(default_factory=list)

    @property
    def info(self) -> SimpleNamespace:
        return SimpleNamespace(
            run_id=self.run_id, artifact_uri=f"mlflow-artifacts:/{self.experiment_id}/{self.run_id}/"
        )


@dataclass
class FakeMlflow:
    experiments: dict[str, SimpleNamespace] = field(default_factory=dict)
    runs: dict[str, FakeRun] = field(default_factory=dict)
    models: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    down: int = 0
    """Calls to refuse before answering again."""

    def _call(self) -> None:
        if self.down:
            self.down -= 1
            raise ConnectionError("the tracking server is not there")

    def get_experiment_by_name(self, name: str) -> SimpleNamespace | None:
        self._call()
        return self.experiments.get(name)

    def create_experiment(self, name: str, tags: dict[str, str] | None = None) -> str:
        self._call()
        if name in self.experiments:
            raise MlflowException(f"experiment {name} exists", error_code=RESOURCE_ALREADY_EXISTS)
        experiment_id = str(len(self.experiments) + 1)
        self.experiments[name] = SimpleNamespace(experiment_id=experiment_id, tags=dict(tags or {}))
        return experiment_id

    def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
        self._call()
        for experiment in self.experiments.values():
            if experiment.experiment_id == experiment_id:
                experiment.tags[key] = value

    def search_runs(
        self, experiment_ids: list[str], filter_string: str, max_results: int, order_by: list[str] | None = None
    ) -> list[FakeRun]:
        self._call()
        wanted = dict(re.findall(r"tags\.`([^`]+)` = '([^']*)'", filter_string))
        found = [
            run
            for run in self.runs.values()  # in creation order: the oldest first, as `start_time ASC` asks
            if run.experiment_id in experiment_ids and all(run.tags.get(k) == v for k, v in wanted.items())
        ]
        return found[:max_results]

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, str]) -> FakeRun:
        self._call()
        run = FakeRun(f"run{len(self.runs) + 1}", experiment_id, run_name, dict(tags))
        self.runs[run.run_id] = run
        return run

    def update_run(self, run_id: str, status: str) -> None:
        self._call()
        self.runs[run_id].status = status

    def set_terminated(self, run_id: str, status: str) -> None:
        self._call()
        self.runs[run_id].status = status

    def get_run(self, run_id: str) -> FakeRun:
        self._call()
        return self.runs[run_id]

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self._call()
        self.runs[run_id].tags[key] = value

    def log_batch(
        self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = (), synchronous: bool = True
    ) -> None:
        self._call()
        # Asynchronous logging would fail after the call returned: the sender could not count what was lost.
        assert synchronous is True, "the tracker logs synchronously"
        if len(metrics) > 1000 or len(params) > 100:
            raise MlflowException(
                "a batch holds at most 1000 metrics and 100 params", error_code=INVALID_PARAMETER_VALUE
            )
        run = self.runs[run_id]
        for m in metrics:
            run.metrics.setdefault(m.key, []).append((m.step, m.value))
            run.times.setdefault(m.key, []).append(m.timestamp)
        for p in params:
            self._param(run, p.key, p.value)
        for t in tags:
            run.tags[t.key] = t.value

    def log_param(self, run_id: str, key: str, value: str) -> None:
        self._call()
        self._param(self.runs[run_id], key, value)

    @staticmethod
    def _param(run: FakeRun, key: str, value: str) -> None:
        if run.params.get(key, value) != value:
            raise MlflowException(f"param {key} was {run.params[key]}", error_code=INVALID_PARAMETER_VALUE)
        run.params[key] = value

    def log_dict(self, run_id: str, content: Any, name: str) -> None:
        self._call()
        self.runs[run_id].documents[name] = content

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str) -> None:
        self._call()
        self.runs[run_id].artifacts.append((local_dir, artifact_path))

    def create_registered_model(self, name: str) -> None:
        self._call()
        if name in self.models:
            raise MlflowException(f"model {name} exists", error_code=RESOURCE_ALREADY_EXISTS)
        self.models[name] = []

    def create_model_version(self, name: str, source: str, run_id: str, tags: dict[str, str]) -> None:
        self._call()
        self.models[name].append({"source": source, "run_id": run_id, "tags": tags})


class HangingMlflow(FakeMlflow):
    """A tracker that takes a connection and never answers, until `answer` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = threading.Event()

    def get_experiment_by_name(self, name: str) -> SimpleNamespace | None:
        self.answer.wait()
        return super().get_experiment_by_name(name)
