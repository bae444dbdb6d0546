"""The RayCluster each example renders to, compared whole with a reviewed copy in tests/data/golden/.

Every key and value of the manifest matters to KubeRay or the kubelet (a misspelt `nodeSelector` or a
dropped EFA toleration is silently ignored by the API server), so the whole manifest is written down.
After an intended change to `render.py`, regenerate and review the diff:

    FSDP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_render_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from fsdp_operator import render
from fsdp_operator.spec import parse_job

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden"
UID = "0b8a2b5e-1111-2222-3333-444455556666"
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))


def rendered(example: str, **spec: object) -> dict[str, object]:
    manifest = yaml.safe_load((ROOT / "examples" / example).read_text())
    manifest["metadata"].update(uid=UID, namespace="ml", generation=1)
    manifest["spec"].update(spec)
    return render.raycluster(parse_job(manifest))


def check(name: str, manifest: dict[str, object]) -> None:
    path = GOLDEN / name
    text = yaml.safe_dump(manifest, sort_keys=True)
    if os.environ.get("FSDP_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with FSDP_UPDATE_GOLDEN=1 and review it"
    assert yaml.safe_load(path.read_text()) == manifest, (
        f"{name}: the rendered RayCluster differs from the reviewed copy; if intended, regenerate it "
        "(FSDP_UPDATE_GOLDEN=1) and review the diff"
    )


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_example_renders_its_reviewed_raycluster(example: str) -> None:
    check(f"raycluster-{example}", rendered(example))


def test_head_and_worker_placement_and_tolerations_reach_the_pods() -> None:
    manifest = rendered(
        "qwen2.5-1.5b-efa.yaml",
        head={"nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "head", "operator": "Exists"}]},
        workers={"nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "team", "operator": "Exists"}]},
    )
    check("raycluster-placement.yaml", manifest)
