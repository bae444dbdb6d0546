"""Preflight's checks one by one (`fsdp_train.run.preflight`): which locations are local, what the hub is asked and
what its answers become, each problem's exact words and field, and how `check` and `check_rank` turn problems into
`PreflightFailed` with the operator's reason. A real Hugging Face cache layout under `tmp_path`; the hub's client is
a stand-in that answers as told, so nothing leaves this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import httpx
import huggingface_hub
import huggingface_hub.constants
import pytest
from fsdp_train.contract.config import TrainConfig
from fsdp_train.run import preflight
from fsdp_train.run.preflight import (
    DATA_UNAVAILABLE,
    HUB_TIMEOUT_SECONDS,
    PreflightFailed,
    _local,
    check,
    check_rank,
    data_problems,
    function_problems,
    hub_problem,
    job_problems,
    model_problems,
    tokenizer_problems,
)
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError


def config(**more: Any) -> TrainConfig:
    return TrainConfig.from_dict({"steps": 2, "seq_len": 16, "batch_size_per_rank": 1, **more})


class Hub:
    """A hub check that records each question (repository, file) and answers from `problems` ('' by default)."""

    def __init__(self, **problems: str) -> None:
        self.problems = problems
        self.asked: list[tuple[str, str]] = []

    def __call__(self, repo: str, wanted: str) -> str:
        self.asked.append((repo, wanted))
        return self.problems.get(repo.replace("/", "_").replace("-", "_"), "")


def no_hub(repo: str, wanted: str) -> str:
    raise AssertionError(f"the hub was asked about {repo} ({wanted})")


def model_dir(path: Path, *files: str) -> Path:
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text("{}")
    return path


# --- PreflightFailed and check ----------------------------------------------------------------------------------


def test_preflight_failed_joins_its_problems_and_keeps_them_and_its_reason() -> None:
    error = PreflightFailed(["a: gone", "b: gone"], reason=DATA_UNAVAILABLE)
    assert (str(error), error.problems, error.reason) == ("a: gone; b: gone", ["a: gone", "b: gone"], "DataUnavailable")
    assert PreflightFailed(["a"]).reason == "PreflightFailed"


def test_check_passes_no_problems_and_raises_the_ones_given() -> None:
    check([])
    with pytest.raises(PreflightFailed) as raised:
        check(["a: gone", "b: gone"])
    assert (str(raised.value), raised.value.problems, raised.value.reason) == (
        "a: gone; b: gone",
        ["a: gone", "b: gone"],
        "PreflightFailed",
    )
    with pytest.raises(PreflightFailed) as raised:
        check(["a: gone"], reason=DATA_UNAVAILABLE)
    assert raised.value.reason == "DataUnavailable"


# --- check_rank -------------------------------------------------------------------------------------------------


def test_a_rank_with_a_missing_data_file_fails_as_data_unavailable(tmp_path: Path) -> None:
    """The operator does not retry DataUnavailable: another attempt reads the same missing file."""
    model = model_dir(tmp_path / "model", "config.json")
    with pytest.raises(PreflightFailed) as raised:
        check_rank(config(data=str(tmp_path / "gone.jsonl"), model=str(model), model_init="pretrained"))
    assert raised.value.reason == DATA_UNAVAILABLE == "DataUnavailable"
    assert raised.value.problems == [
        f"spec.data.source: {tmp_path / 'gone.jsonl'} not found (no such file or directory on this node)"
    ]


def test_a_rank_with_its_data_but_no_model_fails_as_preflight_failed(tmp_path: Path) -> None:
    (tmp_path / "corpus.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(PreflightFailed) as raised:
        check_rank(config(data=str(tmp_path / "corpus.jsonl"), model=str(tmp_path / "model"), model_init="pretrained"))
    assert raised.value.reason == "PreflightFailed"
    assert raised.value.problems == [
        f"spec.model.name: {tmp_path / 'model'} not found (no such directory on this node)"
    ]


def test_a_rank_with_its_data_and_model_passes(tmp_path: Path) -> None:
    (tmp_path / "corpus.jsonl").write_text('{"text": "a"}\n')
    model = model_dir(tmp_path / "model", "config.json")
    check_rank(config(data=str(tmp_path / "corpus.jsonl"), model=str(model), model_init="pretrained"))


# --- _local -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "path"),
    [
        ("file:///data/corpus.jsonl", "/data/corpus.jsonl"),
        ("/data/corpus.jsonl", "/data/corpus.jsonl"),
        ("./model", "./model"),
        ("../model", "../model"),
        ("Qwen/Qwen2.5-0.5B", None),
        ("s3://bucket/model", None),
    ],
)
def test_a_location_is_local_when_it_is_a_path_or_a_file_url(location: str, path: str | None) -> None:
    assert _local(location) == path


# --- model_problems and tokenizer_problems ----------------------------------------------------------------------


def test_a_model_directory_with_its_config_needs_nothing_else(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "model", "config.json")
    assert model_problems(config(model=str(model), model_init="pretrained"), hub=no_hub) == []
    assert model_problems(config(model=f"file://{model}", model_init="pretrained"), hub=no_hub) == []


def test_a_model_directory_without_config_json_is_named(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "model", "CONFIG.JSON.bak", "model.safetensors")
    assert model_problems(config(model=str(model), model_init="pretrained"), hub=no_hub) == [
        f"spec.model.name: {model} holds no config.json (a save_pretrained directory has one)"
    ]


@pytest.mark.parametrize(
    ("problems", "settings", "asked"),
    [
        (model_problems, {"model": "acme/tiny", "model_init": "pretrained"}, ("acme/tiny", "config.json")),
        (tokenizer_problems, {"data": "/data", "tokenizer": "acme/tok"}, ("acme/tok", "tokenizer_config.json")),
    ],
    ids=["model", "tokenizer"],
)
def test_a_hub_repository_is_asked_for_its_config_and_passes_when_the_hub_has_it(
    problems: Any, settings: dict[str, Any], asked: tuple[str, str]
) -> None:
    hub = Hub()
    assert problems(config(**settings), hub=hub) == []
    assert hub.asked == [asked]


def test_a_hub_models_problem_is_named_under_the_model_field() -> None:
    hub = Hub(acme_tiny="acme/tiny not found on the Hugging Face hub")
    assert model_problems(config(model="acme/tiny", model_init="pretrained"), hub=hub) == [
        "spec.model.name: acme/tiny not found on the Hugging Face hub"
    ]


def test_a_tokenizer_directory_with_any_tokenizer_file_passes(tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json"):
        tok = model_dir(tmp_path / name, name)
        assert tokenizer_problems(config(data="/data", tokenizer=str(tok)), hub=no_hub) == []


def test_a_tokenizer_directory_without_one_is_named(tmp_path: Path) -> None:
    tok = model_dir(tmp_path / "tok", "merges.txt")
    assert tokenizer_problems(config(data="/data", tokenizer=str(tok)), hub=no_hub) == [
        f"spec.data.tokenizer: {tok} holds no tokenizer "
        "(tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json)"
    ]


def test_random_data_needs_no_tokenizer() -> None:
    assert tokenizer_problems(config(model="acme/tiny"), hub=no_hub) == []


def test_a_hub_tokenizers_problem_is_named_under_its_field() -> None:
    hub = Hub(acme_tok="acme/tok is gated on the hub")
    assert tokenizer_problems(config(data="/data", tokenizer="acme/tok"), hub=hub) == [
        "spec.data.tokenizer: acme/tok is gated on the hub"
    ]
    hub = Hub(acme_tiny="acme/tiny is gated on the hub")
    assert tokenizer_problems(config(data="/data", model="acme/tiny"), hub=hub) == [
        "spec.model.name (the tokenizer: spec.data.tokenizer is empty): acme/tiny is gated on the hub"
    ]


# --- data_problems ----------------------------------------------------------------------------------------------


def test_a_missing_validation_file_is_named_after_a_present_data_file(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text("{}\n")
    cfg = config(data=str(tmp_path / "train.jsonl"), validation_data=f"file://{tmp_path}/val.jsonl")
    assert data_problems(cfg) == [
        f"spec.data.validationSource: file://{tmp_path}/val.jsonl not found (no such file or directory on this node)"
    ]


def test_remote_data_is_left_to_the_pipeline() -> None:
    assert data_problems(config(data="s3://bucket/corpus", validation_data="gs://bucket/val")) == []


# --- function_problems ------------------------------------------------------------------------------------------


def test_a_module_file_beside_the_code_directory_is_found(tmp_path: Path) -> None:
    (tmp_path / "tinygpt.py").write_text("def main(): pass\n")
    assert function_problems("tinygpt:main", str(tmp_path)) == []


def test_a_callable_without_a_colon_names_its_missing_package(tmp_path: Path) -> None:
    assert function_problems("nothere", str(tmp_path)) == [
        f"spec.trainFunction.callable: no package or module 'nothere' in {tmp_path} (spec.trainFunction.code)"
    ]


@pytest.mark.parametrize("code", ["s3://bucket/code.zip", "gs://bucket/code.zip"])
def test_code_in_a_bucket_is_left_to_rays_runtime_environment(code: str) -> None:
    assert function_problems("nothere.mod:f", code) == []


def test_a_package_neither_installed_nor_given_says_to_set_the_code_directory() -> None:
    assert function_problems("no_such_package_anywhere.m:f", "") == [
        "spec.trainFunction.callable: no module 'no_such_package_anywhere' is installed here, and "
        "spec.trainFunction.code is empty (set it to the directory that holds the package)"
    ]
    assert function_problems("pytest:main", "") == []


# --- job_problems -----------------------------------------------------------------------------------------------


def test_one_hub_question_per_repository_for_the_model_and_its_own_tokenizer() -> None:
    hub = Hub()
    assert job_problems(config(data="/", model="acme/tiny", model_init="pretrained"), hub=hub) == []
    assert hub.asked == [("acme/tiny", "config.json")]


def test_a_separate_hub_tokenizer_is_asked_through_the_same_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a real hub client, were one used, answers from the cache only
    hub = Hub()
    cfg = config(data="/", model="acme/tiny", tokenizer="acme/tok", model_init="pretrained")
    assert job_problems(cfg, hub=hub) == []
    assert hub.asked == [("acme/tiny", "config.json"), ("acme/tok", "tokenizer_config.json")]


# --- hub_problem ------------------------------------------------------------------------------------------------


class Api:
    """`huggingface_hub.HfApi` as these tests need it: `model_info` records its question and raises `error`."""

    error: ClassVar[Exception | None] = None
    asked: ClassVar[list[tuple[str, float]]] = []

    def model_info(self, repo_id: str, *, timeout: float) -> object:
        Api.asked.append((repo_id, timeout))
        if Api.error is not None:
            raise Api.error
        return object()


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache in `tmp_path` and a stand-in hub client; HF_HUB_OFFLINE unset."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(Api, "error", None)
    monkeypatch.setattr(Api, "asked", [])
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


def cache_file(cache: Path, repo: str, name: str) -> None:
    """`name` of `repo` as `hf_hub_download` leaves it: a snapshot named by the commit `refs/main` holds."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (folder / "snapshots" / ("0" * 40) / name).write_text("{}")


