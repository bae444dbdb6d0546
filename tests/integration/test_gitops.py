"""What GitOps tools make of a job, read from objects the operator itself wrote (docs/gitops.md).

Argo CD's health check (charts/fsdp-operator/argocd/.../health.lua) runs in a real Lua 5.1 (lupa; Argo CD runs
gopher-lua, a Lua 5.1), kstatus's rules (`support.kstatus`, Flux's health checks) and the real `kubectl wait` on the
statuses the operator writes in each phase, captured from the API server's change history while the real operator
runs jobs (the emulated API server, fake Ray). The Argo CD testdata (`testdata/*.yaml` beside health.lua, in Argo CD's
upstream layout with `health_test.yaml`) are such captures; `FSDP_WRITE_ARGOCD_TESTDATA=1 pytest
tests/integration/test_gitops.py` writes them again.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.decide.lifecycle import with_lifecycle_conditions
from fsdp_operator.decide.status import JobStatus, Phase, Reason
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.local.server.rbac import MASTERS, User
from hypothesis import given, settings
from hypothesis import strategies as st
from support import k8s_tools, kstatus
from support.kopf_runner import eventually
from test_kueue import QueueWorld, queued
from test_kueue import run as run_in_queue
from test_operator import Script, World, manifest, scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ARGOCD = (
    Path(__file__).resolve().parents[2] / "charts/fsdp-operator/argocd/resource_customizations/fsdp.dev/FSDPTrainingJob"
)
ON_ITS_WAY = {"Pending", "Provisioning", "Submitting", "Running", "Preempted"}
# What each tool must say of a job in each phase: Argo CD's health, kstatus's status.
NOW = datetime(2026, 12, 6, tzinfo=UTC)
EXPECTED = {
    **{phase: ("Progressing", kstatus.IN_PROGRESS) for phase in ON_ITS_WAY},
    "Suspended": ("Suspended", kstatus.IN_PROGRESS),
    "Queued": ("Suspended", kstatus.IN_PROGRESS),
    "Succeeded": ("Healthy", kstatus.CURRENT),
    "Failed": ("Degraded", kstatus.FAILED),
}


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """Argo CD's health of `obj`: health.lua run as Argo CD runs a health check (the object as the global `obj`)."""
    from lupa.lua51 import LuaRuntime

    lua = LuaRuntime(unpack_returned_tuples=True)
    check = lua.eval("function(obj) " + (ARGOCD / "health.lua").read_text() + " end")
    result = check(lua.table_from(obj, recursive=True))
    return {"status": str(result["status"]), "message": str(result["message"])}


