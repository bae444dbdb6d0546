"""`manifest_yaml.dump` writes what every YAML reader reads back unchanged: PyYAML (YAML 1.1) and this package's
reader, which resolves plain scalars as Go's yaml.v2 does for kubectl (the real kubectl: tests/integration)."""

from __future__ import annotations

from typing import Any

import yaml
from fsdp_operator.api.manifest_yaml import dump, load_all, plain_is_safe
from hypothesis import given, settings
from hypothesis import strategies as st

TRICKY = ["n", "Y", "yes", "Off", "null", "~", "", "1e3", "0o17", "0x1F", "017", "1_000", ".inf", "-.5", "1:20",
          "2001-12-14", "<<", "a: b", "a #b", "- a", "x\n", " lead", "trail ", "é"]  # fmt: skip


def read_back(obj: Any) -> tuple[Any, Any]:
    text = dump(obj)
    (ours,) = load_all(text)
    return ours, yaml.safe_load(text)


def test_strings_readers_take_otherwise_are_quoted() -> None:
    assert not any(plain_is_safe(text) for text in TRICKY)
    obj = {text or "empty": text for text in TRICKY}
    assert read_back(obj) == (obj, obj)
    assert dump({"image": "n", "value": "1e3"}) == 'image: "n"\nvalue: "1e3"\n'


def test_plain_text_stays_readable() -> None:
    assert dump({"name": "Eval Loss", "image": "public.ecr.aws/x/ray:2.58.0"}) == (
        "name: Eval Loss\nimage: public.ecr.aws/x/ray:2.58.0\n"
    )


@settings(max_examples=50)
@given(st.dictionaries(st.text(max_size=8), st.text(max_size=12), max_size=8))
def test_any_string_map_reads_back_unchanged(obj: dict[str, str]) -> None:
    assert read_back(obj) == (obj, obj)
