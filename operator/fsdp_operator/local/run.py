"""`fsdpctl run-local`: the whole system on one machine, on loopback only.

An emulated API server (real HTTP), the local KubeRay stand-in (real Ray processes), and the operator
itself in its own process (`fsdpctl operator`, unchanged, given a kubeconfig for the emulator). The job
is applied like `kubectl apply` would, its status is shown as it changes, and everything started here
is stopped again on success, failure and Ctrl-C: by process group, then by an environment marker that
every child inherits (Ray's worker processes start sessions of their own).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

from fsdp_operator.api import generate, queueing, schema
from fsdp_operator.api import spec as spec_mod
from fsdp_operator.api.spec import Job
from fsdp_operator.decide.summary import loss_curve, summary_lines
from fsdp_operator.local.cluster.kubelet import LocalKubelet
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD, LocalKubeRay, free_port
from fsdp_operator.local.cluster.processes import marked_processes
from fsdp_operator.local.server import rbac
from fsdp_operator.local.server.admission import OwnerReferencesPermissionEnforcement
from fsdp_operator.local.server.apiserver import ApiServer
from fsdp_operator.local.server.store import WatchEvent
from fsdp_operator.runtime import calls

Obj = dict[str, Any]

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
TERMINAL_PHASES = {"Succeeded", "Failed"}
RUN_MARKER = "FSDP_RUN_LOCAL"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
QUIET_SECONDS = 15.0
"""While a Ray job runs and no rank has reported, a line at least this often says it is still starting."""
STEP_LINE_SECONDS = 30.0
"""Without a terminal, a step line at least this often while training advances."""


def cannot_run_locally(job: Job) -> str:
    """Why this machine cannot run `job` (empty when it can): the local Ray nodes have CPUs only."""
    gpus = job.spec.workers.gpus_per_worker
    if gpus:
        return (
            f"spec.workers.gpusPerWorker is {gpus}, and run-local starts CPU-only Ray nodes (no GPU is used here): "
            "the job would wait for GPUs that never come. Set gpusPerWorker: 0, efaPerWorker: 0, "
            'instanceType: "" and network.transport: socket to run it here (see examples/tiny-cpu.yaml)'
        )
    if job.spec.queue_name or job.labels.get(queueing.QUEUE_LABEL):
        return (
            "spec.queueName (or the kueue.x-k8s.io/queue-name label) queues the RayCluster for Kueue, and run-local "
            "has no Kueue: the cluster would stay suspended. Leave the queue out to run it here (docs/kueue.md)"
        )
    return ""


def preflight_problems(job: Job) -> list[str]:
    """What `job` needs and this machine does not have (the Ray nodes of run-local are this machine), each
    naming its field: the user function's code directory, the data source, the tokenizer, the model's config.
    Seconds, before any cluster starts (fsdp_train.run.preflight; the same checks run again in the job)."""
    from fsdp_train.run import preflight

    function = job.spec.train_function
    if function is not None:
        return preflight.function_problems(function.callable, function.code)
    return preflight.job_problems(spec_mod.train_config(job.spec))


DEADLINE_ALLOWANCE_SECONDS = 120.0
"""After the job's activeDeadlineSeconds, how long run-local still waits: the operator fails the job at its
deadline, and this leaves time for that failure (and the cleanup) to be reported."""


def default_timeout(job: Job) -> float | None:
    """How long run-local waits for `job` when --timeout is not given: never less than the job's own spec allows.

    The job's runPolicy.activeDeadlineSeconds plus DEADLINE_ALLOWANCE_SECONDS; no limit (None) without one.
    """
    deadline = job.spec.run_policy.active_deadline_seconds
    return None if deadline is None else deadline + DEADLINE_ALLOWANCE_SECONDS


def manifest_to_apply(manifest: Obj, *, keep: bool) -> Obj:
    """The manifest run-local applies: with --keep, runPolicy.cleanup: Keep, so the operator leaves the RayCluster
    (and its Ray processes) in place after the job ends, as --keep promises."""
    applied = copy.deepcopy(manifest)
    if keep:
        spec = applied.setdefault("spec", {})
        spec.setdefault("runPolicy", {})["cleanup"] = "Keep"
    return applied


class Progress:
    """What changed in the job's status, as it happens: a line per status message, a step bar on a terminal."""

    def __init__(self, out: TextIO, started: float, *, data: bool = False) -> None:
        self.console = Console(file=out, highlight=False, soft_wrap=True)
        self.started = started
        self.seen: set[str] = set()
        self.said: tuple[str, str, str] | None = None
        self.bar: RichProgress | None = None
        self.bar_task: TaskID | None = None
        self.step_said, self.step_said_at = 0, started
        self.said_at = started
        self.data = data
        """The job reads a data source (not random tokens): its Ray driver prepares the data before any rank runs."""

    def line(self, text: str) -> None:
        self.said_at = time.monotonic()
        self.console.print(f"[{self.said_at - self.started:6.1f}s] {text}", markup=False)

    def once(self, key: str, text: str) -> None:
        if key not in self.seen:
            self.seen.add(key)
            self.line(text)

    def steps(self, step: int, total: int, loss: Any, tokens: Any) -> None:
        # A figure the run did not report is left out (a user function may report no rate), never shown as 0.
        detail = "  ".join(
            f"{name} {value}" for name, value in (("loss", loss), ("tokens/s", tokens)) if value is not None
        )
        if self.console.is_terminal:
            if self.bar is None:
                self.bar = RichProgress(
                    TextColumn("step {task.completed}/{task.total}"),
                    BarColumn(),
                    TextColumn("{task.fields[detail]}"),
                    TimeElapsedColumn(),
                    console=self.console,
                )
                self.bar.start()
                self.bar_task = self.bar.add_task("training", total=total, detail=detail)
            assert self.bar_task is not None
            self.bar.update(self.bar_task, completed=step, total=total, detail=detail)
            return
        # Not a terminal (a log file, CI): a line when the run passed the next tenth, and at least every
        # STEP_LINE_SECONDS while steps advance. Status holds the latest step only, and it is read every
        # half second, so an exact multiple of the tenth may never be seen.
        now = time.monotonic()
        tenth = max(total // 10, 1)
        if step <= self.step_said:
            return
        if (
            self.step_said == 0
            or step >= total
            or step // tenth > self.step_said // tenth
            or (now - self.step_said_at >= STEP_LINE_SECONDS)
        ):
            self.step_said, self.step_said_at = step, now
            self.line(f"step {step}/{total}  {detail}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def show(self, status: Obj) -> None:
        phase = status.get("phase", "")
        if not phase:
            return  # the operator has not written a status yet
        # A failure's message is printed once, at the end (after the summary), not here as well.
        message = "" if phase == "Failed" else str(status.get("message") or "")
        said = (str(phase), str(status.get("reason") or ""), message)
        if said != self.said:
            # Every change of the message is shown, not only phase changes: it is where the waiting is explained.
            self.said = said
            self.line(f"{said[0]}" + (f" ({said[1]})" if said[1] else "") + (f": {said[2]}" if said[2] else ""))
        self._still_waiting(status)
        for rank in status.get("ranks", []) or []:
            self.once(
                f"rank-{rank.get('rank')}",
                f"rank {rank.get('rank')} on node {rank.get('nodeRank')} ({rank.get('nodeIP')}, pod "
                f"{rank.get('pod')}), local rank {rank.get('localRank')}, device {rank.get('device')}",
            )
        transport = status.get("transport") or {}
        if summary := transport.get("summary"):
            self.once(f"transport-{summary}", f"transport {summary} (requested {transport.get('requested')})")
        interconnect = status.get("interconnect") or {}
        for scope, figures in interconnect.items():
            if isinstance(figures, dict) and "allreduceBusbwGBps" in figures:
                self.once(
                    f"probe-{scope}",
                    f"interconnect {scope}: all-reduce {figures['allreduceBusbwGBps']} GB/s, "
                    f"all-gather {figures.get('allgatherBusbwGBps')} GB/s",
                )
        progress = status.get("progress") or {}
        if "step" in progress:
            self.steps(
                int(progress["step"]),
                int(progress.get("totalSteps", 0)),
                progress.get("loss"),
                progress.get("tokensPerSecond"),
            )
        if "evalLoss" in progress:
            step = progress.get("evalStep")
            self.once(f"eval-{step}", f"eval loss {progress['evalLoss']} after step {step}")
        self._resumed(status, progress)
        output = status.get("output") or {}
        if path := output.get("path"):
            self.once(f"output-{path}", f"model exported to {path} (step {output.get('step')})")

    def _still_waiting(self, status: Obj) -> None:
        """A line every QUIET_SECONDS while the Ray job runs and no rank has reported yet: the Ray driver is
        starting the workers, and for a data job reading, tokenizing and packing the data first (a minute or
        more), which would otherwise pass in silence."""
        if status.get("phase") != "Running" or status.get("ranks") or (status.get("progress") or {}).get("step"):
            return
        if time.monotonic() - self.said_at < QUIET_SECONDS:
            return
        doing = "reading, tokenizing and packing the data, then " if self.data else ""
        self.line(f"still starting: {doing}starting the training workers (no rank has reported yet)")

    def _resumed(self, status: Obj, progress: Obj) -> None:
        """A rerun that continued from a checkpoint says so: from a `Resumed` condition when the status has one,
        else from the step the training reported it resumed from (progress while running, result at the end)."""
        for condition in status.get("conditions") or []:
            if isinstance(condition, dict) and condition.get("type") == "Resumed" and condition.get("status") == "True":
                self.once("resumed", f"resumed: {condition.get('message') or condition.get('reason')}")
                return
        result = status.get("result") or {}
        step = progress.get("resumedFromStep") or result.get("resumedFromStep")
        if step:
            self.once("resumed", f"resumed from the checkpoint of step {step}, not from the start")


def format_table(table: Obj) -> str:
    """A meta.k8s.io Table as kubectl prints it."""
    columns = [c["name"].upper() for c in table.get("columnDefinitions", []) if c.get("priority", 0) == 0]
    indexes = [i for i, c in enumerate(table.get("columnDefinitions", [])) if c.get("priority", 0) == 0]
    rows = [[str(row["cells"][i]) if row["cells"][i] is not None else "" for i in indexes] for row in table["rows"]]
    widths = [max(len(x) for x in column) for column in zip(columns, *rows, strict=False)]
    lines = [
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in [columns, *rows]
    ]
    return "\n".join(lines)


OPERATOR_ACCOUNT = "fsdp-operator"
OPERATOR_TOKEN = "fsdp-operator-token"
PERSON_TOKEN = "local"
"""The token of the kubeconfig run-local writes for the person: the `kubernetes` client (`fsdpctl status`) sends it
over plain HTTP, where kubectl sends none and is the anonymous admin; both act as a cluster admin."""


def operator_rbac(namespace: str) -> list[Obj]:
    """The operator's ClusterRole and Role (watching `namespace` only) with their bindings, from the call table."""
    cluster, namespaced = calls.required(watch_all=False, peering=False, node_notices=True)
    meta = {"name": OPERATOR_ACCOUNT}
    role_ref = {"apiGroup": rbac.RBAC_GROUP, "name": OPERATOR_ACCOUNT}
    subjects = [{"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT, "namespace": namespace}]
    api_version = f"{rbac.RBAC_GROUP}/v1"
    return [
        {"apiVersion": api_version, "kind": "ClusterRole", "metadata": meta, "rules": calls.rules(cluster)},
        {"apiVersion": api_version, "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": {**role_ref, "kind": "ClusterRole"}, "subjects": subjects},
        {"apiVersion": api_version, "kind": "Role", "metadata": {**meta, "namespace": namespace},
         "rules": calls.rules(namespaced)},
        {"apiVersion": api_version, "kind": "RoleBinding", "metadata": {**meta, "namespace": namespace},
         "roleRef": {**role_ref, "kind": "Role"}, "subjects": subjects},
    ]  # fmt: skip


class LocalRun:
    """One run-local session: the pieces it started, and how to stop them."""

    def __init__(self, manifest: Obj, workdir: Path, out: TextIO) -> None:
        self.manifest = manifest
        self.namespace = str(manifest.get("metadata", {}).get("namespace") or "default")
        self.name = str(manifest["metadata"]["name"])
        self.workdir = workdir
        self.out = out
        # The operator runs as a ServiceAccount with exactly the roles the call table names (the chart's, which
        # tests/integration/test_rbac.py holds equal to it), with OwnerReferencesPermissionEnforcement on. run-local
        # itself, the KubeRay stand-in and the person's kubectl (no token over plain HTTP) act as a cluster admin.
        self.access = rbac.Access(anonymous=rbac.User("admin", (rbac.MASTERS,)))
        self.access.add_token(OPERATOR_TOKEN, rbac.service_account(self.namespace, OPERATOR_ACCOUNT))
        self.access.add_token(PERSON_TOKEN, rbac.User("admin", (rbac.MASTERS,)))
        self.api = ApiServer(access=self.access, admission=OwnerReferencesPermissionEnforcement())
        self.kuberay = LocalKubeRay("", workdir / "r")
        # Pods are deleted gracefully, and the kubelet stand-in runs their preStop hooks (a worker can be drained).
        self.api.store.graceful_pods = True
        self.kubelet = LocalKubelet(self.kuberay)
        self.operator: asyncio.subprocess.Process | None = None
        self.http: aiohttp.ClientSession | None = None
        self.kubeconfig = workdir / "kubeconfig"
        self.operator_kubeconfig = workdir / "operator.kubeconfig"
        self.last_job: Obj | None = None  # the job as `follow` last read it

    @property
    def job_path(self) -> str:
        return f"/apis/{schema.GROUP}/{schema.VERSION}/namespaces/{self.namespace}/{schema.PLURAL}/{self.name}"

    async def _get(self, path: str, accept: str = "application/json") -> tuple[int, Obj]:
        assert self.http is not None
        async with self.http.get(self.api.url + path, headers={"Accept": accept}) as response:
            return response.status, await response.json(content_type=None)

    async def start(self) -> None:
        await self.api.start()
        crds = self.api.store.resource("customresourcedefinitions", "apiextensions.k8s.io")
        self.api.store.create(crds, generate.crd())
        self.api.store.create(crds, RAYCLUSTER_CRD)
        if self.namespace != "default":
            self.api.store.create(self.api.store.resource("namespaces"), {"metadata": {"name": self.namespace}})
        for doc in operator_rbac(self.namespace):
            group = doc["apiVersion"].split("/")[0]
            self.api.store.create(self.api.store.resource(doc["kind"].lower(), group), doc)
        self.write_kubeconfigs()
        self.http = aiohttp.ClientSession()
        self.kuberay.api_url = self.api.url
        self._kuberay_task = asyncio.get_running_loop().create_task(self.kuberay.run())
        self._kubelet_task = asyncio.get_running_loop().create_task(self.kubelet.run())
        await self.start_operator()

    def write_kubeconfigs(self) -> None:
        """The person's kubeconfig (kubectl, `fsdpctl status`, GitOps tools) and the operator's."""
        self.api.write_kubeconfig(self.kubeconfig, self.namespace, user={"token": PERSON_TOKEN})
        self.api.write_kubeconfig(self.operator_kubeconfig, self.namespace, user={"token": OPERATOR_TOKEN})

    async def start_operator(self) -> None:
        """The operator in its own process (again, after a crash: its log goes on in the same file)."""
        # Node notices on (the chart's nodeNotices.enabled): a taint on a local node drains its worker with a save.
        env = {**os.environ, "KUBECONFIG": str(self.operator_kubeconfig), "PYTHONUNBUFFERED": "1",
               "FSDP_NODE_NOTICES": "true"}  # fmt: skip
        log = (self.workdir / "operator.log").open("ab")
        self.operator = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "fsdp_operator.cli.main",
            "operator",
            f"--namespace={self.namespace}",
            f"--liveness=http://127.0.0.1:{free_port()}/healthz",
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()

    async def apply(self) -> None:
        assert self.http is not None
        path = f"/apis/{schema.GROUP}/{schema.VERSION}/namespaces/{self.namespace}/{schema.PLURAL}"
        async with self.http.post(self.api.url + path, json=self.manifest) as response:
            body = await response.json(content_type=None)
            if response.status >= 400:
                raise RuntimeError(f"the API server refused the job: {body.get('message', body)}")

    async def follow(self, progress: Progress, timeout: float | None) -> Obj:
        """Show status changes until the job is terminal (or `timeout` seconds, None: no limit); return the final
        object."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        shown = 0  # the resourceVersion of the last change shown
        while True:
            code, job = await self._get(self.job_path)
            if code == 200:
                self.last_job = job
                status = job.get("status") or {}
                # Every status the job had since the last look, from the API server's change history, in order: a
                # phase shorter than a poll (a drained worker's `Interrupted`, replaced within a pass) was missed.
                for change in self._changes_since(shown):
                    shown = max(shown, change.resource_version)
                    progress.show(change.object.get("status") or {})
                progress.show(status)
                if status.get("phase") in TERMINAL_PHASES:
                    return job
            if failures := self.kuberay.failures():
                # The operator would wait for the head to come back (a kubelet restarts it; this stand-in does not).
                raise RuntimeError("; ".join(failures) + " (run-local does not restart a Ray head)")
            if self.operator is not None and self.operator.returncode is not None:
                raise RuntimeError(f"the operator exited ({self.operator.returncode}); see {self.workdir}/operator.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job did not finish within --timeout {timeout:.0f} s")
            await asyncio.sleep(0.5)

    def _changes_since(self, version: int) -> list[WatchEvent]:
        key, changes = (schema.GROUP, schema.PLURAL), []
        with self.api.store.lock:  # the history is in resourceVersion order: only its new end is read
            for event in reversed(self.api.store.history):
                if event.resource_version <= version:
                    break
                if event.key == key:
                    changes.append(event)
        changes.reverse()
        ours = (self.namespace, self.name)
        return [e for e in changes if ((m := e.object.get("metadata") or {}).get("namespace"), m.get("name")) == ours]

    async def table(self) -> str:
        path = f"/apis/{schema.GROUP}/{schema.VERSION}/namespaces/{self.namespace}/{schema.PLURAL}"
        _, table = await self._get(path, TABLE_ACCEPT)
        return format_table(table)

    async def delete_job(self, timeout: float = 60) -> bool:
        """Delete the job as `kubectl delete` would, and wait for the operator to clean up behind it."""
        assert self.http is not None
        async with self.http.delete(self.api.url + self.job_path) as response:
            if response.status == 404:
                return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, _ = await self._get(self.job_path)
            if code == 404 and not self.kuberay.busy:
                return True
            await asyncio.sleep(0.5)
        return False

    async def stop(self) -> list[int]:
        """Stop everything started here; return the pids that were still alive afterwards."""
        if self.operator is not None and self.operator.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.operator.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.operator.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.operator.pid, signal.SIGKILL)
                await self.operator.wait()
        for task in (self._kuberay_task, self._kubelet_task):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.kubelet.close()
        await self.kuberay.close()
        if self.http is not None:
            await self.http.close()
        await self.api.stop()
        return marked_processes(f"{RUN_MARKER}={self.workdir}")


def code_for(status: Obj) -> int:
    """run-local's exit code for a job's final status."""
    return EXIT_SUCCEEDED if status.get("phase") == "Succeeded" else EXIT_FAILED


WORK_DIR_PREFIX = "fsdp-local-"
UNIX_SOCKET_PATH_MAX = 107
"""AF_UNIX's limit on a socket's path on Linux (`sun_path` is 108 bytes with its NUL); Ray checks its sockets
against it (`validate_socket_filename`) and a head whose path is longer never starts."""
RAY_SOCKET_UNDER_WORK_DIR = len("/r/c99/n99/session_2026-12-06_05-57-41_123456_4194304/sockets/plasma_store")
"""The longest path a Ray node's socket takes under run-local's work dir: the local KubeRay's cluster and node
folders (`kuberay.py`), Ray's session folder (date, time, microseconds, a pid up to Linux's 4194304) and socket."""


def work_dir_parent(tmpdir: str, fallback: str = "/tmp") -> tuple[str, str]:
    """Where run-local's work dir goes, and a line that says why when it is not `tmpdir`.

    Under `tmpdir` (TMPDIR) when Ray's socket paths fit there; else under `fallback` (a TMPDIR of macOS,
    `/var/folders/.../T/`, is 49 characters: the head never started, and run-local said so after 300 s).
    RuntimeError, naming the limit, when neither is short enough and writable."""
    work_dir = len(WORK_DIR_PREFIX) + 8 + 1  # mkdtemp's 8 random characters, and the separator
    longest = UNIX_SOCKET_PATH_MAX - RAY_SOCKET_UNDER_WORK_DIR - work_dir
    if len(tmpdir.rstrip("/")) <= longest:
        return tmpdir, ""
    if len(fallback) <= longest and os.access(fallback, os.W_OK | os.X_OK):
        return fallback, (
            f"the work dir is under {fallback}: under TMPDIR ({tmpdir}, {len(tmpdir)} characters) Ray's socket paths "
            f"would pass AF_UNIX's {UNIX_SOCKET_PATH_MAX} bytes"
        )
    raise RuntimeError(
        f"TMPDIR ({tmpdir}) is {len(tmpdir)} characters: Ray's socket paths under it would pass AF_UNIX's "
        f"{UNIX_SOCKET_PATH_MAX} bytes, and {fallback} is not writable; set TMPDIR to a directory of at most "
        f"{longest} characters"
    )


async def _run(manifest: Obj, keep: bool, timeout: float | None, out: TextIO, status_out: str | None) -> int:
    try:
        parent, moved = work_dir_parent(tempfile.gettempdir())
    except RuntimeError as e:
        out.write(f"error: {e}\n")
        return EXIT_BAD_INPUT
    workdir = Path(tempfile.mkdtemp(prefix=WORK_DIR_PREFIX, dir=parent))
    # Every process started below inherits this marker, so a leftover can be traced to its run.
    os.environ[RUN_MARKER] = str(workdir)
    run = LocalRun(manifest_to_apply(manifest, keep=keep), workdir, out)
    started = time.monotonic()
    data = str(((manifest.get("spec") or {}).get("data") or {}).get("source") or "random") != "random"
    progress = Progress(out, started, data=data)
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_requested.set)
    code = EXIT_FAILED
    saved = Path(status_out) if status_out else Path(tempfile.gettempdir()) / f"fsdp-run-local-{run.name}.json"
    saved_final = False
    handler = logging.FileHandler(workdir / "kuberay.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    stand_in_log = logging.getLogger("fsdp_operator.local.cluster.kuberay")
    stand_in_log.addHandler(handler)
    stand_in_log.setLevel(logging.INFO)
    try:
        if moved:
            progress.line(moved)
        await run.start()
        progress.line(f"API server {run.api.url}, work dir {workdir}")
        # At once, not at the end: kubectl, `fsdpctl status` and GitOps tools can watch the job while it runs.
        progress.line(
            f"kubeconfig {run.kubeconfig}: KUBECONFIG={run.kubeconfig} kubectl get trainingjobs -w, "
            f"or fsdpctl status {run.name}"
        )
        await run.apply()
        progress.line(f"applied {schema.KIND} {run.namespace}/{run.name}")
        progress.line(
            "no time limit (the job has no runPolicy.activeDeadlineSeconds); Ctrl-C stops everything"
            if timeout is None
            else f"waiting at most {timeout:.0f} s (--timeout)"
        )
        if keep:
            progress.line("--keep: runPolicy.cleanup set to Keep, so the RayCluster stays after the job ends")
        follow = asyncio.ensure_future(run.follow(progress, timeout))
        interrupted = asyncio.ensure_future(stop_requested.wait())
        done, _ = await asyncio.wait({follow, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        if follow not in done:
            follow.cancel()
            progress.line("interrupted: stopping everything")
            return 130
        job = follow.result()
        interrupted.cancel()
        progress.close()
        status = job.get("status", {})
        saved.write_text(json.dumps(job, indent=2))
        saved_final = True
        out.write(
            "\n"
            + "\n".join(summary_lines(status, saved_to=str(saved), message=code_for(status) == EXIT_SUCCEEDED))
            + "\n"
        )
        if curve := loss_curve(status):
            out.write("\n" + curve + "\n")
        out.write("\n" + await run.table() + "\n")
        code = code_for(status)
        if code == EXIT_FAILED:
            out.write(f"\njob failed: {status.get('reason')}: {status.get('message')}\n")
            if log := status.get("failureLog"):
                # The end of the job's output, for the detail behind that line: in a file, not on the screen.
                (workdir / "failure.log").write_text(str(log) + "\n")
                out.write(f"the job's last output lines: {workdir / 'failure.log'}\n")
        if keep:
            clusters = ", ".join(f"{c.name} (Ray dashboard http://127.0.0.1:{c.dashboard_port})"
                                 for c in run.kuberay.clusters.values()) or "none"  # fmt: skip
            out.write(
                f"\n--keep: the job, the API server and the RayCluster are still running; RayCluster: {clusters}."
                f" Try:\n  KUBECONFIG={run.kubeconfig} kubectl get trainingjobs,rayclusters,pods\n"
                "Press Ctrl-C to stop.\n"
            )
            out.flush()
            await stop_requested.wait()
        elif not await run.delete_job():
            progress.line("the job was not cleaned up within 60 s; stopping its processes directly")
        return code
    except (RuntimeError, TimeoutError) as e:
        progress.close()
        progress.line(f"error: {e}")
        return EXIT_FAILED
    finally:
        progress.close()
        if not saved_final and run.last_job is not None:
            # Timed out, interrupted or broken: what a pipeline reading the file gets is the last status seen (the
            # exit code says the job did not finish), not nothing.
            saved.write_text(json.dumps(run.last_job, indent=2))
            phase = (run.last_job.get("status") or {}).get("phase") or "no status yet"
            progress.line(f"the job's last status seen (phase {phase}) saved to {saved}")
        left = await run.stop()
        if run.access.denied:
            refused = sorted(
                {f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''}" for c in run.access.denied}
            )
            progress.line(f"warning: RBAC refused the operator {len(run.access.denied)} requests: {', '.join(refused)}")
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if left:
            progress.line(f"warning: processes still alive after stop: {left}")
        else:
            progress.line("stopped every process this run started")
        stand_in_log.removeHandler(handler)
        handler.close()
        if code == EXIT_SUCCEEDED and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            progress.line(f"logs (operator, Ray nodes) kept in {workdir}")
        out.flush()


def run_local(
    manifest: Obj,
    *,
    keep: bool = False,
    timeout: float | None = None,
    status_out: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Run one validated job manifest end to end; 0 when it succeeded, 1 when it failed or timed out.

    `timeout` None waits as long as the job runs (see `default_timeout`)."""
    return asyncio.run(_run(manifest, keep, timeout, out, status_out))
