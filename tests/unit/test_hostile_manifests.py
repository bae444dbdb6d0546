"""The hostile-manifest corpus (tests/data/hostile/) through the real `fsdpctl validate` entry point.

Every file must end in exit 1 with its expected first problem, or exit 2 with its expected reason
(exit 0 for the few controls kubectl would apply too); never a traceback, never a credential in the
output, never more than a few KiB of output. EXPECTED.tsv holds the written-down expectations;
`python tests/data/hostile/make_corpus.py` writes the files and the index.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest
from fsdp_operator.cli.main import main

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile"
# Values planted in credential-like places of the corpus: they must never be printed.
PLANTED_SECRETS = ("s3cr3t", "31337", "12345")


def cases() -> list[tuple[str, str, int, str]]:
    rows = []
    for line in (CORPUS / "EXPECTED.tsv").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, kind, code, expected = line.split("\t")
        rows.append((name, kind, int(code), expected.encode().decode("unicode_escape")))
    return rows


CASES = cases()


def validate(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str, str]:
    code = main(["validate", "-f", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("name", "kind", "code", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hostile_manifest(capsys: pytest.CaptureFixture[str], name: str, kind: str, code: int, expected: str) -> None:
    got, out, err = validate(capsys, CORPUS / name)
    assert "Traceback" not in out + err
    assert not any(secret in out + err for secret in PLANTED_SECRETS), err
    assert len(out + err) < 4096
    assert got == code, f"{name} ({kind}): exit {got}\n{err}"
    if code == 1:
        first = err.splitlines()[1].removeprefix("  ")
        assert first.startswith(expected), first
    elif code == 2:
        assert err.startswith("error: ") and expected in err, err
    else:
        assert "valid FSDPTrainingJob" in out


def test_the_corpus_covers_every_class_with_100_files() -> None:
    on_disk = {p.name for p in CORPUS.glob("*.yaml")}
    listed = {name for name, *_ in CASES}
    assert on_disk == listed
    per_class = collections.Counter(kind for _, kind, *_ in CASES)
    assert sum(n for kind, n in per_class.items() if kind != "accepted") >= 100
    for kind in (
        "shape",
        "encoding",
        "duplicate-keys",
        "aliases",
        "nesting",
        "nan-inf",
        "bounds",
        "quantity",
        "names",
        "labels-annotations",
        "env-names",
        "image",
        "uri",
        "missing-spec",
        "unknown-fields",
        "credentials",
        "operator-owned",
        "pip",
        "node-selector",
        "train-config",
        "not-a-job",
        "yaml",
        "characters",
        "digest",
        "object-store",
        "local-storage",
        "overrides-bounds",
        "floors",
        "system-paths",
        "instance-type",
        "env-doors",
        "strict-json",
        "placement",
    ):
        assert per_class[kind] >= 2, kind


def test_larger_than_the_api_server_accepts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nspec: {}\n# " + b"x" * (3 * 2**20))
    code, _, err = validate(capsys, path)
    assert code == 2 and "larger than 3145728 bytes, the most the Kubernetes API server accepts" in err


def test_larger_than_kubernetes_stores(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    annotation = "v" * (2 * 2**20)
    path.write_text(
        "apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\n"
        f"metadata: {{name: j, annotations: {{a: {annotation}}}}}\nspec: {{}}\n"
    )
    code, _, err = validate(capsys, path)
    assert code == 2 and "larger than 1572864 bytes once aliases are expanded, the most Kubernetes stores" in err


def test_a_raycluster_larger_than_etcd_stores(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """128 variables of 10 KB: a 1.3 MB manifest the API server stores, but set in the head and in the workers
    they make a RayCluster of 2.6 MB, which etcd refuses (the operator would retry its creation forever)."""
    path = tmp_path / "env.yaml"
    env = "".join(f"  - {{name: V{i}, value: {'x' * 10240}}}\n" for i in range(128))
    path.write_text(f"apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata: {{name: j}}\nspec:\n env:\n{env}")
    code, _, err = validate(capsys, path)
    assert code == 1, err
    assert err.splitlines()[1].startswith("  spec.env: the RayCluster would be about 26")
    assert "over the 1507328 that fit in etcd's 1572864-byte limit" in err


def test_a_problem_list_is_bounded(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    keys = ", ".join(f"k{i}: 1" for i in range(5000))
    path.write_text(f"apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata: {{name: j}}\nspec: {{{keys}}}\n")
    code, _, err = validate(capsys, path)
    assert code == 1 and "5000 problems" in err and "  ... and 4950 more" in err
    assert len(err.splitlines()) == 52


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "document",
    [
        "apiVersion: {value}\nkind: FSDPTrainingJob\nmetadata: {{name: j}}\nspec: {{}}\n",
        "apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata: {{name: j}}\nspec: {{image: {value}}}\n",
        "apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata: {{name: j}}\nspec:\n  ? {value}\n  : 1\n",
    ],
    ids=["apiVersion", "spec.image", "unknown key"],
)
def test_a_long_value_is_shown_in_linear_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: str
) -> None:
    """Hiding URI user info scanned for `scheme://` from every position: 200,000 letters took 126 s."""
    path = tmp_path / "long.yaml"
    path.write_text(document.format(value="a" * 300_000))
    started = time.process_time()
    code, _, err = validate(capsys, path)
    assert time.process_time() - started < 2
    assert code in (1, 2) and len(err) < 4096
