"""spec.trainFunction: what the parser accepts and refuses (each problem named by its path), the schema the CRD
carries for it, and the submission it becomes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fsdp_operator.api import generate, render, schema, train_function
from fsdp_operator.api.spec import Job, SpecError, parse_job
from fsdp_operator.api.train_function import MAX_CONFIG_BYTES
from fsdp_operator.api.training_spec import MAX_STEPS
from fsdp_operator.decide.observed import RAY_FAILED, RAY_RUNNING, ClusterView, Observed, RayJobInfo
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import Phase, Reason
from fsdp_train.contract.events import Event, parse_lines
from fsdp_train.run.ray_entry import RayJobConfig
from fsdp_train.run.user_function import events_from_report, failure
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.running_job import NOW, first_attempt_running

ROOT = Path(__file__).resolve().parents[2]
CPU_WORKERS = {"replicas": 2, "instanceType": "", "gpusPerWorker": 0, "efaPerWorker": 0, "ranksPerWorker": 2}
FUNCTION = {"callable": "tinygpt.train:train_func", "code": "/opt/byo", "config": {"steps": 3, "model": {"n_layer": 2}}}


def manifest(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": "byo"}, "spec": spec}


def base(**extra: Any) -> dict[str, Any]:
    return {"workers": CPU_WORKERS, "network": {"transport": "socket"}, "trainFunction": FUNCTION, **extra}


def problems(spec: dict[str, Any]) -> list[str]:
    try:
        parse_job(manifest(spec))
    except SpecError as e:
        return e.problems
    return []


def job(spec: dict[str, Any]) -> Job:
    parsed = parse_job(manifest(spec))
    return Job(parsed.name, "ml", "uid-1", 1, parsed.spec)


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").rglob("*.yaml")))
def test_every_example_parses(path: str) -> None:
    parse_job(yaml.safe_load((ROOT / path).read_text()))


def test_a_function_job_takes_what_the_operator_needs() -> None:
    spec = base(
        training={"checkpoint": {"storage": "s3://bucket/ckpt"}, "probeSizeBytes": 1024},
        runtimeEnv={"pip": ["einops==0.8.0"]},
        runPolicy={"maxWorkerRestarts": 2},
    )
    parsed = job(spec).spec
    assert parsed.train_function is not None and parsed.train_function.config == FUNCTION["config"]
    assert parsed.train_function.callable == "tinygpt.train:train_func"
    assert job(base()).spec.train_function is not None
    assert job({"workers": CPU_WORKERS, "network": {"transport": "socket"}}).spec.train_function is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", {"name": "Qwen/Qwen2.5-0.5B"}),
        ("model", {"init": "random"}),
        ("data", {"source": "s3://bucket/data.jsonl"}),
        ("output", {"storage": "s3://bucket/out"}),
        ("training", {"steps": 5}),
        ("training", {"learningRate": 0.1}),
        ("training", {"checkpoint": {"intervalSteps": 5, "storage": "s3://bucket/ckpt"}}),
    ],
)
def test_the_bundled_functions_fields_are_refused_each_by_its_path(field: str, value: dict[str, Any]) -> None:
    spec = base(**{field: value})
    found = problems(spec)
    key, inner = next(iter(value.items()))
    leaf = f"{key}.{next(iter(inner))}" if isinstance(inner, dict) and key == "checkpoint" else key
    if key == "checkpoint":
        leaf = "checkpoint.intervalSteps"
    assert found == [
        f"spec.{field}.{leaf}: set, but spec.trainFunction runs your own function, which does not read it "
        "(remove it, or pass it in trainFunction.config)"
    ]
    # Without trainFunction the same fields are the bundled function's settings.
    spec.pop("trainFunction")
    assert not [p for p in problems(spec) if "trainFunction" in p]


def test_every_bundled_field_set_is_named() -> None:
    spec = base(model={"name": "Qwen/Qwen2.5-0.5B"}, data={"kind": "chat"}, training={"steps": 5, "seqLen": 64})
    assert [p.split(":")[0] for p in problems(spec)] == [
        "spec.model.name",
        "spec.training.steps",
        "spec.training.seqLen",
        "spec.data.kind",
    ]


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ({"code": "/opt"}, "spec.trainFunction.callable: required"),
        ({"callable": "train"}, "spec.trainFunction.callable: 'train' must be package.module:function"),
        ({"callable": "pkg.mod:fn()"}, "must be package.module:function"),
        ({"callable": "pkg.1mod:fn"}, "must be package.module:function"),
        ({"callable": "os:system; rm -rf /"}, "must be package.module:function"),
        ({"callable": "a:b", "code": "relative/dir"}, "must be an absolute directory or an s3:// or gs:// URI"),
        ({"callable": "a:b", "code": "https://example.com/c.zip"}, "must be an absolute directory or an s3://"),
        ({"callable": "a:b", "code": "s3://bucket/code"}, "must name a .zip file"),
        ({"callable": "a:b", "code": "s3://user:pw@bucket/c.zip"}, "must not carry credentials"),
        ({"callable": "a:b", "code": "/opt/../etc"}, "must not contain '..' segments"),
        ({"callable": "a:b", "config": [1, 2]}, "spec.trainFunction.config: expected object, got array"),
        ({"callable": "a:b", "config": {"x": "y" * MAX_CONFIG_BYTES}}, "spec.trainFunction.config: 32"),
        ({"callable": "a:b", "config": {"x": float("nan")}}, "spec.trainFunction.config.x: nan is not a JSON number"),
        ({"callable": "a:b", "config": {"a": [1, {"b": "x\x00"}]}}, "spec.trainFunction.config.a[1].b: contains a NUL"),
        ({"callable": "a:b", "config": {"a": {"k\u202e": 1}}}, "spec.trainFunction.config.a: a key contains the"),
        (
            {"callable": "a:b", "config": {"when": __import__("datetime").date(2026, 1, 1)}},
            "spec.trainFunction.config.when: a value of type date is not JSON",
        ),
        ({"callable": "a:b", "unknown": 1}, "spec.trainFunction.unknown: unknown field"),
    ],
)
def test_a_bad_function_is_refused_with_its_path(function: dict[str, Any], message: str) -> None:
    found = problems(base(trainFunction=function))
    assert len(found) == 1 and message in found[0], found


def test_config_nested_too_deep_is_refused() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(40):
        node["n"] = {}
        node = node["n"]
    assert problems(base(trainFunction={"callable": "a:b", "config": deep})) == [
        "spec.trainFunction.config: nested deeper than 32 levels"
    ]


def _nested(levels: int, container: str) -> dict[str, Any]:
    """A config whose deepest value sits `levels` levels below the config itself, through maps or lists."""
    value: Any = 1
    for _ in range(levels if container == "map" else levels - 1):
        value = {"n": value} if container == "map" else [value]
    return value if container == "map" else {"n": value}


@pytest.mark.parametrize("container", ["map", "list"])
def test_config_nesting_is_bounded_exactly_at_its_limit(container: str) -> None:
    """MAX_CONFIG_DEPTH levels pass, one more does not: the bound is `>`, not `>=` (nor an off-by-one either way)."""
    limit = train_function.MAX_CONFIG_DEPTH
    at_limit = _nested(limit, container)
    assert problems(base(trainFunction={"callable": "a:b", "config": at_limit})) == []
    assert problems(base(trainFunction={"callable": "a:b", "config": _nested(limit + 1, container)})) == [
        f"spec.trainFunction.config: nested deeper than {limit} levels"
    ]


def test_the_crd_keeps_config_free_form_and_structural() -> None:
    spec_schema = generate.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    function = spec_schema["properties"]["trainFunction"]
    assert function["required"] == ["callable"] and "default" not in function
    config = function["properties"]["config"]
    assert config["type"] == "object"
    assert config["additionalProperties"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert function["properties"]["callable"]["pattern"].startswith("^")


def test_the_submission_runs_the_function_with_its_config_and_probe() -> None:
    shared = {"claimName": "shared", "mountPath": "/shared"}
    j = job(base(training={"probeSizeBytes": 2048, "checkpoint": {"storage": "/shared/ckpt"}}, sharedVolume=shared))
    sub = render.submission(j, "sid-1", "/opt/pkg/fsdp_train")
    assert sub.config["function"] == {
        "callable": "tinygpt.train:train_func",
        "code": "/opt/byo",
        "config": FUNCTION["config"],
        "probe_size_bytes": 2048,
    }
    assert sub.config["storage_path"] == "/shared/ckpt"
    assert "working_dir" not in sub.runtime_env  # a directory on every node: the wrapper puts it on the path
    # The entrypoint's JSON is what the entrypoint parses back.
    argument = shlex.split(sub.entrypoint)[-1]
    parsed = RayJobConfig.from_dict(json.loads(argument))
    assert parsed.function is not None and parsed.function.config == FUNCTION["config"]
    assert parsed.run_storage == "/shared/ckpt"


def test_remote_code_goes_to_rays_runtime_environment() -> None:
    j = job(base(trainFunction={**FUNCTION, "code": "gs://bucket/code/tinygpt.zip"}))
    sub = render.submission(j, "sid-1", "/opt/pkg/fsdp_train")
    assert sub.runtime_env["working_dir"] == "gs://bucket/code/tinygpt.zip"
    assert sub.config["function"]["code"] == ""
    assert sub.runtime_env["py_modules"] == ["/opt/pkg/fsdp_train"]


def test_without_a_function_the_submission_is_unchanged() -> None:
    sub = render.submission(job({"workers": CPU_WORKERS, "network": {"transport": "socket"}}), "s", "/p")
    assert "function" not in sub.config and "working_dir" not in sub.runtime_env


# --- the status a function's reports make (one reconcile pass over its log) ---------------------------------

FUNCTION_JOB = {
    **manifest(base()),
    "metadata": {"name": "byo", "namespace": "ml", "uid": "u-1", "generation": 1},
}


def one_pass(events: list[Event], ray_status: str = RAY_RUNNING, ray_message: str = "") -> dict[str, Any]:
    lines = [f"(TrainController pid=7, ip=10.0.0.1) {e.to_line()}" for e in events]
    status = first_attempt_running("byo-ray", "byo-1", NOW)
    observed = Observed(
        now=NOW,
        cluster=ClusterView(name="byo-ray", state="ready", ready_workers=2, desired_workers=2, owner_uid="u-1"),
        ray_job=RayJobInfo("byo-1", ray_status, ray_message),
        events=tuple(parse_lines(lines)),
        log_offset=sum(len(line) + 1 for line in lines),
    )
    return reconcile(FUNCTION_JOB, status, observed, training_package="/opt/fsdp_train").status.to_dict()


def test_a_functions_reports_fill_the_progress_without_a_total_it_did_not_give() -> None:
    reported = [
        *events_from_report({"loss": 3.0, "grad_norm": 1.5}, reports=1, world_size=4, checkpoint_path=None),
        *events_from_report({"loss": 2.0, "eval_loss": 2.25, "tokens": 512}, reports=2, world_size=4,
                            checkpoint_path="s3://bucket/ckpt/byo/checkpoint_2"),
    ]  # fmt: skip
    status = one_pass(reported)
    progress = status["progress"]
    assert (progress["step"], progress["stepOfTotal"], progress["loss"]) == (2, "2", 2.0)
    assert "totalSteps" not in progress
    assert progress["lossHistory"] == [[1, 3.0], [2, 2.0]]
    assert (progress["evalLoss"], progress["evalStep"], progress["tokensSeen"]) == (2.25, 2, 512)
    assert "metrics" not in progress  # the last step reported no other number
    assert status["checkpoint"] == {"step": 2, "path": "s3://bucket/ckpt/byo/checkpoint_2", "seconds": 0.0}
    first = one_pass(reported[:1])["progress"]
    assert first["metrics"] == {"grad_norm": 1.5}
    crd = yaml.safe_load((ROOT / "crds" / "fsdptrainingjob.yaml").read_text())
    status_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    jsonschema.Draft7Validator(status_schema).validate(status)


@settings(max_examples=80, deadline=None, database=None)
@given(
    st.dictionaries(
        st.sampled_from(["loss", "tokens_per_second", "eval_loss", "grad_norm", "step"]),
        st.floats() | st.integers(-5, 10**6) | st.none() | st.text(max_size=3),
    )
)
def test_a_figure_a_function_does_not_report_is_absent_never_0_or_nan(metrics: dict[str, Any]) -> None:
    """No tokens_per_second: no tokensPerSecond (an empty TOKENS/S column), not 0; NaN nowhere in status."""
    loss = metrics.get("loss")
    # A negative loss is no cross-entropy: the step is refused whole (test_log_hostility), nothing to see here.
    assume(not (isinstance(loss, int | float) and loss < 0))
    reported = events_from_report(metrics, reports=1, world_size=4, checkpoint_path=None)
    assert "NaN" not in "".join(e.to_line() for e in reported)
    status = one_pass(reported)
    text = json.dumps(status, allow_nan=True)
    assert "NaN" not in text and "Infinity" not in text and "null" not in text
    if "progress" not in status:  # a step number no run can reach: the report is refused whole (folding._possible)
        assert isinstance(metrics.get("step"), int | float) and metrics["step"] > MAX_STEPS
        return
    progress = status["progress"]
    rate = metrics.get("tokens_per_second")
    given_rate = isinstance(rate, int | float) and not isinstance(rate, bool) and 0 <= rate < float("inf")
    if not given_rate:
        assert "tokensPerSecond" not in progress and "tokensPerSecondPerDevice" not in progress
    elif rate <= 1e15:  # past 2^53 a rate is no exact JSON integer: left out too (folding._whole)
        assert progress["tokensPerSecond"] == round(rate)


def test_a_function_that_raises_fails_the_job_with_its_exception() -> None:
    try:
        raise ValueError("loss went NaN at step 12")
    except ValueError as e:
        fail = failure(1, e)
    status = one_pass([fail], RAY_FAILED, "Job entrypoint command failed with exit code 1")
    assert status["phase"] == Phase.FAILED and status["reason"] == Reason.RAY_JOB_FAILED
    assert "rank 1: ValueError: loss went NaN at step 12 | at test_train_function.py:" in status["message"]
    assert status["rankFailures"][0]["message"] == fail.message
    assert status["rankFailures"][0]["reason"] == "ValueError"  # every failure has a reason
    assert "\n" not in status["message"] and len(status["message"]) <= 300


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=40,
)


@settings(max_examples=150, deadline=None, database=None)
@given(config=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5), target=st.text(max_size=30))
def test_any_config_and_callable_is_accepted_unchanged_or_refused_by_path(config: dict[str, Any], target: str) -> None:
    spec = base(trainFunction={"callable": target, "config": config})
    try:
        parsed = job(spec)
    except SpecError as e:
        assert e.problems and all(p.startswith("spec.trainFunction.") for p in e.problems), e.problems
        return
    sub = render.submission(parsed, "sid", "/p")
    arrived = RayJobConfig.from_dict(json.loads(shlex.split(sub.entrypoint)[-1])).function
    assert arrived is not None and arrived.config == config and arrived.callable == target


def test_a_malformed_function_does_not_hide_the_bundled_fields_it_refuses() -> None:
    """All problems at once, not in stages: the function's own and the fields it would not read."""
    spec = base(training={"steps": 7}, data={"source": "/x.jsonl"})
    spec["trainFunction"] = {"callable": "not a callable", "code": "relative/dir"}
    found = problems(spec)
    assert [p.split(":", 1)[0] for p in found] == [
        "spec.trainFunction.callable",
        "spec.trainFunction.code",
        "spec.training.steps",
        "spec.data.source",
    ]
    spec["workers"] = {"replicas": "two"}  # another group malformed too: said once, nothing invented
    assert sum("spec.workers.replicas" in p for p in problems(spec)) == 1
