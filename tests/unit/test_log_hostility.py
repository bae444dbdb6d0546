"""The operator survives any log it reads: hostile event lines, NCCL lines built to backtrack, and statuses
that stay within what the CRD declares and within their size budget."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest
from fsdp_operator.api import formats, generate, schema
from fsdp_operator.api.spec import parse_job
from fsdp_operator.decide.budget import status_budget, within_budget
from fsdp_operator.decide.folding import fold_events
from fsdp_operator.decide.status import JobStatus
from fsdp_train.contract.events import (
    MALFORMED,
    Event,
    Failure,
    Placement,
    Transport,
    clean_text,
    parse_event,
    parse_log,
)
from fsdp_train.contract.nccl import classify_by_rank, classify_text
from support.hostile_logs import corpus, event_lines, nccl_lines

NOW = datetime(2026, 1, 1, tzinfo=UTC)
STATUS_SCHEMA = generate.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


def job(replicas: int = 2, ranks_per_worker: int = 4) -> Any:
    """A job of replicas x ranks_per_worker ranks: g6.12xlarge (4 GPUs), p5.48xlarge (8), else CPU workers."""
    instance = {4: "g6.12xlarge", 8: "p5.48xlarge"}.get(ranks_per_worker, "")
    workers: dict[str, Any] = {"replicas": replicas, "instanceType": instance, "gpusPerWorker": ranks_per_worker}
    network: dict[str, Any] = {}
    if not instance:
        workers.update(gpusPerWorker=0, efaPerWorker=0, ranksPerWorker=ranks_per_worker)
        network = {"transport": "socket"}
    elif instance == "p5.48xlarge":
        workers["efaPerWorker"] = 32
    return parse_job(
        {
            "apiVersion": schema.API_VERSION,
            "kind": schema.KIND,
            "metadata": {"name": "hostile", "namespace": "default", "uid": "u-1"},
            "spec": {"workers": workers, "network": network},
        }
    )


def test_the_corpus_covers_every_class_docs_reliability_counts() -> None:
    classes = {kind for kind, _ in corpus()}
    assert classes == {
        "malformed JSON", "unknown or wrong kind", "wrong types", "missing fields", "huge or negative rank",
        "huge numbers", "rank beyond world size", "huge strings", "control bytes", "duplicated events",
        "catastrophic-backtracking NCCL lines", "lone surrogates",
    }  # fmt: skip
    assert len(corpus()) >= 200


@pytest.mark.parametrize("kind", ["malformed JSON", "unknown or wrong kind", "wrong types", "missing fields"])
def test_unparseable_event_lines_are_counted_and_skipped(kind: str) -> None:
    lines = [line for k, line in event_lines() if k == kind]
    assert lines and all(parse_event(line) is MALFORMED for line in lines)
    assert parse_log(lines).malformed == len(lines) and parse_log(lines).events == ()


def test_out_of_range_numbers_are_refused_at_parse_time() -> None:
    lines = [line for k, line in event_lines() if k in ("huge or negative rank", "huge numbers")]
    parsed = [parse_event(line) for line in lines]
    # Negative and >= 2^20 ranks, integers past 2^53, a 5000-digit number: refused. Huge floats parse (inf/1e308).
    refused = [line for line, event in zip(lines, parsed, strict=True) if event is MALFORMED]
    accepted = [event for event in parsed if isinstance(event, Event)]
    assert len(refused) == 11
    assert all(e.kind == "step" for e in accepted) and len(accepted) == 2


def test_strings_are_cleaned_and_bounded() -> None:
    assert clean_text("\x1b[2J\x1b[Hcleared\x00\x07 ok") == "cleared ok"
    assert clean_text("\x1b]0;title\x07bell") == "bell"
    assert clean_text("x" * 300) == "x" * 255 + "…"
    huge = [parse_event(line) for k, line in event_lines() if k == "huge strings"]
    placement, transport, failure, checkpoint = (e for e in huge if isinstance(e, Event))
    assert isinstance(placement, Placement) and len(placement.pod) == 256 and placement.pod.endswith("…")
    assert isinstance(transport, Transport) and len(transport.evidence) == 512
    assert isinstance(failure, Failure) and len(failure.message) == 1024
    assert len(checkpoint.path) == 1024
    assert huge[4] is MALFORMED  # a 1,000,000-character event line is not read at all
    # The 300,000-character lines: one is not an event at all, the other is an event line too long to read.
    assert [parse_event(line) for k, line in event_lines() if k == "huge strings"][-2:] == [None, MALFORMED]


def test_control_bytes_never_reach_an_event() -> None:
    events = [
        e for k, line in event_lines() if k == "control bytes" for e in [parse_event(line)] if isinstance(e, Event)
    ]
    assert len(events) == 12
    for event in events:
        for value in (
            vars(event).values() if hasattr(event, "__dict__") else [getattr(event, f) for f in event.__slots__]
        ):
            if isinstance(value, str):
                assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value), value


def test_folding_the_whole_corpus_gives_a_status_the_crd_accepts() -> None:
    parsed = parse_log(line for _, line in corpus())
    folded = fold_events(job(), JobStatus(), parsed.events, now=NOW)
    status = within_budget(folded.status.to_dict())
    jsonschema.validate(status, STATUS_SCHEMA)
    assert sorted(r["rank"] for r in status["ranks"]) == [1, 2]
    assert [r["rank"] for r in status["transport"]["ranks"]] == [2]
    assert status["progress"]["step"] == 3 and status["progress"]["tokensPerSecond"] == 1000
    # Ranks 8, 9, 4095 and 2^20-1 (placement and transport each), local rank 1000; a negative loss.
    assert folded.rejected == 10 and status["skippedEvents"] == 10
    assert len(json.dumps(status)) < status_budget(3)


def test_lone_surrogates_never_reach_a_status() -> None:
    """A `\\ud800` escape decoded into a str no UTF-8 encoder takes: sizing the status raised UnicodeEncodeError."""
    lines = [line for k, line in event_lines() if k == "lone surrogates"]
    events = parse_log(lines).events
    assert len(events) == len(lines)
    for event in events:
        for name in event.__slots__:
            value = getattr(event, name)
            assert not isinstance(value, str) or not any(0xD800 <= ord(c) <= 0xDFFF for c in value), value
    status = within_budget(fold_events(job(), JobStatus(), events, now=NOW).status.to_dict())
    json.dumps(status, ensure_ascii=False).encode()
    jsonschema.validate(status, STATUS_SCHEMA)


def test_a_stored_status_of_the_wrong_types_folds() -> None:
    """A status is writable by whoever may write the status subresource: its values are not trusted either."""
    stored = JobStatus(progress={"evalStep": "x", "step": [1]}, ranks=[{"rank": "0"}])
    evaluation = parse_event('FSDP_EVENT {"v":1,"kind":"evaluation","rank":0,"step":2,"loss":1.5}')
    assert isinstance(evaluation, Event)
    folded = fold_events(job(), stored, [evaluation], now=NOW)
    assert folded.status.progress["evalStep"] == 2


def test_duplicated_events_fold_to_one_entry_each() -> None:
    lines = [line for k, line in event_lines() if k == "duplicated events"]
    status = fold_events(job(), JobStatus(), parse_log(lines).events, now=NOW).status
    assert [r["rank"] for r in status.ranks] == [1, 2]
    assert len(status.transport["ranks"]) == 1 and status.progress["step"] == 3


@pytest.mark.timeout(60)
def test_nccl_patterns_run_in_linear_time_on_lines_built_to_backtrack() -> None:
    """Each line is 100,000+ characters: a quadratic pattern would take many minutes (the timeout fails the test)."""
    for _, line in nccl_lines():
        classify_text(line)
        classify_by_rank(line * 3)
        # The cut to 4096 characters is not what saves the patterns: run them on the uncut line as well.
        from fsdp_train.contract import nccl

        for pattern in (nccl._NCCL_PREFIX, nccl._USING_NETWORK, nccl._ASSIGNED, nccl._CHANNEL_NET, nccl._RAY_PREFIX,
                        nccl._INIT_FAILED, nccl._RANK, nccl._NNODES, nccl._ANSI):  # fmt: skip
            pattern.search(line)
        nccl._plugin_missing(line)


def test_an_nccl_log_of_many_processes_keeps_bounded_evidence() -> None:
    lines = [f"host{i}:{i}:{i} [0] NCCL INFO Using network Socket" for i in range(10_000)]
    lines += ["host0:0:0 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so"] * 1000
    verdicts = classify_by_rank("\n".join(lines))
    assert len(verdicts) <= 4097
    assert all(len(v.evidence_lines) <= 64 for v in verdicts.values())


def test_parsing_never_raises_on_arbitrary_bytes() -> None:
    import random

    rng = random.Random(10)
    alphabet = '{}[]":,0123456789.eE-+tfnaulsrkidv \\/\x00\x1b\ud800' + "FSDP_EVENT "
    start = time.process_time()  # CPU time: a loaded machine stretches wall time, not the parser's work
    for _ in range(3000):
        body = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 200)))
        event = parse_event("FSDP_EVENT " + body)
        assert event is MALFORMED or isinstance(event, Event)
    assert time.process_time() - start < 10


# --- the size budget -------------------------------------------------------------------------------------


def _placements(world: int, text: str) -> tuple[Event, ...]:
    """Placement and transport of every rank, as printed and read back (the parser bounds every string)."""
    evidence = "NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)"
    events: list[Event] = []
    for rank in range(world):
        node = rank // 8
        events.append(
            Placement(
                rank=rank,
                world_size=world,
                local_rank=rank % 8,
                local_world_size=8,
                node_rank=node,
                node_ip=f"10.0.{rank // 256}.{rank % 256}",
                hostname=text or f"ip-10-0-{node}",
                pod=text or f"qwen-ray-gpu-workers-worker-{node:05d}",
                device=text or "NVIDIA H200",
                device_uuid=text or f"GPU-{rank:08x}-1111-2222-3333-444455556666",
            )
        )
        events.append(
            Transport(rank=rank, transport="efa", plugin="Libfabric", provider="efa", evidence=text or evidence)
        )
    parsed = parse_log(event.to_line() for event in events)
    assert parsed.malformed == 0
    return parsed.events


def test_status_at_512_ranks_fits_its_budget_without_cuts() -> None:
    j = job(replicas=64, ranks_per_worker=8)
    status = within_budget(fold_events(j, JobStatus(), _placements(512, ""), now=NOW).status.to_dict())
    size = len(json.dumps(status, separators=(",", ":")))
    assert "truncated" not in status and len(status["ranks"]) == 512
    assert size < status_budget(512) == 1024 * 1024
    jsonschema.validate(status, STATUS_SCHEMA)


def test_status_at_512_ranks_with_every_string_at_its_bound_is_cut_and_says_so() -> None:
    j = job(replicas=64, ranks_per_worker=8)
    folded = fold_events(j, JobStatus(), _placements(512, "\u00e9" * 2000), now=NOW).status.to_dict()
    status = within_budget(folded)
    assert len(json.dumps(folded, separators=(",", ":"), ensure_ascii=False).encode()) > 1024 * 1024
    assert len(json.dumps(status, separators=(",", ":"), ensure_ascii=False).encode()) <= status_budget(512)
    assert "per-rank NCCL evidence" in status["truncated"] and "hostname" in status["truncated"]
    assert status["transport"]["summary"] == "efa" and status["transport"]["evidence"]
    jsonschema.validate(status, STATUS_SCHEMA)


def test_a_huge_world_cuts_rank_entries_and_names_how_many() -> None:
    j = job(replicas=512, ranks_per_worker=8)
    status = within_budget(fold_events(j, JobStatus(), _placements(4096, "x" * 256), now=NOW).status.to_dict())
    assert len(json.dumps(status, separators=(",", ":")).encode()) <= 1024 * 1024
    kept = len(status["ranks"])
    assert 0 < kept < 4096 and f"rank entries after the first {kept} of 4096" in status["truncated"]


def test_messages_are_cut_to_what_the_crd_declares() -> None:
    status = within_budget(JobStatus(message="m" * 50_000).to_dict())
    assert len(status["message"]) == schema.MESSAGE_LIMIT and status["message"].endswith("…")


@pytest.mark.parametrize("hidden", ["\u202e", "\u2066", "\u200b", "\u00ad", "\U000e0041", "\x1b"])
def test_format_and_control_characters_never_reach_a_status_message(hidden: str) -> None:
    """A rank's failure message reversed by U+202E made `kubectl get` show a reason that reads backwards."""
    failure = Failure(rank=1, message=f"out of memory{hidden}yromem fo tuo", reason="")
    folded = fold_events(job(), JobStatus(), [failure], now=NOW).status.to_dict()
    folded["conditions"] = [{"type": "Failed", "status": "True", "reason": "X", "message": f"rank 1{hidden}"}]
    status = within_budget(folded)
    text = json.dumps(status, ensure_ascii=False)
    assert hidden not in text
    assert status["conditions"][0]["message"] == f"rank 1{formats.visible(hidden)}" != f"rank 1{hidden}"
