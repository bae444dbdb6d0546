"""`fsdpctl`: the command line. Every user mistake ends in a one-line message and an exit code, never a traceback.

Exit codes: 0 success, 1 a finding (invalid spec, failed job, transport fallback), 2 unusable input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsdp_operator.api import generate, manifest_yaml, memory_rules, render, schema
from fsdp_operator.api.spec import Job, SpecError, train_config
from fsdp_operator.cli import data_check as data_check_cli
from fsdp_operator.cli.inputs import (
    EXIT_BAD_INPUT,
    EXIT_FINDING,
    EXIT_OK,
    InputError,
    load_job,
    load_job_from,
    load_manifest,
)
from fsdp_operator.runtime.operator_options import add_operator_arguments

MAX_PROBLEMS_SHOWN = 50


def print_problems(source: str, problems: list[str]) -> None:
    count = len(problems)
    print(f"{source}: invalid FSDPTrainingJob, {count} problem{'' if count == 1 else 's'}:", file=sys.stderr)
    for problem in problems[:MAX_PROBLEMS_SHOWN]:
        print(f"  {problem}", file=sys.stderr)
    if count > MAX_PROBLEMS_SHOWN:
        print(f"  ... and {count - MAX_PROBLEMS_SHOWN} more", file=sys.stderr)


def _dump(obj: Any, output: str) -> str:
    if output == "json":
        return json.dumps(obj, indent=2)
    return manifest_yaml.dump(obj)


def cmd_render(args: argparse.Namespace) -> int:
    job = load_job(args.file)
    if not job.uid:
        # Not created yet: the API server assigns the uid the ownerReference will carry.
        job = Job(job.name, job.namespace, "<uid-assigned-on-create>", job.generation, job.spec, job.labels)
    print(_dump(render.raycluster(job), args.output), end="")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    job = load_job(args.file)
    print(f"{args.file}: valid FSDPTrainingJob {job.namespace}/{job.name} ({job.spec.workers.world_size} ranks)")
    print(memory_rules.describe(memory_rules.judge(job.spec, train_config(job.spec))))
    return EXIT_OK


def cmd_crd(args: argparse.Namespace) -> int:
    print(_dump(generate.crd(), args.output), end="")
    return EXIT_OK


def cmd_diagnose_nccl(args: argparse.Namespace) -> int:
    from fsdp_operator.cli.diagnose import diagnose_nccl

    return diagnose_nccl(args.files, output=args.output)


def cmd_operator(args: argparse.Namespace) -> int:
    from fsdp_operator.runtime.operator_main import run_from_args

    return run_from_args(args)


def cmd_run_local(args: argparse.Namespace) -> int:
    from fsdp_operator.local.run import cannot_run_locally, default_timeout, preflight_problems, run_local

    manifest = load_manifest(args.file)  # read once: `-` is stdin
    try:
        job = load_job_from(args.file, manifest)
    except SpecError as e:
        # Nothing is started for a job that cannot run: bad input, like a file that is not YAML.
        print_problems(args.file, e.problems)
        return EXIT_BAD_INPUT
    if reason := cannot_run_locally(job):
        print(f"{args.file}: cannot run on this machine: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if problems := preflight_problems(job):
        # Every Ray node of run-local is this machine: what the job needs must be here, checked before a cluster.
        print(f"{args.file}: cannot run: what the job needs is not there", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    timeout = default_timeout(job) if args.timeout is None else args.timeout
    return run_local(manifest, keep=args.keep, timeout=timeout, status_out=args.status_out)


def cmd_make_model(args: argparse.Namespace) -> int:
    from fsdp_operator.cli.quiet import quiet_library_warnings
    from fsdp_operator.local.model import MakeModelError, make_model

    quiet_library_warnings()

    try:
        written = make_model(Path(args.directory), [Path(t) for t in args.text or []], vocab_size=args.vocab_size)
    except MakeModelError as e:
        raise InputError(str(e)) from e
    for line in written:
        print(line)
    print(f"use it with model: {{name: {args.directory}, init: pretrained}} (see examples/tiny-finetune.yaml)")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """One job in the current cluster: the run-local summary, its conditions and its loss curve."""
    import kubernetes
    import urllib3

    from fsdp_operator.decide.summary import loss_curve, summary_lines

    try:
        kubernetes.config.load_kube_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
        _, active = kubernetes.config.list_kube_config_contexts(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    except Exception as e:  # the client's loader raises whatever a malformed file makes it hit (YAML, TypeError, ...)
        where = args.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise InputError(f"no usable kubeconfig ({where}): {type(e).__name__}: {' '.join(str(e).split())}") from e
    namespace = args.namespace or (active.get("context") or {}).get("namespace") or "default"
    api = kubernetes.client.CustomObjectsApi()
    try:
        found: Any = api.get_namespaced_custom_object(schema.GROUP, schema.VERSION, namespace, schema.PLURAL, args.name)
    except kubernetes.client.ApiException as e:
        if e.status == 404:
            print(f"error: no {schema.KIND} {namespace}/{args.name}", file=sys.stderr)
            return EXIT_FINDING
        raise InputError(f"the API server answered {e.status}: {e.reason}") from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise InputError(f"cannot reach the API server: {e}") from e
    status = (found.get("status") if isinstance(found, dict) else None) or {}
    if args.output != "text":
        print(_dump(status, args.output).rstrip("\n"))
        return EXIT_OK
    print(f"{schema.KIND} {namespace}/{args.name}")
    print("\n".join(summary_lines(status)))
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    if conditions:
        print("\nconditions")
        width = max(len(str(c.get("type"))) for c in conditions)
        for c in conditions:
            print(f"  {str(c.get('type')).ljust(width)}  {c.get('status')!s:7} {c.get('reason', '')}")
    if curve := loss_curve(status):
        print("\n" + curve)
    if args.logs:
        log = status.get("failureLog")
        print("\nlast output lines of the failed Ray job\n" + str(log) if log else "\nno failure log in the status")
    elif status.get("failureLog"):
        print("\nthe failed Ray job's last output lines: fsdpctl status --logs " + args.name)
    return EXIT_FINDING if status.get("phase") == "Failed" else EXIT_OK


def cmd_capacity(args: argparse.Namespace) -> int:
    from fsdp_operator.cli import capacity as capacity_cli

    regions = [r.strip() for r in ",".join(args.regions or []).split(",") if r.strip()]
    return capacity_cli.run(
        args.instance_type, args.count, regions=regions, probe=args.probe, output=args.output, profile=args.profile
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fsdpctl", description="Run and inspect FSDPTrainingJobs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("render", help="print the RayCluster the operator would create (a GitOps dry run)")
    p.add_argument("-f", "--file", required=True, help="FSDPTrainingJob YAML, or - for stdin")
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("validate", help="check an FSDPTrainingJob; print every problem with its field path")
    p.add_argument("-f", "--file", required=True, help="FSDPTrainingJob YAML, or - for stdin")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("crd", help="print the FSDPTrainingJob CustomResourceDefinition")
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("diagnose", help="classify logs a user already has")
    diag = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    d = diag.add_parser("nccl", help="which network transport NCCL used, per file and per rank")
    d.add_argument("files", nargs="+", metavar="FILE", help="NCCL_DEBUG=INFO logs, or - for stdin")
    d.add_argument("-o", "--output", choices=["text", "json"], default="text")
    d.set_defaults(func=cmd_diagnose_nccl)

    p = sub.add_parser("capacity", help="where an instance type can run now: zones, quota, Spot scores, probes")
    p.add_argument("--instance-type", default="g6.12xlarge", help="EC2 instance type (default: g6.12xlarge)")
    p.add_argument("--count", type=int, default=2, help="instances needed in one zone (default: 2)")
    p.add_argument(
        "--regions", action="append", metavar="R1,R2", help="regions to check (default: every region enabled)"
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="reserve COUNT instances per zone and cancel at once: EC2's definitive answer (billed for seconds)",
    )
    p.add_argument("--profile", help="AWS profile (default: the usual boto3 chain)")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_capacity)

    p = sub.add_parser("operator", help="run the operator (kopf) against the current kubeconfig")
    add_operator_arguments(p)
    p.set_defaults(func=cmd_operator, liveness="http://0.0.0.0:8080/healthz")

    p = sub.add_parser("status", help="a job in the current cluster: summary, conditions, loss curve")
    p.add_argument("name", help="the FSDPTrainingJob's name")
    p.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    p.add_argument("-o", "--output", choices=["text", "yaml", "json"], default="text")
    p.add_argument(
        "--logs", action="store_true", help="also print the end of a failed job's output (status.failureLog)"
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("run-local", help="run a job end to end on this machine (emulated API server, local Ray)")
    p.add_argument("-f", "--file", required=True, help="FSDPTrainingJob YAML")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the job's RayCluster (runPolicy.cleanup: Keep) and everything else running until Ctrl-C; "
        "print a kubeconfig path",
    )
    p.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help="stop waiting and stop everything after this many seconds (default: the job's "
        "runPolicy.activeDeadlineSeconds + 120, when the operator has failed it anyway; no limit without one)",
    )
    p.add_argument(
        "--status-out",
        metavar="FILE",
        help="also write the final FSDPTrainingJob (JSON) to FILE (the last one seen when the run times out or "
        "is stopped)",
    )
    p.set_defaults(func=cmd_run_local)

    p = sub.add_parser("local", help="helpers for trying jobs on this machine")
    local = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    m = local.add_parser(
        "make-model",
        help="make a tiny Qwen2 and a BPE tokenizer trained on your text, offline (model.init: pretrained loads it)",
    )
    m.add_argument("directory", metavar="DIR", help="where to save them (save_pretrained layout)")
    m.add_argument(
        "--text",
        action="append",
        metavar="FILE",
        help="train the tokenizer on this text file (repeatable; default: a built-in corpus, also written as "
        "DIR/sample.jsonl to train on)",
    )
    m.add_argument("--vocab-size", type=int, default=512, choices=range(300, 65537), metavar="N",
                   help="tokenizer vocabulary size, 300..65536 (default: 512)")  # fmt: skip
    m.set_defaults(func=cmd_make_model)

    data_check_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SpecError as e:
        print_problems(getattr(args, "file", "spec"), e.problems)
        return EXIT_FINDING
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `fsdpctl ... | head`: the reader left; say nothing more (Python's own advice for SIGPIPE).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
