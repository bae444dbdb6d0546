"""spec.tracking: its validation, what it renders (the entrypoint's config, the egress rule), the status it folds to,
and the training side's tracker against a tracker that is not there."""

from __future__ import annotations

import copy
import io
import socket
import time
from contextlib import redirect_stdout
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import pytest
from fsdp_operator.api import render
from fsdp_operator.api.spec import SpecError, parse_job
from fsdp_operator.decide import tracking as tracking_status
from fsdp_operator.decide.summary import summary_lines
from fsdp_train.contract import events
from fsdp_train.contract.events import Tracking, parse_line
from fsdp_train.watch import tracking
from hypothesis import given, settings
from hypothesis import strategies as st

BASE: dict[str, Any] = {
    "apiVersion": "fsdp.dev/v1alpha1",
    "kind": "FSDPTrainingJob",
    "metadata": {"name": "qwen", "namespace": "team-a", "uid": "0b0e6f4c-1d2e-4f5a-9b8c-7d6e5f4a3b2c", "generation": 3},
    "spec": {},
}


def job_with(mlflow: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(BASE)
    manifest["spec"].update(spec)
    if mlflow is not None:
        manifest["spec"]["tracking"] = {"mlflow": mlflow}
    return manifest


def problems(manifest: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_job(manifest)
    return e.value.problems


@pytest.mark.parametrize(
    "uri",
    [
        "http://mlflow.mlflow.svc:5000",
        "https://mlflow.example.com",
        "https://mlflow.example.com/prefix/",
        "http://10.0.4.7:5000",
        "http://[2001:db8::7]:5000",
        "http://127.0.0.1:5000",
    ],
)
def test_tracking_uris_that_are_accepted(uri: str) -> None:
    job = parse_job(job_with({"trackingUri": uri}))
    assert job.spec.tracking.mlflow is not None and job.spec.tracking.mlflow.tracking_uri == uri


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("http://user:hunter2@mlflow:5000", "must not carry credentials"),
        ("https://s3cr3t@mlflow", "must not carry credentials"),
        ("http://169.254.169.254/latest", "link-local host"),
        ("http://[fe80::1]:5000", "link-local host"),
        ("http://[fd00:ec2::254]/", "link-local host"),
        ("http://[fd00:ec2::23]:80/", "link-local host"),
        ("http://[::ffff:169.254.169.254]/", "link-local host"),
        ("http://0.0.0.0:5000", "unspecified"),
        ("ftp://mlflow", "must start with http://"),
        ("databricks", "must start with http://"),
        ("HTTP://mlflow", "must start with http://"),
        ("http://mlflow:5000?x=1", "query or fragment"),
        ("http://mlflow:5000/#/x", "query or fragment"),
        ("http://mlflow:99999", "not a well-formed URI"),
        ("http://mlflow:0", "port 0"),
        ("http://", "has no host"),
        ("http://mlflow/a/../b", "'..'"),
        ("http://mlflow 5000", "white space"),
        ("http://ml\u202eflow", "invisible format character"),
        ("http://mlflow\x00", "NUL character"),
        ("http://-bad-.host", "neither a DNS name"),
        ("/etc/mlruns", "a directory of the system"),
        ("file://host/mlruns", "file:///path"),
        ("relative/mlruns", "must start with http://"),
    ],
)
def test_hostile_tracking_uris_are_refused_naming_the_field(uri: str, says: str) -> None:
    found = problems(job_with({"trackingUri": uri}))
    assert len(found) == 1 and found[0].startswith("spec.tracking.mlflow.trackingUri: "), found
    assert says in found[0], found
    assert "hunter2" not in found[0] and "s3cr3t" not in found[0]  # a credential is never repeated


