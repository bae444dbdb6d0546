"""The operator's docs match the code: a troubleshooting section per reason, metrics and chart values documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fsdp_operator.decide.status import CONDITIONS, Reason
from fsdp_operator.runtime.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
TROUBLESHOOTING = (ROOT / "docs" / "troubleshooting.md").read_text()
INSTALL = (ROOT / "docs" / "install.md").read_text()


def test_every_reason_has_a_troubleshooting_section() -> None:
    headings = set(re.findall(r"^###? (\w+)$", TROUBLESHOOTING, re.MULTILINE))
    missing = [r.value for r in Reason if r.value not in headings]
    assert not missing, f"docs/troubleshooting.md has no section for {missing}"
    unknown = headings - {r.value for r in Reason} - {"Troubleshooting", "Failures"}
    assert not unknown, f"sections for reasons the operator never reports: {unknown}"


def test_warning_condition_reasons_are_explained() -> None:
    for type_, rule in CONDITIONS.items():
        if rule.warning_when_false:
            assert f"`{type_.value}` False" in TROUBLESHOOTING, type_


def test_every_metric_is_documented() -> None:
    names = {m.name for m in Metrics().registry.collect()}
    assert names, "no metrics registered"
    for name in names:  # counters' family names come without `_total`
        assert name in INSTALL, f"metric {name} is not in docs/install.md"


def test_install_covers_what_an_admin_needs() -> None:
    for needed in ("kubectl apply --server-side", "helm install", "helm upgrade", "eks.amazonaws.com/role-arn",
                   "finalizer", "helm uninstall", "secretKeyRef", "port-forward", "dashboardURL",
                   "kubectl wait --for=condition=Complete"):  # fmt: skip
        assert needed in INSTALL, needed
    schema = json.loads((ROOT / "charts" / "fsdp-operator" / "values.schema.json").read_text())
    values = (ROOT / "charts" / "fsdp-operator" / "values.yaml").read_text()
    for key in schema["properties"]:
        # Each value is documented: a comment in values.yaml above it, or a row in install.md.
        documented_here = f"`{key}" in INSTALL
        commented = re.search(rf"#[^\n]*\n(?:#[^\n]*\n)*{re.escape(key)}:", values) is not None
        assert documented_here or commented, f"chart value {key} is documented nowhere"
