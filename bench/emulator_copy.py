"""The emulated API server's copy of a stored object: `json_copy` (marshal) against the Python walk it replaced and
`copy.deepcopy`, side by side in one invocation, on what the load test stores most: a rendered RayCluster.

    PYTHONPATH=operator:training:tests python bench/emulator_copy.py [--repeat 5] [--number 2000]

Prints the best of `--repeat` timings of `--number` copies each, in microseconds a copy, and the object's size.
"""

from __future__ import annotations

import argparse
import copy
import json
import timeit
from collections.abc import Callable
from typing import Any

from fsdp_operator.api import render, spec
from fsdp_operator.local.server.resources import _walked_copy, json_copy
from integration.test_operator import manifest


def rendered_raycluster() -> dict[str, Any]:
    """The RayCluster of one of the load test's jobs, as the operator renders it."""
    job = manifest("load-0001", steps=100, workers={"replicas": 2})
    job["metadata"].update(uid="00000000-0000-0000-0000-000000000001", namespace="default")
    return render.raycluster(spec.parse_job(job))


def best_microseconds(copier: Callable[[Any], Any], value: Any, repeat: int, number: int) -> float:
    return min(timeit.repeat(lambda: copier(value), number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    cluster = rendered_raycluster()
    print(f"a rendered RayCluster: {len(json.dumps(cluster))} bytes of JSON")
    copiers: dict[str, Callable[[Any], Any]] = {
        "json_copy (marshal, format 2)": json_copy,
        "the Python walk (json_copy before)": _walked_copy,
        "copy.deepcopy": copy.deepcopy,
    }
    for name, copier in copiers.items():
        assert copier(cluster) == cluster
        print(f"{name:36} {best_microseconds(copier, cluster, args.repeat, args.number):7.1f} us a copy")


if __name__ == "__main__":
    main()