def stored(obj: dict[str, Any]) -> dict[str, Any]:
    """An object as a client reads it, without the API server's bookkeeping that says nothing of the job."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("managedFields", "uid", "resourceVersion")}
    return {"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", **obj, "metadata": meta}


def history(w: World, name: str = "qwen") -> list[dict[str, Any]]:
    with w.api.store.lock:
        changes = [e.object for e in w.api.store.history if e.key == ("fsdp.dev", "fsdptrainingjobs")]
    return [stored(obj) for obj in changes if obj["metadata"]["name"] == name]


def first_in(objects: list[dict[str, Any]], phase: str, reason: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["status"].get("phase") == phase]
    found = [o for o in found if reason is None or o["status"].get("reason") == reason]
    assert found, f"no status in phase {phase}/{reason}: {[(o.get('status') or {}).get('phase') for o in objects]}"
    return found[0]


def capture() -> dict[str, dict[str, Any]]:
    """One stored object per case, from real runs of the operator: a run that succeeds, with a spec edit (a mutable
    field) before the operator observed it, a suspended one, a failed one and one whose workers never join."""
    captured: dict[str, dict[str, Any]] = {}

    async def runs(w: World) -> None:
        async with w.operator():
            await w.held_running()
            # The capture needs a Running status with its progress: the ranks hold after their first step, and that
            # step's progress is written at most 5 s after it (progress-only writes are rate-limited).
            await eventually(lambda: w.status().get("progress"), message="no progress while running")
            w.patch_spec("qwen", {"runPolicy": {"backoffLimit": 2}})  # mutable: observed within one pass
            await eventually(lambda: w.status().get("observedGeneration") == 2, message="the edit was not observed")
            w.script.hold = False
            await w.phase("Succeeded")
            w.apply(manifest("paused"))
            await w.phase("Running", name="paused")
            w.patch_spec("paused", {"runPolicy": {"suspend": True}})
            await w.phase("Suspended", name="paused")
            w.kuberay.never_ready = True
            w.apply(manifest("waiting", runPolicy={"waitForWorkersTimeoutSeconds": 600}))
            await w.phase("Provisioning", "WorkersNotReady", name="waiting")
        objects = [o for o in history(w) if o.get("status")]  # the create itself has none yet
        captured["provisioning"] = first_in(objects, "Provisioning")
        captured["submitting"] = first_in(objects, "Submitting")
        captured["running"] = first_in([o for o in objects if o["status"].get("progress")], "Running")
        edited = [o for o in objects if o["metadata"]["generation"] == 2]
        captured["edited-not-yet-observed"] = edited[0]
        assert edited[0]["status"]["observedGeneration"] == 1, edited[0]["status"]
        captured["succeeded"] = first_in(objects, "Succeeded")
        captured["suspended"] = first_in([o for o in history(w, "paused") if o.get("status")], "Suspended")
        waiting = [o for o in history(w, "waiting") if o.get("status")]
        captured["workers-not-ready"] = first_in(waiting, "Provisioning", "WorkersNotReady")

    async def failing(w: World) -> None:
        async with w.operator():
            w.apply(manifest())
            await w.phase("Failed", "RayJobFailed")
        captured["failed"] = first_in([o for o in history(w) if o.get("status")], "Failed")

    async def queued_and_preempted(w: QueueWorld) -> None:
        """Kueue's double (tests/integration/test_kueue.py): a job waits in the queue, another is preempted."""
        w.checkpoints.hold_at["low"] = 3
        async with w.operator():
            w.apply(queued("low", runPolicy={"backoffLimit": 0}))
            await eventually(lambda: (w.status("low").get("checkpoint") or {}).get("step") == 3, timeout=60)
            urgent = queued("urgent")
            urgent["metadata"]["labels"] = {"kueue.x-k8s.io/priority-class": "high"}
            w.apply(urgent)
            await w.phase_passed("Preempted", "Preempted", name="low")
            w.checkpoints.hold_at.clear()
            await w.phase("Succeeded", name="low", timeout=60)
        low = [o for o in history(w, "low") if o.get("status")]
        captured["preempted"] = first_in(low, "Preempted")
        captured["queued"] = first_in([o for o in low if o["status"]["queue"].get("preemptions")], "Queued")

    with ThreadedApiServer() as apiserver:
        scenario(apiserver, runs)
    with ThreadedApiServer() as apiserver:
        scenario(apiserver, failing, Script(fail_attempts={1}))
    with ThreadedApiServer() as apiserver:
        run_in_queue(QueueWorld(apiserver, priorities={"high": 100}), queued_and_preempted)
    return captured


@pytest.fixture(scope="module")
def captured() -> dict[str, dict[str, Any]]:
    objects = capture()  # on servers of their own (the `apiserver` fixture is per test): shared by the module
    if os.environ.get("FSDP_WRITE_ARGOCD_TESTDATA"):
        write_testdata(objects)
    return objects


def write_testdata(objects: dict[str, dict[str, Any]]) -> None:
    (ARGOCD / "testdata").mkdir(exist_ok=True)
    tests = []
    for case, obj in sorted(objects.items()):
        (ARGOCD / "testdata" / f"{case}.yaml").write_text(yaml.safe_dump(obj, sort_keys=False))
        tests.append({"healthStatus": argocd_health(obj), "inputPath": f"testdata/{case}.yaml"})
    (ARGOCD / "health_test.yaml").write_text(yaml.safe_dump({"tests": tests}, sort_keys=False))


