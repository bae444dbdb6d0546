"""Pod validation of the emulated API server (local/server/podvalidation.py): quantities as the real server
canonicalizes them (what the divisor rule compares), and the env rules on their own."""

from __future__ import annotations

import pytest
from fsdp_operator.local.server import podvalidation
from fsdp_operator.local.server.podvalidation import QuantityError, canonical_quantity


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("1000m", "1"),
        ("0.5Gi", "512Mi"),
        ("1024", "1024"),  # DecimalSI stays decimal: not the memory divisor 1Ki
        ("1Ki", "1Ki"),
        ("1e3", "1e3"),
        ("1.5", "1500m"),
        ("0.1n", "1n"),  # below a nano rounds up
        ("160m", "160m"),
        ("1025Ki", "1025Ki"),
        ("0", "0"),
    ],
)
def test_quantities_are_canonicalized_as_the_real_server_prints_them(text: str, canonical: str) -> None:
    assert canonical_quantity(text) == canonical


@pytest.mark.parametrize("text", ["", "1 GB", "1.2.3", "Gi", "1e999999999", "--1", " 1", "0x10"])
def test_what_is_not_a_quantity_is_refused_without_a_crash(text: str) -> None:
    with pytest.raises(QuantityError, match="quantities must match the regular expression"):
        canonical_quantity(text)


def _errors(*env: dict[str, object]) -> list[str]:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i", "env": list(env)}]}}
    return [str(e) for e in podvalidation.validate_pod(pod)]


def test_divisors_are_compared_in_canonical_form() -> None:
    ok = {"resource": "limits.cpu", "divisor": "1000m"}
    assert _errors({"name": "A", "valueFrom": {"resourceFieldRef": ok}}) == []
    for divisor in ("1Mi", "1M", "1Ei", "1"):
        ref = {"resource": "requests.memory", "divisor": divisor}
        assert _errors({"name": "A", "valueFrom": {"resourceFieldRef": ref}}) == [], divisor
    ref = {"resource": "limits.ephemeral-storage", "divisor": "2Mi"}
    (error,) = _errors({"name": "A", "valueFrom": {"resourceFieldRef": ref}})
    assert error.endswith("are supported with the local ephemeral storage resource")


def test_label_and_annotation_subscripts_must_be_qualified_names() -> None:
    good = {"fieldPath": "metadata.annotations['example.com/Key']"}
    assert _errors({"name": "A", "valueFrom": {"fieldRef": good}}) == []
    bad = {"fieldPath": "metadata.labels['-bad-']"}
    (error,) = _errors({"name": "A", "valueFrom": {"fieldRef": bad}})
    assert error.startswith('spec.containers[0].env[0].valueFrom.fieldRef: Invalid value: "-bad-": name part must')


def test_value_and_value_from_together_are_refused() -> None:
    (error,) = _errors({"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    assert (
        error
        == 'spec.containers[0].env[0].valueFrom: Invalid value: "": may not be specified when `value` is not empty'
    )