def test_a_tracking_uri_is_required_and_fields_are_known() -> None:
    assert problems(job_with({})) == ["spec.tracking.mlflow.trackingUri: required"]
    assert (
        "spec.tracking.mlflow.token: unknown field" in problems(job_with({"trackingUri": "http://m", "token": "x"}))[0]
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("registeredModel", "team/model", "must not contain '/'"),
        ("registeredModel", "a:b", "must not contain ':'"),
        ("experiment", " padded", "white space"),
        ("experiment", "two\nlines", "one line"),
        ("runName", "r" * 251, "longer than 250"),
        ("experiment", "e" * 501, "longer than 500"),
        ("runName", "bidi\u202e", "invisible"),
    ],
)
def test_mlflow_names_are_checked(field: str, value: str, says: str) -> None:
    found = problems(job_with({"trackingUri": "http://m", field: value}, output={"storage": "s3://bucket/x"}))
    assert any(p.startswith(f"spec.tracking.mlflow.{field}: ") and says in p for p in found), found


def test_credentials_come_only_by_reference() -> None:
    plain = job_with({"trackingUri": "https://m"}, env=[{"name": "MLFLOW_TRACKING_TOKEN", "value": "abc"}])
    (found,) = problems(plain)
    assert found.startswith("spec.env[0].value: MLFLOW_TRACKING_TOKEN is a credential") and "abc" not in found
    in_ray = job_with(runtimeEnv={"envVars": {"MLFLOW_TRACKING_PASSWORD": "pw"}})
    assert problems(in_ray)[0].startswith("spec.runtimeEnv.envVars.'MLFLOW_TRACKING_PASSWORD': a credential")
    ref = {"secretKeyRef": {"name": "mlflow", "key": "token"}}
    job = parse_job(job_with({"trackingUri": "https://m"}, env=[{"name": "MLFLOW_TRACKING_TOKEN", "valueFrom": ref}]))
    assert job.spec.env[0]["valueFrom"] == ref


def test_settings_the_tracking_block_owns_are_refused_elsewhere() -> None:
    found = problems(job_with({"trackingUri": "https://m"}, env=[{"name": "MLFLOW_TRACKING_URI", "value": "x"}]))
    assert found == ["spec.env: 'MLFLOW_TRACKING_URI' contradicts spec.tracking.mlflow; set the tracker there only"]


def test_a_registered_model_needs_an_export_and_a_file_store_needs_shared_storage() -> None:
    (found,) = problems(job_with({"trackingUri": "https://m", "registeredModel": "qwen"}))
    assert found == "spec.tracking.mlflow.registeredModel: set, but spec.output.storage is empty (there is no export)"
    (found,) = problems(job_with({"trackingUri": "/data/mlruns"}))
    assert found.startswith("spec.tracking.mlflow.trackingUri: '/data/mlruns' is a file store on one pod's own disk")
    shared = {"claimName": "efs", "mountPath": "/data"}
    assert parse_job(job_with({"trackingUri": "file:///data/mlruns"}, sharedVolume=shared)).spec.tracking.mlflow


def test_the_entrypoint_carries_the_tracking_config_with_its_defaults() -> None:
    job = parse_job(job_with({"trackingUri": "http://10.0.4.7:5000"}))
    config = render.submission(job, render.submission_id(job.name, job.uid, 2), "/pkg").config["tracking"]
    assert config["uri"] == "http://10.0.4.7:5000" and config["experiment"] == "team-a"
    assert config["run_name"] == "team-a/qwen attempt 2" and config["attempt"] == 2
    assert (config["uid"], config["generation"], config["job"]) == (job.uid, 3, "team-a/qwen")
    assert tracking.Settings.from_dict(config).uri == config["uri"]  # the training side reads what is rendered
    assert "tracking" not in render.submission(parse_job(job_with()), "qwen-1", "/pkg").config