def expected_for(obj: dict[str, Any]) -> tuple[str, str]:
    if obj["metadata"]["generation"] != obj["status"]["observedGeneration"]:
        return "Progressing", kstatus.IN_PROGRESS
    return EXPECTED[obj["status"]["phase"]]


def test_every_tool_reads_each_phase_the_operator_wrote_as_it_is(captured: dict[str, dict[str, Any]]) -> None:
    """A failed job Degraded and Failed (it read as healthy, Current), a running one Progressing and InProgress, a
    succeeded one Healthy and Current; an edit not yet observed InProgress (kstatus's generation rule)."""
    for case, obj in captured.items():
        health, reading = argocd_health(obj), kstatus.compute(obj)
        assert (health["status"], reading[0]) == expected_for(obj), (case, health, reading, obj["status"])
        if obj["status"]["phase"] == "Failed":
            assert obj["status"]["message"] in health["message"] and reading[1] == obj["status"]["message"]
    assert "generation 2" in argocd_health(captured["edited-not-yet-observed"])["message"]


def test_argocds_own_test_cases_pass_and_are_what_the_operator_writes(captured: dict[str, dict[str, Any]]) -> None:
    """health_test.yaml, as Argo CD's `resource_customizations` tests run it: each input's health is the one written
    down. The inputs are captures like the ones above; each says what a fresh capture of its case says."""
    cases = yaml.safe_load((ARGOCD / "health_test.yaml").read_text())["tests"]
    assert {Path(c["inputPath"]).stem for c in cases} == set(captured)
    for case in cases:
        obj = yaml.safe_load((ARGOCD / case["inputPath"]).read_text())
        assert argocd_health(obj) == case["healthStatus"], case["inputPath"]
        fresh = captured[Path(case["inputPath"]).stem]
        assert argocd_health(fresh)["status"] == case["healthStatus"]["status"] == expected_for(obj)[0]


def test_the_argocd_cm_snippet_is_the_health_check() -> None:
    """What docs/gitops.md tells a user to add to argocd-cm carries health.lua as it is."""
    snippet = yaml.safe_load((ARGOCD.parents[2] / "argocd-cm.yaml").read_text())
    assert (
        snippet["data"]["resource.customizations.health.fsdp.dev_FSDPTrainingJob"]
        == (ARGOCD / "health.lua").read_text()
    )
    assert (ARGOCD.parents[2] / "argocd-cm.yaml").read_text() in (
        Path(__file__).resolve().parents[2] / "docs" / "gitops.md"
    ).read_text()


@settings(max_examples=300, deadline=None)
@given(
    phase=st.sampled_from(list(Phase)),
    reason=st.sampled_from(list(Reason)),
    message=st.text(max_size=60),
    behind=st.booleans(),
)
def test_no_phase_reads_healthy_or_current_unless_the_job_succeeded(
    phase: Phase, reason: Reason, message: str, behind: bool
) -> None:
    """Any phase, reason and message the status can hold, with the spec observed or not."""
    status = with_lifecycle_conditions(
        JobStatus(),
        JobStatus(phase=phase, reason=reason, message=message, observed_generation=2),
        now=NOW,
        generation=2,
    )
    obj = {"metadata": {"name": "j", "generation": 3 if behind else 2}, "status": status.to_dict()}
    health, reading = argocd_health(obj)["status"], kstatus.compute(obj)[0]
    done = phase == Phase.SUCCEEDED and not behind
    assert (health == "Healthy") == done and (reading == kstatus.CURRENT) == done, (health, reading)
    assert (health == "Degraded") == (reading == kstatus.FAILED) == (phase == Phase.FAILED and not behind)


