"""`fsdpctl render -o yaml` is read by the real kubectl as exactly what `render -o json` says.

kubectl reads YAML with Go's yaml.v2 (sigs.k8s.io/yaml), where `n` and `y` are booleans, `1e3` a float and `0o17`
an integer: an unquoted string like those would reach the API server as something else (a GitOps dry run would
commit other values than the operator creates).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.api.manifest_yaml import decode, dump, load_all
from fsdp_operator.cli.main import main
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import ThreadedApiServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.k8s_tools import REPO, needed, run_kubectl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
HOSTILE = REPO / "tests" / "data" / "hostile"
ACCEPTED = sorted(
    {line.split("\t")[0] for line in (HOSTILE / "EXPECTED.tsv").read_text().splitlines() if "\taccepted\t0" in line}
)
# Strings some YAML reader takes for something else when unquoted (YAML 1.1 booleans and sexagesimals, Go's
# number forms, YAML 1.2 core, timestamps, merge keys, indicators).
TRICKY = [
    "n", "y", "N", "Yes", "off", "ON", "true", "False", "null", "Null", "~", "", " ", "1e3", "1E3", "-1e-3",
    "0o17", "0x1F", "0b101", "017", "1_000", "+1", "-0", ".5", "1.", ".inf", "-.Inf", ".nan", "NaN", "Infinity",
    "1:20", "190:20:30", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "<<", "=", "- x", "-", "? x", "a: b", "#c",
    "a #c", "!x", "&a", "*a", "%x", "@x", "`x", "'q'", '"q"', "{a}", "[a]", "|", ">", "x\n", "\ty", "é", "\u2028",
]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    needed("kubectl")


@pytest.fixture
def kube(apiserver: ThreadedApiServer, kubeconfig: Path) -> Path:
    """kubectl's dry run still asks the server what a RayCluster is (discovery): one with KubeRay's CRD."""
    import requests

    response = requests.post(
        f"{apiserver.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=RAYCLUSTER_CRD, timeout=10
    )
    assert response.status_code == 201, response.text
    return kubeconfig


def render(path: Path, output: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["render", "-f", str(path), "-o", output]) == 0
    return capsys.readouterr().out


def read_by_kubectl(kubeconfig: Path, text: str) -> Any:
    result = run_kubectl(kubeconfig, "create", "--dry-run=client", "-o", "json", "-f", "-", stdin=text)
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "path", EXAMPLES + [HOSTILE / name for name in ACCEPTED], ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_render_yaml_is_what_kubectl_reads_as_the_json(
    path: Path, kube: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    as_json = json.loads(render(path, "json", capsys))
    assert read_by_kubectl(kube, render(path, "yaml", capsys)) == as_json


def _job_with_strings(values: list[str], tmp_path: Path) -> Path:
    """tiny-cpu with `values` in every string field that takes free text and reaches the RayCluster."""
    (job,) = load_all(decode((REPO / "examples" / "tiny-cpu.yaml").read_bytes()))
    job = copy.deepcopy(job)
    job["spec"]["env"] = [{"name": f"V{i}", "value": value} for i, value in enumerate(values)]
    path = tmp_path / "job.yaml"
    path.write_text(dump(job), encoding="utf-8")  # either side reads the same job: the output is what is compared
    return path


def test_strings_every_yaml_reader_takes_otherwise_stay_strings(
    kube: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _job_with_strings(TRICKY, tmp_path)
    rendered = render(path, "yaml", capsys)
    assert read_by_kubectl(kube, rendered) == json.loads(render(path, "json", capsys))
    # PyYAML (YAML 1.1) reads it back the same too.
    assert yaml.safe_load(rendered) == json.loads(render(path, "json", capsys))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(
        st.text(
            st.characters(codec="utf-8", exclude_categories=["Cs", "Cc", "Cf"], include_characters="\t\n"), max_size=12
        ),
        min_size=1,
        max_size=40,
    )
)
def test_generated_strings_stay_strings(
    values: list[str], kube: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _job_with_strings(values, tmp_path)
    assert read_by_kubectl(kube, render(path, "yaml", capsys)) == json.loads(render(path, "json", capsys))
