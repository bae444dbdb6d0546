"""spec.tracking's refusals word for word: each says the field, the value and what to do, so a user fixes the
manifest from the message alone. (test_tracking.py holds which values are refused; this file holds what is said.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fsdp_operator.api.spec import SpecError, parse_job
from fsdp_operator.api.tracking_spec import EXPERIMENT_NAME, MODEL_NAME, RUN_NAME, TRACKING_URI, tracking_port

BASE: dict[str, Any] = {
    "apiVersion": "fsdp.dev/v1alpha1",
    "kind": "FSDPTrainingJob",
    "metadata": {"name": "qwen", "namespace": "team-a"},
    "spec": {},
}
FUNCTION = {"callable": "pkg.train:main", "code": "/srv/code"}


def job_with(mlflow: dict[str, Any], **spec: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(BASE)
    manifest["spec"].update(spec, tracking={"mlflow": mlflow})
    return manifest


def problems(manifest: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_job(manifest)
    return e.value.problems


URI = "spec.tracking.mlflow.trackingUri: "


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("http://m 1", "must not contain white space or control characters"),
        ("file:mlruns", "file: must be followed by an absolute path (file:///path)"),
        ("http://m:x", "is not a well-formed URI (http(s)://HOST[:PORT][/path])"),
        ("ftp://m", "must start with http://, https:// (a tracking server), file:/// or / (a file store)"),
        ("Http://m", "must start with http://, https:// (a tracking server), file:/// or / (a file store)"),
        ("http:m", "has no host (http://HOST[:PORT])"),
        ("https:///path", "has no host (https://HOST[:PORT])"),
        ("http://u@m", "must not carry credentials (user info); give MLFLOW_TRACKING_TOKEN through spec.env's "
                       "secretKeyRef"),
        ("http://m/?", "must not have a query or fragment"),
        ("http://m#", "must not have a query or fragment"),
        ("http://m?a", "must not have a query or fragment"),
        ("http://m/#f", "must not have a query or fragment"),
        ("http://m:0", "has port 0"),
        ("http://m/a/../b", "must not contain '..' segments"),
        ("http://m_x", "has a host that is neither a DNS name nor an IP address"),
        ("http://169.254.0.1", "has a link-local host (where the instance metadata service answers); name the "
                               "tracking server"),
        ("http://[fd00:ec2::23]", "has a link-local host (where the instance metadata service answers); name the "
                                  "tracking server"),
        ("http://[::ffff:169.254.1.1]", "has a link-local host (where the instance metadata service answers); name "
                                        "the tracking server"),
        ("http://0.0.0.0", "has an unspecified or multicast host address"),
        ("http://224.0.0.1", "has an unspecified or multicast host address"),
        ("http://[ff02::1]", "has an unspecified or multicast host address"),
    ],
)  # fmt: skip
def test_a_refused_tracking_uri_says_why_word_for_word(uri: str, said: str) -> None:
    assert TRACKING_URI.check(uri) == said
    shown = uri.replace("//u@", "//***@")  # a credential is never repeated
    assert problems(job_with({"trackingUri": uri})) == [f"{URI}{shown!r} {said}"]


@pytest.mark.parametrize(
    "uri",
    ["http://m", "https://m:8443/x/", "http://10.1.2.3:5000", "http://[2001:db8::1]:5000", "http://m.example.com.",
     "file:///data/mlruns", "/data/mlruns", "http://127.0.0.1"],
)  # fmt: skip
def test_an_accepted_tracking_uri_has_no_problem(uri: str) -> None:
    assert TRACKING_URI.check(uri) is None


@pytest.mark.parametrize(
    ("uri", "port"), [("http://m", 80), ("https://m", 443), ("http://m:5000", 5000), ("/data/mlruns", None)]
)
def test_the_tracking_port_is_the_one_the_pods_reach(uri: str, port: int | None) -> None:
    assert tracking_port(uri) == port


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("", "must not be empty or start or end with white space"),
        (" e", "must not be empty or start or end with white space"),
        ("e ", "must not be empty or start or end with white space"),
        ("a\nb", "must be one line without control or invisible characters"),
        ("a\rb", "must be one line without control or invisible characters"),
        ("a\tb", "must be one line without control or invisible characters"),
        ("a\u200bb", "must be one line without control or invisible characters"),
    ],
)
def test_an_mlflow_name_that_is_not_one_visible_line_is_refused_word_for_word(value: str, said: str) -> None:
    for grammar in (EXPERIMENT_NAME, RUN_NAME, MODEL_NAME):
        assert grammar.check(value) == said


def test_a_registered_models_name_says_which_character_mlflow_refuses() -> None:
    assert MODEL_NAME.check("a/b") == "must not contain '/' (MLflow refuses '/', ':' in it)"
    assert MODEL_NAME.check("a:b") == "must not contain ':' (MLflow refuses '/', ':' in it)"
    assert MODEL_NAME.check("b:a/") == "must not contain '/' (MLflow refuses '/', ':' in it)"  # in its own order
    assert EXPERIMENT_NAME.check("a/b:c") is None and RUN_NAME.check("a/b") is None  # only models' names
    assert [g.max_length for g in (EXPERIMENT_NAME, RUN_NAME, MODEL_NAME)] == [500, 250, 250]


def test_a_registered_model_of_a_train_function_job_is_refused() -> None:
    found = problems(job_with({"trackingUri": "http://m", "registeredModel": "qwen"}, trainFunction=FUNCTION))
    assert found == [
        "spec.tracking.mlflow.registeredModel: a trainFunction's model is its own; register it from the function"
    ]


def test_a_registered_model_needs_an_export() -> None:
    found = problems(job_with({"trackingUri": "http://m", "registeredModel": "qwen"}))
    assert found == ["spec.tracking.mlflow.registeredModel: set, but spec.output.storage is empty (there is no export)"]
    assert parse_job(
        job_with({"trackingUri": "http://m", "registeredModel": "qwen"}, output={"storage": "s3://bucket-x/x"})
    )


FILE_STORE_ON_ONE_POD = (
    "spec.tracking.mlflow.trackingUri: {uri!r} is a file store on one pod's own disk, and rank 0 and the attempts "
    "after a restart may run on others; put it under spec.sharedVolume.mountPath or use a tracking server (http(s)://)"
)


@pytest.mark.parametrize(
    ("uri", "spec", "refused"),
    [
        ("/data/mlruns", {"workers": {"replicas": 1}}, False),  # one worker: rank 0 runs there
        ("/data/mlruns", {"workers": {"replicas": 2}}, True),
        ("file:///data/mlruns", {"trainFunction": FUNCTION}, True),
        ("/data/mlruns", {"trainFunction": FUNCTION, "sharedVolume": {"claimName": "s", "mountPath": "/data"}}, False),
        ("/data", {"workers": {"replicas": 2}, "sharedVolume": {"claimName": "s", "mountPath": "/data/"}}, False),
        ("/database", {"workers": {"replicas": 2}, "sharedVolume": {"claimName": "s", "mountPath": "/data"}}, True),
        ("http://m", {"workers": {"replicas": 2}}, False),
    ],
)
def test_a_file_store_every_process_must_see_is_under_the_shared_volume(
    uri: str, spec: dict[str, Any], refused: bool
) -> None:
    manifest = job_with({"trackingUri": uri}, **spec)
    if refused:
        assert problems(manifest) == [FILE_STORE_ON_ONE_POD.format(uri=uri)]
    else:
        assert parse_job(manifest).spec.tracking.mlflow is not None


def test_the_trackers_own_variables_set_elsewhere_are_refused_where_they_are() -> None:
    manifest = job_with(
        {"trackingUri": "http://m"},
        env=[{"name": "mlflow_run_id", "value": "r"}],
        runtimeEnv={"envVars": {"MLFLOW_REGISTRY_URI": "http://x"}},
    )
    assert problems(manifest) == [
        "spec.env: 'mlflow_run_id' contradicts spec.tracking.mlflow; set the tracker there only",
        "spec.runtimeEnv.envVars: 'MLFLOW_REGISTRY_URI' contradicts spec.tracking.mlflow; set the tracker there only",
    ]
