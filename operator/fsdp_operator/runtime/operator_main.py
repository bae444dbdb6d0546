"""`fsdpctl operator` / `python -m fsdp_operator`: run the operator (kopf) against the current cluster."""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
from collections.abc import Sequence

import kopf

from fsdp_operator.capacity.ec2 import Ec2ZoneAdvisor
from fsdp_operator.runtime.handlers import build_registry
from fsdp_operator.runtime.operator_options import add_operator_arguments
from fsdp_operator.runtime.settings import OperatorConfig
from fsdp_operator.runtime.shared import Runtime


class _QuietWakeups(logging.Filter):
    """Drops kopf's INFO line for each raw watch event: those handlers only wake a job's loop."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Handler '") and message.endswith("_event' succeeded."))


LOG_FORMATS = {"text": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}


def run_operator(
    namespace: str | Sequence[str] | None,
    liveness: str | None,
    *,
    metrics_port: int | None = None,
    peering: str | None = None,
    log_level: str = "INFO",
    log_format: str = "text",
) -> int:
    """Run until SIGINT/SIGTERM: the given namespaces, or all when `namespace` is None or empty.

    `liveness` like `http://0.0.0.0:8080/healthz` serves kopf's liveness probe; `metrics_port` serves
    Prometheus metrics; `peering` names the kopf peering object through which replicas elect one active
    operator (the others pause). Credentials: in-cluster or kubeconfig.
    """
    namespaces = [namespace] if isinstance(namespace, str) else list(namespace or [])
    kopf.configure(log_format=LOG_FORMATS[log_format])
    logging.getLogger().setLevel(log_level.upper())
    logging.getLogger("kopf.objects").addFilter(_QuietWakeups())
    # `availabilityZone: auto` asks AWS with the operator's own credentials (IRSA), found when first needed.
    runtime = Runtime(OperatorConfig.from_env(peering=peering), zones=Ec2ZoneAdvisor())
    if metrics_port:
        runtime.metrics.serve(metrics_port)
    registry = build_registry(runtime)
    kopf.run(
        registry=registry,
        standalone=peering is None,
        peering_name=peering,
        # Replicas must differ in priority: with equal ones kopf pauses them all. The highest one runs.
        priority=secrets.randbelow(2**31) if peering else 0,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
    )
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    return run_operator(
        args.namespace,
        args.liveness,
        metrics_port=args.metrics_port,
        peering=args.peering,
        log_level=args.log_level,
        log_format=args.log_format,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fsdp_operator", description=__doc__)
    add_operator_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
