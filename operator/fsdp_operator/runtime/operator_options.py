"""The command-line options of the operator process; no kopf import, so `fsdpctl --help` stays fast."""

from __future__ import annotations

import argparse


def add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fsdpctl operator` and `python -m fsdp_operator` (here: no kopf import to build them)."""
    parser.add_argument(
        "-n", "--namespace", action="append", default=None, help="watch this namespace (repeatable; default: all)"
    )
    parser.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    parser.add_argument("--peering", default=None, help="kopf peering object for leader election between replicas")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-format", default="text", choices=["json", "text"])