def test_the_network_policy_opens_the_trackers_port() -> None:
    def egress(uri: str | None) -> list[dict[str, Any]]:
        job = parse_job(job_with({"trackingUri": uri} if uri else None))
        rules: list[dict[str, Any]] = render.network_policy(job, render.Security())["spec"]["egress"]
        return rules

    plain = egress(None)
    assert egress("https://mlflow.example.com") == plain  # HTTPS goes anywhere but link-local already
    by_address = egress("http://10.0.4.7:5000")
    assert by_address[: len(plain)] == plain
    assert by_address[len(plain) :] == [
        {"to": [{"ipBlock": {"cidr": "10.0.4.7/32"}}], "ports": [{"protocol": "TCP", "port": 5000}]}
    ]
    (by_name,) = egress("http://mlflow.mlflow.svc")[len(plain) :]
    assert by_name["ports"] == [{"protocol": "TCP", "port": 80}]
    assert by_name["to"] == plain[2]["to"]  # anywhere but link-local addresses, as HTTPS


def test_tracking_events_fold_into_the_status_and_the_summary() -> None:
    url = "http://m:5000/#/experiments/1/runs/abc123"
    found = tracking_status.fold({}, Tracking(rank=0, run_id="abc123", url=url))
    assert found == {"runId": "abc123", "url": url}
    failing = tracking_status.fold(found, Tracking(rank=0, run_id="abc123", url=url, problem="refused\u202e"))
    assert failing["problem"] == "refused\\u202e"
    assert tracking_status.condition("refused")["status"] == "False"
    assert tracking_status.fold(failing, Tracking(rank=0, run_id="abc123", url=url)) == found
    # A malformed id or a URL that is not http(s) never reaches the status.
    assert tracking_status.fold({}, Tracking(rank=0, run_id="a b", url="javascript:x")) == {}
    assert tracking_status.fold({}, Tracking(rank=0, run_id="abc", url="http://x\x1b[2J")) == {"runId": "abc"}
    lines = summary_lines({"tracking": failing})
    assert f"tracking   MLflow run abc123 {url} (not logging: refused\\u202e)" in lines


def test_each_event_becomes_records_of_the_run() -> None:
    step = events.Step(
        rank=0, step=7, total_steps=9, loss=2.5, tokens_per_second=100.0, tokens_per_second_per_device=25.0, mfu=0.5,
        extra={"grad_norm": 0.25},
    )  # fmt: skip
    records = tracking.records_of(step, learning_rate=lambda s: s / 100)
    metrics = {r.key: (r.value, r.step) for r in records if isinstance(r, tracking._Metric)}
    assert metrics["loss"] == (2.5, 7) and metrics["learning_rate"] == (0.07, 7) and metrics["mfu"] == (0.5, 7)
    assert metrics["grad_norm"] == (0.25, 7)  # the bundled function's, before clipping
    diverged = events.Step(
        rank=0, step=8, total_steps=9, loss=None, tokens_per_second=None, tokens_per_second_per_device=None
    )
    assert not any(r.key == "loss" for r in tracking.records_of(diverged) if isinstance(r, tracking._Metric))
    user = events.Step(
        rank=0, step=1, total_steps=0, loss=1.0, tokens_per_second=None, tokens_per_second_per_device=None,
        extra={"grad norm!": 0.5, "accuracy": 0.9},
    )  # fmt: skip
    names = {r.key for r in tracking.records_of(user) if isinstance(r, tracking._Metric)}
    assert {"grad norm_", "accuracy", "loss"} <= names
    transport = tracking.records_of(events.Transport(rank=3, transport="efa"))
    assert transport == [tracking._Tag("nccl.transport.rank3", "efa")]


@pytest.mark.parametrize(
    "raw",
    [
        "not a mapping",
        {"uri": "http://m", "experiment": "e"},
        {"uri": "http://m", "experiment": "e", "run_name": "r", "attempt": "2"},
        {"uri": "http://m", "experiment": "e", "run_name": "r", "uid": "x' or '1'='1"},
        {"uri": "http://m", "experiment": "e", "run_name": "r", "extra": 1},
    ],
)
def test_a_malformed_tracking_config_is_refused(raw: Any) -> None:
    with pytest.raises(ValueError, match="tracking"):
        tracking.Settings.from_dict(raw)


