"""The CRD and docs/api.md are generated from the field declarations and must not drift;
its names and columns are what users type."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fsdp_operator.api import generate
from fsdp_operator.api.spec import SpecError, parse_job

ROOT = Path(__file__).resolve().parents[2]


def test_crd_file_matches_the_schema_in_code() -> None:
    on_disk = yaml.safe_load((ROOT / "crds" / "fsdptrainingjob.yaml").read_text())
    assert on_disk == generate.crd(), "crds/fsdptrainingjob.yaml is stale: run `make crds`"


def test_chart_crd_matches_the_schema_in_code() -> None:
    chart_copy = ROOT / "charts" / "fsdp-operator" / "crds" / "fsdptrainingjob.yaml"
    assert yaml.safe_load(chart_copy.read_text()) == generate.crd(), "the chart's CRD is stale: run `make crds`"


def test_names_users_type() -> None:
    names = generate.crd()["spec"]["names"]
    assert names["plural"] == "fsdptrainingjobs"
    assert {"trainingjobs", "trainingjob", "ftj"} <= set(names["shortNames"])


def test_printer_columns() -> None:
    (version,) = generate.crd()["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert {"Phase", "Workers", "Transport", "Step", "Tokens/s", "Age"} <= set(columns)
    assert version["subresources"] == {"status": {}}


def test_api_reference_matches_the_declarations() -> None:
    on_disk = (ROOT / "docs" / "api.md").read_text()
    from fsdp_operator.decide.lifecycle import conditions_reference

    assert on_disk == generate.api_reference() + conditions_reference(), "docs/api.md is stale: run `make crds`"


def test_api_reference_names_spec_and_status_fields() -> None:
    text = generate.api_reference()
    for row in (
        "| `spec.workers.replicas` | integer | 2 | Number of worker pods (Ray nodes). (>= 1, <= 512) |",
        "| `spec.training.warmupSteps` | integer | 0 |",
        "| `spec.network.requireEFA` | boolean | unset: true when transport is efa |",
        "| `status.phase` | string | Lifecycle phase. |",
        "| `status.conditions[].reason` | string |",
    ):
        assert row in text


def _string_nodes(node: object, path: str = "") -> list[tuple[str, dict[str, object]]]:
    if not isinstance(node, dict):
        return []
    found = [(path, node)] if node.get("type") == "string" else []
    for key, child in node.get("properties", {}).items():
        found += _string_nodes(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        found += _string_nodes(node.get(key), f"{path}[]")
    return found


def test_strings_the_parser_refuses_empty_are_refused_empty_by_the_crd() -> None:
    """`spec.image: ""` used to pass the API server and fail later in the operator."""
    (version,) = generate.crd()["spec"]["versions"]
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    image = spec_schema["properties"]["image"]
    assert image["minLength"] == 1
    for path, node in _string_nodes(spec_schema, "spec"):
        if "default" in node and "minLength" in node:
            assert len(str(node["default"])) >= 1, f"{path}: its default breaks its own minLength"
    job = {"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", "metadata": {"name": "a"}}
    with pytest.raises(SpecError, match=r"spec\.image: '' is not an OCI image reference"):
        parse_job({**job, "spec": {"image": ""}})