def test_kubectl_wait_for_complete_failed_and_the_phase(apiserver: ThreadedApiServer, kubeconfig: Path) -> None:
    """Pipelines wait with the real kubectl: `--for=condition=Complete` returns once the job succeeded,
    `--for=condition=Failed` once another failed, `--for=jsonpath` on the phase."""
    k8s_tools.needed("kubectl")

    def wait(*args: str) -> Any:
        return asyncio.to_thread(k8s_tools.run_kubectl, kubeconfig, "wait", *args, check=False, timeout=120)

    async def body(w: World) -> None:
        w.access.anonymous = User("system:anonymous", (MASTERS,))  # kubectl sends no token over plain HTTP
        async with w.operator():
            w.script.hold = True
            w.apply(manifest("good"))
            await w.phase("Running", name="good")
            complete = asyncio.ensure_future(wait("--for=condition=Complete", "trainingjob/good", "--timeout=90s"))
            phase = asyncio.ensure_future(
                wait("--for=jsonpath={.status.phase}=Succeeded", "trainingjob/good", "--timeout=90s")
            )
            w.script.hold = False
            for waited in (complete, phase):
                result = await waited
                assert result.returncode == 0 and "condition met" in result.stdout, (result.stdout, result.stderr)
            assert w.status("good")["phase"] == "Succeeded"
            w.script.fail_attempts = {1}
            w.apply(manifest("bad"))
            failed = await wait("--for=condition=Failed", "trainingjob/bad", "--timeout=90s")
            assert failed.returncode == 0 and "condition met" in failed.stdout, (failed.stdout, failed.stderr)
            assert w.status("bad")["phase"] == "Failed"
            # A job that never fails (and one that never completes): the wait times out, with kubectl's own words.
            never = await wait("--for=condition=Failed", "trainingjob/good", "--timeout=2s")
            assert never.returncode != 0 and "timed out" in never.stderr
            never = await wait("--for=condition=Complete", "trainingjob/bad", "--timeout=2s")
            assert never.returncode != 0 and "timed out" in never.stderr

    scenario(apiserver, body)


# One valid edit of each field the CRD's rules make immutable once the operator took the job (a new field without one
# fails the test below), and of each mutable one.
IMMUTABLE_EDITS: dict[str, Any] = {
    "spec.image": "rayproject/ray:2.58.0-py311-gpu",
    "spec.imagePullPolicy": "Always",
    "spec.rayVersion": "2.57.0",
    "spec.serviceAccountName": "trainer",
    "spec.runAsUser": 1000,
    "spec.model": {"name": "Qwen/Qwen2.5-0.5B"},
    "spec.head": {"cpu": "3"},
    "spec.workers": {"replicas": 3},
    "spec.network": {"requireEFA": False},
    "spec.placement": {"availabilityZone": "auto"},
    "spec.training": {"steps": 30},
    "spec.data": {"source": "s3://bucket/data.jsonl"},
    "spec.output": {"storage": "s3://bucket/out"},
    "spec.env": [{"name": "X", "value": "1"}],
    "spec.sharedVolume": {"claimName": "shared", "mountPath": "/shared"},
    "spec.runtimeEnv": {"pip": ["requests==2.32.0"]},
    "spec.trainFunction": {"callable": "pkg.mod:train", "code": "s3://bucket/code"},
    "spec.runPolicy.maxWorkerRestarts": 2,
    "spec.health": {"hangTimeoutSeconds": 600},
    "spec.tracking": {"mlflow": {"trackingUri": "http://mlflow:5000"}},
    "spec.queueName": "team-a",
}
MUTABLE_EDITS: dict[str, Any] = {
    "spec.runPolicy.backoffLimit": 2,
    "spec.runPolicy.activeDeadlineSeconds": 3600,
    "spec.runPolicy.waitForWorkersTimeoutSeconds": 100,
    "spec.runPolicy.ttlSecondsAfterFinished": 60,
    "spec.runPolicy.cleanup": "Keep",
    "spec.runPolicy.suspend": True,
}


def as_patch(path: str, value: Any) -> dict[str, Any]:
    patch: dict[str, Any] = value
    for key in reversed(path.split(".")):
        patch = {key: patch}
    return patch


