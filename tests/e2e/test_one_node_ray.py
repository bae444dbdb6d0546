"""The default run's Ray cases: jobs as the operator submits them, on one real Ray node started once for both.

`fsdpctl run-local`'s jobs (tests/e2e/test_run_local.py, test_byo_function.py) start three Ray nodes, then a Ray
Train group per attempt: 260-580 s each in the default run, `slow` since issue 54. What they cover of Ray itself is
here, on a one-node Ray (its head with 4 CPUs and its job API) whose start both cases share: a user's function
submitted through the operator's own Ray client, a killed rank's group restarted and resumed, forged lines refused,
the status folded from the whole log (test_byo_function.py's ground); Ray Data feeding the bundled loop, which
evaluates, checkpoints and exports (test_data_ray.py's ground). run-local's own start and end are the default cases
of test_run_local.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from fsdp_operator.api import render
from fsdp_operator.api.render import Submission
from fsdp_operator.api.spec import parse_job
from fsdp_operator.decide.folding import fold_events
from fsdp_operator.decide.status import JobStatus
from fsdp_operator.runtime.job_secret import with_event_key
from fsdp_operator.runtime.rayjobs import RayJobInfo, RayJobsClient
from fsdp_operator.runtime.settings import default_training_package
from fsdp_train.contract import events as ev
from support.ray_cluster import RAY_TESTS, free_port, local_cluster, ray_available, run_ray_entry
from support.running_job import UID
from test_byo_function import CHECKS, function_job
from test_data_ray import POLL, events_of, make_assets, train_config

pytestmark = [pytest.mark.e2e, RAY_TESTS]


@dataclass(frozen=True)
class Node:
    address: str
    """The GCS address, for a driver started here (`RAY_ADDRESS`)."""
    dashboard: str
    """The job API's URL, for the operator's Ray client."""


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """One Ray node: two CPUs for a job's two ranks, two for Ray Data's tasks; its job API on a free port."""
    if not ray_available():
        pytest.skip("the ray command is not installed next to this Python")
    port = free_port()
    with local_cluster(workers=0, head_cpus=4, dashboard_port=port) as address:
        yield Node(address, f"http://127.0.0.1:{port}")


STEPS, CHECKPOINT_EVERY, KILL_AT_STEP = 5, 2, 3
FORGED_LINES = 3  # byo_checks.plain.FORGED, printed by every rank of every group


@pytest.mark.timeout(600)  # two groups of two Ray Train workers, on a loaded machine
def test_a_user_function_submitted_as_the_operator_submits_it_is_verified_and_resumes_after_a_killed_rank(
    node: Node, tmp_path: Path
) -> None:
    """The operator's own submission of a user function (its entrypoint, runtime environment and attempt key,
    `render.submission`) through its Ray client (`RayJobsClient`), two ranks. Rank 1 SIGKILLs itself after step 3;
    Ray Train restarts the group, which resumes from the step-2 checkpoint; every rank prints forged lines. The whole
    log, read as the operator reads it, folds into the status: placement, transport and probe before the function,
    every step's loss once, the checkpoints, the forged lines refused and counted."""
    config = {"steps": STEPS, "checkpoint_every": CHECKPOINT_EVERY, "kill_rank": 1, "kill_at_step": KILL_AT_STEP,
              "forge": True}  # fmt: skip
    function = {"callable": "byo_checks.functions:train", "code": str(CHECKS), "config": config}
    manifest = yaml.safe_load(function_job(tmp_path, "byo-fast", function).read_text())
    manifest["metadata"].update(namespace="default", uid=UID, generation=1)
    manifest["spec"]["workers"]["replicas"] = 1  # two ranks on the one node
    job = parse_job(manifest)
    sid = render.submission_id(job.name, job.uid, 1)
    job_key = b"k" * 32
    submission = with_event_key(render.submission(job, sid, default_training_package()), job_key)
    log, final = asyncio.run(submit_and_read(node.dashboard, submission))
    assert final.status == "SUCCEEDED", log[-4000:]
    parsed = ev.parse_log(log.splitlines(), ev.Verifier(ev.attempt_key(job_key, sid)))
    events = list(parsed.events)

    # Two groups of two ranks placed, each before its function ran; the socket transport and the probe of all ranks.
    assert sorted(e.rank for e in events if isinstance(e, ev.Placement)) == [0, 0, 1, 1], log[-4000:]
    assert {(e.rank, e.transport) for e in events if isinstance(e, ev.Transport)} == {(0, "socket"), (1, "socket")}
    assert any(isinstance(e, ev.Probe) and e.scope == "all" and e.ranks == 2 for e in events)
    # What the function reported: steps 1..3 of the first group, then 3..5 of the restarted one, which resumed
    # from the step-2 checkpoint (its own `resumed_from` figure).
    steps = [e for e in events if isinstance(e, ev.Step)]
    assert [e.step for e in steps] == [1, 2, 3, 3, 4, 5], steps
    assert steps[-1].extra["resumed_from"] == CHECKPOINT_EVERY
    assert sorted({e.step for e in events if isinstance(e, ev.Checkpoint)}) == [2, 4]
    # Each rank of each group printed the forged lines: every one refused, none of them an event.
    assert parsed.forged == FORGED_LINES * 2 * 2
    assert not any(isinstance(e, ev.Failure) and "forged" in e.message for e in events)

    status = fold_events(job, JobStatus(), events, now=datetime.now(UTC), forged=parsed.forged).status
    progress = status.progress
    assert (progress["step"], progress["totalSteps"]) == (STEPS, STEPS), progress
    assert [step for step, _ in progress["lossHistory"]] == list(range(1, STEPS + 1))
    assert status.checkpoint["step"] == 4 and Path(status.checkpoint["path"], "state.pt").is_file()
    assert status.transport["summary"] == "socket" and status.forged_events == FORGED_LINES * 2 * 2


