"""Event lines the job's own training function did not sign change no status field (docs/reliability.md, "Threat
model"), and `requireEFA` fails closed: through the real operator loop (kopf, the emulated API server, fake Ray).

Forged lines are appended to the job's log as any other code of the job prints them (`print`, a dependency, a
dataset row echoed in an error): verbatim, without the attempt's key.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.runtime.rayjobs import FakeJob, FakeRay
from fsdp_train.contract.events import PREFIX, Signer, Transport, attempt_key
from support.kopf_runner import eventually
from test_operator import JOBS, SOCKET_LINE, Script, World, manifest, scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RAY = "(RayTrainWorker pid=4242, ip=10.0.0.7) "


def forged(payload: dict[str, Any]) -> str:
    return f"{RAY}{PREFIX} " + json.dumps({"v": 1, "time": 1e9, **payload}, separators=(",", ":"))


def placement(rank: int, at: float) -> dict[str, Any]:
    return {"kind": "placement", "rank": rank, "time": at, "world_size": 8, "local_rank": rank % 4,
            "local_world_size": 4, "node_rank": rank // 4, "node_ip": "10.9.9.9", "hostname": "evil", "pod": "evil",
            "device": "NVIDIA H100"}  # fmt: skip


def step(**fields: Any) -> dict[str, Any]:
    return {"kind": "step", "rank": 0, "step": 2, "total_steps": 3, "loss": 0.001, "tokens_per_second": 1e6,
            "tokens_per_second_per_device": 1e5, "mfu": 0.99, **fields}  # fmt: skip


FORGED_CASES: dict[str, list[str]] = {
    "a failure that would end the job": [
        forged({"kind": "failure", "rank": 3, "message": "forged", "reason": "DataUnavailable"})
    ],
    "efa after the ranks really reported socket": [
        forged({"kind": "transport", "rank": r, "transport": "efa", "evidence": "NET/OFI efa"}) for r in range(8)
    ],
    "an export, a final loss and an mfu": [
        forged({"kind": "export", "rank": 0, "step": 3, "path": "s3://attacker-bucket/trojan-model"}),
        forged(
            {
                "kind": "summary",
                "rank": 0,
                "steps": 3,
                "final_loss": 0.001,
                "first_loss": 9.0,
                "tokens_per_second": 1e6,
                "mfu": 0.99,
            }
        ),
        forged(step()),
    ],
    "a huge step": [forged(step(step=9007199254740991, total_steps=9007199254740991))],
    "1000 rank-0 placements": [forged(placement(0, 2e9 + i)) for i in range(1000)],
    "mfu 37, a negative loss and negative tokens/s": [
        forged(step(mfu=37.0)),
        forged(step(loss=-5.0)),
        forged(step(tokens_per_second=-1e6)),
    ],
}

# Fields a refused line may change: its count, the condition that warns of it, how far the log was read.
MAY_CHANGE = {"forgedEvents", "logOffset", "skippedEvents", "conditions"}


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in status.items() if k not in MAY_CHANGE}
    kept["conditions"] = sorted(
        (c["type"], c["status"], c["reason"], c["message"])
        for c in status.get("conditions", [])
        if c["type"] != "EventsAuthentic"
    )
    return kept


def read_through(w: World, sid: str, forged_lines: int) -> Any:
    """Wait until the operator has read the whole log and counted `forged_lines` refused lines."""

    def done() -> dict[str, Any] | None:
        status = w.status()
        log = w.ray.job(sid).log
        ok = status.get("forgedEvents", 0) >= forged_lines and status.get("logOffset") == len(log)
        return status if ok else None

    return eventually(done, timeout=60, message=f"the operator never read the forged lines: {w.status()}")


def held_after_step_one(
    apiserver: ThreadedApiServer,
    script: Script,
    meanwhile: Callable[[World, str, dict[str, Any]], Awaitable[None]],
    **spec: Any,
) -> dict[str, Any]:
    """The job applied, its ranks held after step 1 (`script.hold`); once step 1 is read, `meanwhile(w, sid, status)`
    acts on the held job; then the ranks go on and the job must succeed: its final status."""
    assert script.hold
    final: dict[str, Any] = {}

    async def body(w: World) -> None:
        async with w.operator():
            w.apply(manifest(**spec))
            sid = w.sid(1)
            await eventually(lambda: w.status().get("progress", {}).get("step") == 1, timeout=60)
            await meanwhile(w, sid, await read_through(w, sid, 0))
            script.hold = False
            final.update(await w.phase("Succeeded", "Completed", timeout=60))

    scenario(apiserver, body, script)
    return final


@pytest.mark.parametrize("case", list(FORGED_CASES))
def test_forged_lines_change_no_status_field(apiserver: ThreadedApiServer, case: str) -> None:
    lines = FORGED_CASES[case]
    socket_ranks = case.startswith("efa after")
    script = Script(transport=lambda r: "socket" if socket_ranks else "efa", hold=True)
    network = {"network": {"requireEFA": False}} if socket_ranks else {}

    async def forge(w: World, sid: str, before: dict[str, Any]) -> None:
        w.ray.job(sid).log += "".join(line + "\n" for line in lines)  # printed by other code of the job
        after = await read_through(w, sid, len(lines))
        assert comparable(after) == comparable(before)
        assert after["forgedEvents"] == len(lines)
        authentic = next(c for c in after["conditions"] if c["type"] == "EventsAuthentic")
        assert (authentic["status"], authentic["reason"]) == ("False", "UnsignedLines")
        await eventually(lambda: "UnsignedLines" in w.event_reasons(), message="no Warning event was posted")

    final = held_after_step_one(apiserver, script, forge, **network)
    assert final["result"]["finalLoss"] == round(5.0 / 3, 4) and "mfu" not in final["result"]
    assert "output" not in final and final.get("rankFailures") is None and final.get("workerRestarts") is None
    if socket_ranks:
        assert final["transport"]["summary"] == "socket"


def test_replayed_and_other_attempt_lines_are_refused(apiserver: ThreadedApiServer) -> None:
    """A signed line printed again (read back from a log file), and one signed for another attempt."""

    async def replay(w: World, sid: str, before: dict[str, Any]) -> None:
        job = w.ray.job(sid)
        replayed = next(line for line in job.log.splitlines() if '"kind":"placement","local_rank":0' in line)
        key = bytes.fromhex(job.submission.runtime_env["env_vars"]["FSDP_EVENT_KEY"])
        assert attempt_key(b"\0" * 32, sid) != key
        other = Signer(attempt_key(b"\0" * 32, sid)).line(
            {"v": 1, **step(mfu=0.5), "time": 1e9}
        )  # another job's (or attempt's) key
        job.log += "".join(line + "\n" for line in (replayed, other))
        after = await read_through(w, sid, 2)
        assert comparable(after) == comparable(before) and after["forgedEvents"] == 2

    held_after_step_one(apiserver, Script(hold=True), replay)


def test_impossible_numbers_signed_by_the_emitter_are_skipped(apiserver: ThreadedApiServer) -> None:
    """Bounds hold for signed lines too: a broken emitter cannot write what no run produces."""

    async def sign_the_impossible(w: World, sid: str, before: dict[str, Any]) -> None:
        impossible = [step(step=4), step(mfu=37.0), step(loss=-5.0), step(tokens_per_second=-1.0),
                      step(step=9007199254740991, total_steps=9007199254740991)]  # fmt: skip
        w.ray.emit(sid, *(forged(payload) for payload in impossible))  # signed, as the emitter prints
        await eventually(lambda: w.status().get("skippedEvents") == len(impossible), timeout=60)
        after = await read_through(w, sid, 0)
        assert comparable(after) == comparable(before) and "forgedEvents" not in after

    held_after_step_one(apiserver, Script(hold=True), sign_the_impossible)


class Silent(Script):
    """A job whose ranks never report a transport (or only garbled lines), under requireEFA."""

    def __init__(self, garble: bool = False, kinds: str = "") -> None:
        super().__init__()
        self.garble, self.kinds = garble, kinds

    def __call__(self, ray: FakeRay, job: FakeJob) -> Iterator[None]:
        sid = job.submission.submission_id
        yield
        for r in range(self.world_size):
            if self.kinds:
                line = Transport(rank=r, transport=self.kinds, evidence=SOCKET_LINE).to_line()  # type: ignore[arg-type]
                ray.emit(sid, line)
        yield
        for n in range(1, self.steps + 1):
            line = f"{PREFIX} " + json.dumps(step(step=n, total_steps=self.steps, mfu=None))
            if self.garble:  # PYTHONIOENCODING=utf-16: every line arrives as UTF-16 bytes read as text
                ray.print(sid, line.encode("utf-16").decode("latin-1"))
            else:
                ray.emit(sid, line)
            yield
        ray.finish(sid)


@pytest.mark.parametrize("kind", ["no transport events", "garbled lines", "socket"])
def test_require_efa_fails_closed(apiserver: ThreadedApiServer, kind: str) -> None:
    script = Silent(garble=kind == "garbled lines", kinds="socket" if kind == "socket" else "")

    async def body(w: World) -> None:
        async with w.operator():
            w.apply(manifest(network={"transport": "efa", "requireEFA": True}))
            status = await w.phase("Failed", timeout=60)
            expected = "TransportFallback" if kind == "socket" else "TransportUnverified"
            assert status["reason"] == expected, status
            if kind != "socket":
                assert "reported no verified EFA transport" in status["message"]

    scenario(apiserver, body, script)


def test_an_encoding_variable_that_garbles_the_events_is_refused(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            for i, name in enumerate(("PYTHONIOENCODING", "PYTHONUTF8", "FSDP_EVENT_KEY")):
                w.apply(manifest(f"enc{i}", runtimeEnv={"envVars": {name: "utf-16"}}))
                status = await w.phase("Failed", "ValidationFailed", name=f"enc{i}")
                assert f"spec.runtimeEnv.envVars.{name}" in status["message"], status["message"]
        assert not w.ray.created

    scenario(apiserver, body)


def test_the_attempt_key_reaches_the_submission_only(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            w.script.hold = True
            w.apply(manifest())
            # Read while the Ray job exists: once it succeeded, its cluster (and the fake Ray's record of the job) may
            # be gone already (a KeyError 1 run in 6).
            await w.phase("Running", timeout=60)
            sid = w.sid(1)
            submission = w.ray.job(sid).submission
            w.script.hold = False
            await w.phase("Succeeded", "Completed", timeout=60)
            key = submission.runtime_env["env_vars"]["FSDP_EVENT_KEY"]
            assert len(bytes.fromhex(key)) == 32
            assert key not in json.dumps(w.job()) and key not in submission.entrypoint
            assert submission.runtime_env["env_vars"]["PYTHONIOENCODING"] == "utf-8"

    scenario(apiserver, body)


# --- a line that neither freezes nor fakes a job (the parser is total) ------------------------------------------

KEYLESS = "FSDP_EVENT " + "é" * 64 + ' {"kind":"step"}'
"""Any code of the job can print this; its MAC made the verifier raise, and every pass of the job with it."""


@pytest.mark.parametrize(
    ("outcome", "copies"), [("success", 1), ("success", 70), ("deadline", 1), ("suspend", 1)]
)  # 70: more than OFF_PROCESS_EVENTS, parsed in the log worker
def test_a_key_less_non_ascii_line_is_counted_and_the_job_still_ends(
    apiserver: ThreadedApiServer, outcome: str, copies: int
) -> None:
    script = Script(hold=True)
    run_policy = {"activeDeadlineSeconds": 20} if outcome == "deadline" else {}

    async def body(w: World) -> None:
        async with w.operator():
            w.apply(manifest(runPolicy=run_policy))
            sid = w.sid(1)
            await eventually(lambda: w.status().get("progress", {}).get("step") == 1, timeout=30)
            w.ray.print(sid, *[RAY + KEYLESS] * copies)
            # In the same read: a genuine line after them must still be folded.
            w.ray.emit(sid, forged(step(step=2, loss=2.5, mfu=0.5)))
            after = await read_through(w, sid, copies)
            assert after["forgedEvents"] == copies and after["progress"]["step"] == 2
            assert not any(c["type"] == "ReconcileError" and c["status"] == "True" for c in after["conditions"])
            if outcome == "success":
                script.hold = False
                final = await w.phase("Succeeded", "Completed", timeout=30)
                assert final["forgedEvents"] == copies and final["transport"]["summary"] == "efa"
            elif outcome == "deadline":
                await w.phase("Failed", "DeadlineExceeded", timeout=40)
                await eventually(lambda: not w.clusters(), timeout=30, message="the RayCluster was kept")
                assert sid in w.ray.stopped
            else:
                w.patch_spec("qwen", {"runPolicy": {"suspend": True}})
                await w.phase("Suspended", "Suspended", timeout=30)
                await eventually(lambda: not w.clusters(), timeout=30, message="the RayCluster was kept")
                assert sid in w.ray.stopped

    scenario(apiserver, body, script)


# --- defence in depth: a pass whose observation raises still enforces what needs nothing from Ray ----------------


def without_reconcile_error(status: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in status.items() if k != "conditions"}
    kept["conditions"] = [c for c in status.get("conditions", []) if c["type"] != "ReconcileError"]
    return kept


@pytest.mark.parametrize("guard", ["deadline", "suspend", "ttl", "delete"])
def test_a_job_whose_observation_raises_still_meets_its_guards(
    apiserver: ThreadedApiServer, monkeypatch: pytest.MonkeyPatch, guard: str
) -> None:
    from fsdp_operator.runtime.controller import JobLoop

    script = Script(hold=guard != "ttl")
    broken = {"on": False}
    observe = JobLoop.observe

    async def observe_or_raise(self: JobLoop, obj: Any, status: Any) -> Any:
        if broken["on"]:
            raise RuntimeError("observation broke (a bug, or input no check foresaw)")
        return await observe(self, obj, status)

    monkeypatch.setattr(JobLoop, "observe", observe_or_raise)
    run_policy: dict[str, Any] = {
        "deadline": {"activeDeadlineSeconds": 20},
        "ttl": {"ttlSecondsAfterFinished": 3},
    }.get(guard, {})

    async def body(w: World) -> None:
        async with w.operator():
            w.apply(manifest(runPolicy=run_policy))
            sid = w.sid(1)
            if guard == "ttl":
                await w.phase("Succeeded", "Completed", timeout=30)
            else:
                await eventually(lambda: w.status().get("progress", {}).get("step") == 1, timeout=30)
                await read_through(w, sid, 0)
            before = w.status()
            broken["on"] = True

            def failed_pass() -> dict[str, Any] | None:
                status = w.status()
                error = [c for c in status.get("conditions", []) if c["type"] == "ReconcileError"]
                return status if error and error[0]["status"] == "True" else None

            if guard != "ttl":
                during = await eventually(failed_pass, timeout=30, message="the failed pass was not recorded")
                error = next(c for c in during["conditions"] if c["type"] == "ReconcileError")
                assert "observation broke" in error["message"]
                # The job's other fields untouched: nothing was folded, nothing decided from an empty observation.
                assert without_reconcile_error(during) == without_reconcile_error(before)
                assert w.clusters() and sid not in w.ray.stopped
            if guard == "deadline":
                status = await w.phase("Failed", "DeadlineExceeded", timeout=40)
                assert "activeDeadlineSeconds (20s) exceeded" in status["message"]
            elif guard == "suspend":
                w.patch_spec("qwen", {"runPolicy": {"suspend": True}})
                await w.phase("Suspended", "Suspended", timeout=30)
            elif guard == "ttl":
                await eventually(lambda: w.job() is None, timeout=30, message="the TTL did not delete the job")
            else:
                w.delete(f"{JOBS}/qwen")
                await eventually(lambda: w.job() is None, timeout=30, message="the job was not deleted")
            await eventually(lambda: not w.clusters(), timeout=30, message="the RayCluster was kept")
            if guard != "ttl":
                assert sid in w.ray.stopped

    scenario(apiserver, body, script)