def test_every_field_but_the_mutable_ones_is_refused_once_the_operator_took_the_job(
    apiserver: ThreadedApiServer,
) -> None:
    """The emulated API server evaluates the CRD's CEL rules (cel-rust): each edit of an immutable field of a job
    with a submission id is a 422 naming the field and how to run another spec; the mutable ones are taken; before
    the operator took the job (no submission id: new, or refused by validation) every field may change."""
    from fsdp_operator.api.generate import immutability_rules

    assert {r["fieldPath"].lstrip(".") for r in immutability_rules()} == set(IMMUTABLE_EDITS)
    w = World(apiserver)
    jobs = "/apis/fsdp.dev/v1alpha1/namespaces/default/fsdptrainingjobs"
    w.apply(manifest("taken"))
    w.patch_status("taken", {"phase": "Running", "submissionId": "taken-1"})
    w.apply(manifest("fresh"))
    for path, value in {**IMMUTABLE_EDITS, **MUTABLE_EDITS}.items():
        before = w.job("taken")
        assert before is not None
        response = w.http.patch(
            f"{apiserver.url}{jobs}/taken", json=as_patch(path, value),
            headers={"Content-Type": "application/merge-patch+json"}, timeout=10,
        )  # fmt: skip
        if path in MUTABLE_EDITS:
            assert response.status_code == 200, (path, response.text)
            assert response.json()["metadata"]["generation"] == before["metadata"]["generation"] + 1, path
        else:
            assert response.status_code == 422, (path, response.text)
            message = response.json()["message"]
            assert f"{path}: Forbidden: {path} cannot change once the operator has taken the job" in message, message
            assert "Flux: force: true" in message and w.job("taken") == before
        fresh = w.http.patch(
            f"{apiserver.url}{jobs}/fresh", json=as_patch(path, value),
            headers={"Content-Type": "application/merge-patch+json"}, timeout=10,
        )  # fmt: skip
        assert fresh.status_code == 200, (path, fresh.text)


def test_an_edit_of_a_finished_job_is_observed_and_takes_effect(apiserver: ThreadedApiServer) -> None:
    """A TTL set on a job that already Succeeded: observedGeneration follows the edit (kstatus read the job as
    InProgress for ever, and a Flux Kustomization waiting on it never became Ready), then the TTL deletes it."""

    async def body(w: World) -> None:
        async with w.operator():
            w.apply(manifest())
            await w.phase("Succeeded")
            await eventually(lambda: not w.clusters(), message="the finished job's cluster was not deleted")
            w.patch_spec("qwen", {"runPolicy": {"ttlSecondsAfterFinished": 2}})
            observed = await eventually(
                lambda: (job := w.job()) is not None and job["status"].get("observedGeneration") == 2 and job,
                message="the edit of the finished job was never observed",
            )
            assert kstatus.compute(stored(observed))[0] == kstatus.CURRENT
            await eventually(lambda: w.job() is None, message="the TTL set after the job finished was not applied")

    scenario(apiserver, body)


def test_a_rule_on_a_nested_field_refuses_its_edit_alone_and_leaves_the_objects_as_they_were() -> None:
    """The null-safe rule of `spec.runPolicy.maxWorkerRestarts` (it names `spec.runPolicy` and the field under it,
    each picked and merged by `local/server/cel_rules.py`): only that field's edit is refused, and neither object
    changes."""
    import copy

    from fsdp_operator.api import generate
    from fsdp_operator.local.server import cel_rules

    schema = generate.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    old = {**manifest("x"), "status": {"submissionId": "x-1"}}
    old["spec"]["runPolicy"] = {"maxWorkerRestarts": 1, "backoffLimit": 0}
    new = copy.deepcopy(old)
    new["spec"]["runPolicy"]["maxWorkerRestarts"] = 2
    before = (copy.deepcopy(new), copy.deepcopy(old))
    errors = cel_rules.violations(schema, new, old)
    assert [path for path, _ in errors] == ["spec.runPolicy.maxWorkerRestarts"]
    assert (new, old) == before
