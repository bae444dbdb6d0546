"""A corpus of hostile job-log lines: what a broken, compromised or merely noisy training process can print.

Each entry is (class, line). The classes are the ones docs/reliability.md counts. Lines are built here,
not read from a file, so the huge ones cost no repository space; the set is deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from fsdp_train.contract.events import PREFIX, Placement, Step, Transport

RAY = "(RayTrainWorker pid=4242, ip=10.0.0.7) "
WORLD_SIZE = 8
"""The world size of the job the corpus is folded into (2 workers x 4 ranks)."""


def _event(payload: object) -> str:
    return f"{RAY}{PREFIX} {json.dumps(payload, separators=(',', ':'))}"


def _placement(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "v": 1, "kind": "placement", "rank": 1, "time": 1.0, "world_size": WORLD_SIZE, "local_rank": 1,
        "local_world_size": 4, "node_rank": 0, "node_ip": "10.0.0.7", "hostname": "h", "pod": "p", "device": "cpu",
    }  # fmt: skip
    return {**base, **fields}


def _transport(**fields: object) -> dict[str, object]:
    return {"v": 1, "kind": "transport", "rank": 2, "time": 1.0, "transport": "efa", **fields}


def _step(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "v": 1, "kind": "step", "rank": 0, "time": 1.0, "step": 3, "total_steps": 10, "loss": 2.5,
        "tokens_per_second": 1000.0, "tokens_per_second_per_device": 125.0,
    }  # fmt: skip
    return {**base, **fields}


def event_lines() -> Iterator[tuple[str, str]]:
    """(class, line) for every hostile event line."""
    for text in ("{", '{"kind":', "{'kind': 'step'}", "[1,2,3]", '"step"', "null", "1e999", "NaN", "{}" + "}" * 5,
                 '{"kind":"step"' + ",1" * 100, "\ufeff{}"):  # fmt: skip
        yield "malformed JSON", f"{RAY}{PREFIX} {text}"
    yield "malformed JSON", f"{PREFIX} " + "[" * 100_000  # nesting past the parser's recursion limit
    yield "malformed JSON", f"{PREFIX} " + '{"a":' * 50_000 + "1" + "}" * 50_000
    for kind in (None, 7, ["step"], {"k": 1}, "Step", "unknown", ""):
        yield "unknown or wrong kind", _event({"v": 1, "kind": kind, "rank": 0})
    wrong_types = [
        _placement(rank="1"), _placement(rank=1.5), _placement(rank=True), _placement(rank=None),
        _placement(world_size=[8]), _placement(node_ip=10), _placement(pod={"name": "x"}), _placement(hostname=None),
        _transport(transport="carrier-pigeon"), _transport(transport=1), _transport(evidence=["a", "b"]),
        _step(step="3"), _step(loss="low"), _step(loss=True), _step(mfu="high"), _step(tokens_per_second="fast"),
        {"v": 1, "kind": "probe", "rank": 0, "scope": "galaxy", "ranks": 8, "size_bytes": 1,
         "allreduce_busbw_gbps": 1.0, "allgather_busbw_gbps": 1.0},
        {"v": 1, "kind": "failure", "rank": 0, "message": 404},
        {"v": 1, "kind": "checkpoint", "rank": 0, "step": 1, "path": 7},
    ]  # fmt: skip
    for payload in wrong_types:
        yield "wrong types", _event(payload)
    for missing in ("rank", "world_size", "node_ip"):
        payload = _placement()
        del payload[missing]
        yield "missing fields", _event(payload)
    for number in (-1, -(2**31), 2**20, 2**31, 2**63, 2**64 + 1, 10**30):
        yield "huge or negative rank", _event(_placement(rank=number))
    yield "huge or negative rank", f"{RAY}{PREFIX} " + '{"v":1,"kind":"step","rank":' + "9" * 5000 + "}"
    for number in (2**63, -5, 10**40):
        yield "huge numbers", _event(_step(step=number))
    yield "huge numbers", _event(_step(tokens_per_second=1e308, loss=-1e308))
    yield "huge numbers", f"{RAY}{PREFIX} " + json.dumps(_step()).replace("2.5", "1e999")  # parses to inf
    for rank in (WORLD_SIZE, WORLD_SIZE + 1, 4095, 2**20 - 1):
        yield "rank beyond world size", _event(_placement(rank=rank))
        yield "rank beyond world size", _event(_transport(rank=rank, transport="socket", evidence="NET/Socket"))
    yield "rank beyond world size", _event(_placement(local_rank=1000))
    yield "rank beyond world size", _event(
        {"v": 1, "kind": "probe", "rank": 0, "scope": "all", "ranks": 10_000, "size_bytes": 1,
         "allreduce_busbw_gbps": 9.9e9, "allgather_busbw_gbps": 1.0}
    )  # fmt: skip
    huge = "A" * 60_000  # within the line bound (64 KiB), far beyond every field's
    yield "huge strings", _event(_placement(pod=huge))
    yield "huge strings", _event(_transport(evidence=huge))
    yield "huge strings", _event({"v": 1, "kind": "failure", "rank": 3, "message": huge})
    yield (
        "huge strings",
        _event({"v": 1, "kind": "checkpoint", "rank": 0, "step": 2, "path": "s3://b/" + "p/" * 25_000}),
    )
    yield "huge strings", _event(_placement(pod="A" * 1_000_000))  # past the line bound: skipped unread
    yield "huge strings", RAY + "x" * 300_000  # an over-long line that is not an event
    yield "huge strings", RAY + PREFIX + " " + "y" * 300_000  # an over-long event line
    for text in ("\x00\x00nul", "\x1b[2J\x1b[Hcleared", "\x1b]0;title\x07bell", "a\rb\x08c\x7f\x9bd", "\u202eevil"):
        yield "control bytes", _event(_placement(hostname=text, pod=text, device=text))
        yield "control bytes", _event(_transport(evidence=text))
    yield "control bytes", "\x00" * 1000 + f"{PREFIX} " + json.dumps(_step())
    yield "control bytes", f"{PREFIX} " + json.dumps(_step()) + "\x1b[0m\r"
    yield "control bytes", f"{RAY}{PREFIX} " + json.dumps(_step()).replace("{", "{\x00", 1)
    # JSON escapes no UTF-8 encoder takes (a lone surrogate), and NUL in a key: the status writer failed on them.
    for text in ("\ud800", "a\udfffb", "\udc00\ud800", "ok\ud83d"):
        yield "lone surrogates", _event(_placement(hostname=text, pod=text, device=text, node_ip=text))
        yield "lone surrogates", _event(_transport(evidence=text, plugin=text, provider=text))
        yield "lone surrogates", _event({"v": 1, "kind": "failure", "rank": 3, "message": text, "reason": text})
        yield "lone surrogates", _event({"v": 1, "kind": "checkpoint", "rank": 0, "step": 1, "path": "/c/" + text})
        yield "lone surrogates", _event({"v": 1, "kind": "export", "rank": 0, "step": 1, "path": "/o/" + text})
    yield "lone surrogates", f"{RAY}{PREFIX} " + '{"v":1,"kind":"failure","rank":3,"message":"m","\\u0000\\ud800":1}'
    line = Placement(rank=1, world_size=WORLD_SIZE, local_rank=1, local_world_size=4, node_rank=0, node_ip="10.0.0.7",
                     hostname="h", pod="p", device="cpu").to_line()  # fmt: skip
    for _ in range(50):
        yield "duplicated events", RAY + line
    transport = Transport(rank=2, transport="efa", evidence="NCCL INFO NET/OFI Selected provider is efa").to_line()
    step = Step(rank=0, step=3, total_steps=10, loss=2.5, tokens_per_second=1000, tokens_per_second_per_device=125)
    for _ in range(50):
        yield "duplicated events", RAY + transport
        yield "duplicated events", RAY + step.to_line()
    yield "duplicated events", _event({**_step(), "step": 3, "extra": [1] * 100})  # unknown fields are ignored


def nccl_lines() -> Iterator[tuple[str, str]]:
    """(class, line) of NCCL-log lines built to make a backtracking regex take quadratic time or worse."""
    n = 100_000
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO " + "a" * n  # the host:pid:tid prefix pattern
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO " + "a.-" * (n // 3) + ":1:2 ["
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO Using network a" + " " * n + "b"
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO Channel 00/0 : 1[1] -> 0[0] via NET/a" + " " * n + "x)"
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO " + "Assigned NET plugin x " * (n // 22)
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO " + "Error: network x " * (n // 17)
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO " + "NET/Plugin: " * (n // 12)
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO " + "(pid=" * (n // 5)
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO " + "( a" * (n // 3) + " pid=1, ip=" + "1" * n
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO rank " + "9" * 5000 + " nranks " + "9" * 5000
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO nNodes " + "1" * 5000
    yield "catastrophic-backtracking NCCL lines", "\x1b[" + ";" * n + "NCCL INFO x"
    yield "catastrophic-backtracking NCCL lines", "NCCL INFO " + "\x1b[1m" * (n // 4)


def corpus() -> list[tuple[str, str]]:
    return [*event_lines(), *nccl_lines()]