def test_a_file_in_this_nodes_cache_asks_nothing_even_offline(hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache_file(hub, "acme/tiny", "config.json")
    assert hub_problem("acme/tiny", "config.json") == ""
    assert Api.asked == []


def test_a_file_not_cached_is_asked_of_the_hub_with_the_timeout(hub: Path) -> None:
    cache_file(hub, "acme/tiny", "tokenizer_config.json")
    assert hub_problem("acme/tiny", "config.json") == ""
    assert Api.asked == [("acme/tiny", HUB_TIMEOUT_SECONDS)] and HUB_TIMEOUT_SECONDS == 10.0
    assert hub_problem("acme/other", "config.json", timeout=2.5) == ""
    assert Api.asked[-1] == ("acme/other", 2.5)


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", " ON ", "True"])
def test_offline_a_file_not_cached_is_said_so(hub: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub_problem("acme/tiny", "config.json") == (
        "acme/tiny is not in this node's Hugging Face cache, and HF_HUB_OFFLINE is set"
    )
    assert Api.asked == []


@pytest.mark.parametrize("value", ["0", "", "false", "no"])
def test_hf_hub_offline_off_still_asks_the_hub(hub: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub_problem("acme/tiny", "config.json") == "" and len(Api.asked) == 1


def test_an_id_the_cache_cannot_name_is_not_called_cached(hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_problem("acme/tiny/extra", "config.json") == (
        "acme/tiny/extra is not in this node's Hugging Face cache, and HF_HUB_OFFLINE is set"
    )


def response(status: int) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/acme/tiny"))


def test_a_gated_model_says_to_set_a_token(hub: Path) -> None:
    Api.error = GatedRepoError("gated", response=response(403))
    assert hub_problem("acme/tiny", "config.json") == (
        "acme/tiny is gated on the hub: set HF_TOKEN (spec.env) to a token that was granted access"
    )


def test_a_model_the_hub_does_not_have_is_not_found(hub: Path) -> None:
    Api.error = RepositoryNotFoundError("no such repo", response=response(404))
    assert hub_problem("acme/tiny", "config.json") == (
        "acme/tiny not found on the Hugging Face hub (nor in this node's cache); check the name"
    )


def test_a_hub_that_does_not_answer_is_unreachable_with_its_error_on_one_line(hub: Path) -> None:
    Api.error = ConnectionRefusedError("connection\n   refused  by peer")
    assert hub_problem("acme/tiny", "config.json") == (
        "acme/tiny: hub unreachable from this node (ConnectionRefusedError: connection refused by peer) "
        "and not in its cache"
    )


def test_an_error_without_words_is_named_by_its_type(hub: Path) -> None:
    Api.error = TimeoutError()
    assert hub_problem("acme/tiny", "config.json") == (
        "acme/tiny: hub unreachable from this node (TimeoutError: TimeoutError) and not in its cache"
    )


def test_a_long_error_is_cut_to_160_characters(hub: Path) -> None:
    Api.error = OSError("x" * 300)
    problem = hub_problem("acme/tiny", "config.json")
    assert problem == f"acme/tiny: hub unreachable from this node (OSError: {'x' * 160}) and not in its cache"


def test_the_real_hub_check_is_the_default_of_each_check(hub: Path) -> None:
    """`model_problems` without a `hub` asks the real check, which asks the client (here, the stand-in)."""
    Api.error = RepositoryNotFoundError("no such repo", response=response(404))
    assert model_problems(config(model="acme/tiny", model_init="pretrained")) == [
        "spec.model.name: acme/tiny not found on the Hugging Face hub (nor in this node's cache); check the name"
    ]
    assert preflight.hub_problem is hub_problem


# --- what is said once, and what needs no question --------------------------------------------------------------


def test_a_missing_model_without_a_tokenizer_of_its_own_is_said_once_under_the_model(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    assert job_problems(config(data="/", model=str(gone), model_init="pretrained"), hub=no_hub) == [
        f"spec.model.name: {gone} not found (no such directory on this node)"
    ]
    hub = Hub(acme_gone="acme/gone is not on the hub")
    assert job_problems(config(data="/", model="acme/gone", model_init="pretrained"), hub=hub) == [
        "spec.model.name: acme/gone is not on the hub"
    ]


def test_a_model_directory_that_is_there_has_its_tokenizer_judged_on_its_own(tmp_path: Path) -> None:
    """The model's directory exists: what it lacks of a tokenizer is a problem of its own, beside the model's."""
    bare = model_dir(tmp_path / "bare")
    problems = job_problems(config(data="/", model=str(bare), model_init="pretrained"), hub=no_hub)
    assert [p.split(":")[0] for p in problems] == [
        "spec.model.name (the tokenizer",
        "spec.model.name",
    ], problems
    configured = model_dir(tmp_path / "configured", "config.json")
    problems = job_problems(config(data="/", model=str(configured), model_init="pretrained"), hub=no_hub)
    assert [p.split(":")[0] for p in problems] == ["spec.model.name (the tokenizer"], problems


def test_an_explicit_tokenizer_that_is_missing_is_named_beside_a_model_the_hub_has(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    cfg = config(data="/", model="acme/tiny", tokenizer=str(tok), model_init="pretrained")
    assert [p.split(":")[0] for p in job_problems(cfg, hub=Hub())] == ["spec.data.tokenizer"]


def test_a_model_built_from_a_known_config_or_read_from_a_bucket_asks_nothing() -> None:
    assert model_problems(config(model="Qwen/Qwen2.5-1.5B", model_init="random"), hub=no_hub) == []
    assert model_problems(config(model="s3://bucket/model", model_init="pretrained"), hub=no_hub) == []
    unknown, pretrained = Hub(), Hub()
    assert model_problems(config(model="acme/tiny", model_init="random"), hub=unknown) == []
    assert model_problems(config(model="Qwen/Qwen2.5-1.5B", model_init="pretrained"), hub=pretrained) == []
    assert unknown.asked == [("acme/tiny", "config.json")]  # its config must come from somewhere
    assert pretrained.asked == [("Qwen/Qwen2.5-1.5B", "config.json")]  # its weights must


def test_random_data_is_no_file_to_look_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no file named "random" here either
    assert data_problems(config(data="random")) == []