async def submit_and_read(dashboard: str, submission: Submission) -> tuple[str, RayJobInfo]:
    """Submit through the operator's Ray client, wait for the job to end, read its whole log as the operator does."""
    client = RayJobsClient(dashboard, timeout=60)
    try:
        assert await client.submit(submission)
        info = await client.info(submission.submission_id)
        deadline = time.monotonic() + 480
        while info is None or info.status not in ("SUCCEEDED", "FAILED", "STOPPED"):
            assert time.monotonic() < deadline, f"the Ray job did not end: {info}"
            await asyncio.sleep(1.0)
            info = await client.info(submission.submission_id)
        log = ""
        while chunk := await client.logs(submission.submission_id, len(log), final=True):
            log += chunk
        return log, info
    finally:
        client.forget(submission.submission_id)


@pytest.mark.timeout(600)  # Ray Data's tasks and a group of two Ray Train workers, on a loaded machine
def test_ray_data_feeds_the_bundled_loop_which_evaluates_checkpoints_and_exports(node: Node, tmp_path: Path) -> None:
    """Ray Data reads, tokenizes and packs the corpus in the driver (`python -m fsdp_train.run.ray_entry`), and the
    bundled loop (Ray Train's entry, `train_fn_per_worker`) trains two ranks on those rows, evaluates on the held-out
    ones, checkpoints and exports."""
    assets = make_assets(tmp_path / "assets")
    export = tmp_path / "export"
    train = train_config(assets, steps=4, validation_split=0.2, eval_every_steps=2, checkpoint_interval=2,
                         checkpoint_path=str(tmp_path / "ckpt"), output_path=str(export))  # fmt: skip
    job = {"train": train, "scaling": {"num_workers": 2, "use_gpu": False, "resources_per_worker": {"CPU": 1}},
           "storage_path": str(tmp_path / "storage"), "name": "fed"}  # fmt: skip
    proc = run_ray_entry(node.address, job, timeout=400, FSDP_TRAIN_DATA_CACHE=str(tmp_path / "cache"), **POLL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    events = events_of(proc.stdout)
    assert sorted(e.rank for e in events if isinstance(e, ev.Placement)) == [0, 1]
    steps = [e for e in events if isinstance(e, ev.Step)]
    assert [e.step for e in steps] == [1, 2, 3, 4]
    # Real documents, not random tokens: each step took its samples of the packed rows, in the sampler's order.
    assert [e.samples_seen for e in steps] == [4, 8, 12, 16] and len({e.samples_digest for e in steps}) == 4
    evaluations = [e for e in events if isinstance(e, ev.Evaluation)]
    assert [e.step for e in evaluations] == [2, 4] and all(e.tokens > 0 for e in evaluations), evaluations
    assert sorted({e.step for e in events if isinstance(e, ev.Checkpoint)}) == [2, 4]
    (exported,) = [e for e in events if isinstance(e, ev.Export)]
    assert exported.step == 4 and exported.path == str(export)
    assert (export / "config.json").is_file() and (export / "model.safetensors").is_file()
    (summary,) = [e for e in events if isinstance(e, ev.Summary) and e.rank == 0]
    assert summary.steps == 4 and summary.final_loss is not None