def test_a_tracker_that_is_not_there_never_holds_training_and_says_so() -> None:
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = {"uri": f"http://127.0.0.1:{port}", "experiment": "e", "run_name": "r", "uid": "u-1", "generation": 1}
    out = io.StringIO()
    with redirect_stdout(out):
        tracker = tracking.start(settings, {"steps": 3}, world_size=1, rank=0)
        assert tracker is not None
        started = time.monotonic()
        for step in range(1, 200):
            events.emit(
                events.Step(
                    rank=0,
                    step=step,
                    total_steps=199,
                    loss=1.0,
                    tokens_per_second=None,
                    tokens_per_second_per_device=None,
                )
            )
        emitting = time.monotonic() - started
        tracker.close(timeout=60)
    assert emitting < 2.0  # the steps never wait on the tracker
    said = [e for e in map(parse_line, out.getvalue().splitlines()) if isinstance(e, Tracking)]
    assert said and said[0].problem and not said[0].run_id, out.getvalue()[-2000:]
    assert tracker.on_event not in events.LISTENERS
    assert tracking.start(settings, {}, world_size=2, rank=1) is None  # rank 0 only


def test_now_is_not_used_for_times_no_clock_shows() -> None:
    event = events.Evaluation(rank=0, step=1, loss=1.0, time=float("nan"))
    (record,) = tracking.records_of(event)
    assert isinstance(record, tracking._Metric) and record.timestamp_ms > datetime(2020, 1, 1, tzinfo=UTC).timestamp()


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=80),
        st.builds(
            lambda s, rest: s + rest,
            st.sampled_from(["http://", "https://", "file://", "/", "HTTP://"]),
            st.text(max_size=60),
        ),
    )
)
def test_any_tracking_uri_is_accepted_clean_or_refused_naming_the_field(uri: str) -> None:
    try:
        job = parse_job(job_with({"trackingUri": uri}))
    except SpecError as e:
        assert e.problems and all(p.startswith("spec.") for p in e.problems), e.problems
        return
    mlflow = job.spec.tracking.mlflow
    assert mlflow is not None
    accepted = mlflow.tracking_uri
    assert accepted.startswith(("http://", "https://", "file:///", "/"))
    assert "@" not in urlsplit(accepted).netloc and not urlsplit(accepted).query  # no credentials, no query
    assert not any(c.isspace() or ord(c) < 32 for c in accepted) and ".." not in accepted.split("/")


def test_the_runs_parameters_are_named_as_in_the_spec_and_the_resolved_ones_are_what_ran() -> None:
    """`train.min_cross_node_gbps = 25.0` read as the spec's network floor, and `train.precision = bf16` was logged for
    a CPU job that ran in fp32: every parameter a spec field sets is named by that field, the function's own settings
    stay `train.*`, and precision and sharding come from rank 0's `Resolved` event, as the ranks resolved them."""
    job = parse_job(job_with({"trackingUri": "http://10.0.4.7:5000"}))
    submission = render.submission(job, render.submission_id(job.name, job.uid, 1), "/pkg")
    settings = tracking.Settings.from_dict(submission.config["tracking"])
    train = submission.config["train"]
    params = tracking.job_params(settings, train, world_size=8)
    assert params["training.seqLen"] == str(train["seq_len"]) and params["training.steps"] == str(train["steps"])
    assert params["model.name"] == train["model"] and "train.seq_len" not in params
    kept = {k for k, v in train.items() if k not in tracking.RESOLVED_ON_RANKS and v != ""}  # "" is left out
    named = {settings.param_names.get(k) or f"train.{k}" for k in kept}
    meta = {"model", "world_size", "instance_type", "operator_version", "job"}
    assert {name.split(".overrides.")[0] for name in params} - meta == named
    assert not {"training.precision", "training.sharding", "train.precision", "train.sharding"} & set(params)
    before = events.Resolved(rank=0, sharding="hybrid", precision="fp32")  # rank 0's, before its first step
    resolved = [r for r in tracking.records_of(before) if isinstance(r, tracking._Param)]
    assert [(r.name, r.value) for r in resolved] == [("precision", "fp32"), ("sharding", "hybrid")]
    summary = events.Summary(rank=0, steps=3, final_loss=1.0, first_loss=2.0, tokens_per_second=1.0, sharding="hybrid",
                             precision="fp32")  # fmt: skip
    assert not [r for r in tracking.records_of(summary) if isinstance(r, tracking._Param)]  # logged once, earlier
    assert settings.param_names["precision"] == "training.precision"
    with pytest.raises(ValueError, match="param_names"):
        tracking.Settings.from_dict({**submission.config["tracking"], "param_names": {"x": 1}})


