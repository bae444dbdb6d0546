"""`fsdpctl operator` / `python -m fsdp_operator`: run the operator (kopf) against the current cluster."""

from __future__ import annotations

import argparse
import logging
import sys

import kopf

from fsdp_operator.controller import Runtime
from fsdp_operator.handlers import build_registry
from fsdp_operator.settings import OperatorConfig


class _QuietWakeups(logging.Filter):
    """Drops kopf's INFO line for each raw watch event: those handlers only wake a job's loop."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Handler '") and message.endswith("_event' succeeded."))


def run_operator(namespace: str | None, liveness: str | None) -> int:
    """Run until SIGINT/SIGTERM: one namespace, or all when `namespace` is None; `liveness` like
    `http://0.0.0.0:8080/healthz` serves kopf's liveness probe. Credentials: in-cluster or kubeconfig."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf.objects").addFilter(_QuietWakeups())
    registry = build_registry(Runtime(OperatorConfig.from_env()))
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else [],
        liveness_endpoint=liveness,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fsdp_operator", description=__doc__)
    parser.add_argument("--namespace", "-n", default=None, help="watch one namespace (default: all)")
    parser.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    args = parser.parse_args(argv)
    return run_operator(namespace=args.namespace, liveness=args.liveness)


if __name__ == "__main__":
    sys.exit(main())
