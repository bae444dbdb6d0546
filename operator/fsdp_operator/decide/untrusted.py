"""Reading objects that other controllers write (KubeRay, Kueue, the kubelet): typed there, unchecked here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def mapping(value: Any) -> Mapping[str, Any]:
    """`value` where it is an object; an empty one otherwise (missing, null, or another type)."""
    return value if isinstance(value, Mapping) else {}