def test_a_non_finite_figure_never_reaches_mlflow() -> None:
    """MLflow refuses a batch with a NaN or an infinite metric (and the whole batch is lost): such a figure is left
    out, every finite one of the same event is kept."""
    step = events.Step(rank=0, step=3, total_steps=10, loss=float("nan"), tokens_per_second=float("inf"),
                       tokens_per_second_per_device=5.0, mfu=float("-inf"), step_seconds=0.25,
                       extra={"grad_norm": float("nan"), "kept": 1.5})  # fmt: skip
    recorded = {r.key: r.value for r in tracking.records_of(step, learning_rate=lambda s: float("inf"))}
    assert recorded == {"tokens_per_second_per_device": 5.0, "step_seconds": 0.25, "kept": 1.5}
    summary = events.Summary(rank=0, steps=10, final_loss=float("nan"), first_loss=1.0, tokens_per_second=float("inf"))
    figures = [r for r in tracking.records_of(summary) if isinstance(r, tracking._Metric)]
    assert [r.key for r in figures] == ["run_seconds"]  # final loss NaN, rate infinite, no MFU: left out


def test_a_new_runs_url_never_keeps_the_previous_runs() -> None:
    """A new generation's run without a URL (a file store) must not be linked to the run before it."""
    first = tracking_status.fold(
        {}, Tracking(rank=0, run_id="run1", url="http://mlflow:5000/#/experiments/1/runs/run1")
    )
    assert first == {"runId": "run1", "url": "http://mlflow:5000/#/experiments/1/runs/run1"}
    second = tracking_status.fold(first, Tracking(rank=0, run_id="run2", url=""))
    assert second == {"runId": "run2"}
    again = tracking_status.fold(second, Tracking(rank=0, run_id="run2", url="not a url"))
    assert again == {"runId": "run2"}
    same = tracking_status.fold(first, Tracking(rank=0, run_id="run1", url=""))
    assert same["url"] == first["url"]  # the same run's URL stays when a later word of it carries none


def test_the_tracking_condition_says_what_the_tracker_said_within_its_bounds() -> None:
    """TrackingHealthy word for word: a Warning with the tracker's problem (hidden characters escaped, at most 900 of
    it), or True once records flow; status.tracking.problem keeps at most 1,000 characters of it."""
    assert tracking_status.condition("") == {
        "type": "TrackingHealthy", "status": "True", "reason": "Logging", "message": "records reach the tracker"
    }  # fmt: skip
    assert tracking_status.condition("refused\u202e") == {
        "type": "TrackingHealthy", "status": "False", "reason": "TrackerUnreachable",
        "message": "the tracker did not take the run's records (training goes on): refused\\u202e",
    }  # fmt: skip
    long = tracking_status.condition("p" * 2000)["message"]
    assert long == "the tracker did not take the run's records (training goes on): " + "p" * 900
    folded = tracking_status.fold({}, Tracking(rank=0, run_id="r1", problem="q" * 2000))
    assert folded["problem"] == "q" * 1000
