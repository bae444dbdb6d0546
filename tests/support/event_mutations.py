"""Random mutations of genuine signed event lines, read as the operator reads a job log: nothing may raise, no
mutated line may verify, every refused one is counted (docs/reliability.md, "Threat model").

`python tests/support/event_mutations.py --lines 50000` (with the worktree's ``operator`` and ``training`` on
``PYTHONPATH``) prints the figures; `tests/unit/test_event_totality.py` runs a sample by default and 50,000 as a
slow case. Hand-written rather than hypothesis: the point is a large, seeded count with figures to report, which
hypothesis's shrinking search does not give; the property tests beside it use hypothesis.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fsdp_operator.api import schema
from fsdp_operator.api.spec import Job, parse_job
from fsdp_operator.decide.folding import fold_events
from fsdp_operator.decide.status import JobStatus
from fsdp_train.contract.events import (
    CONTROLLER,
    DRIVER,
    FORGED,
    Checkpoint,
    Event,
    Export,
    Failure,
    Placement,
    Probe,
    Signer,
    Step,
    Summary,
    Transport,
    Verifier,
    attempt_key,
    parse_event,
)

KEY = attempt_key(b"k" * 32, "job-1a2b3c4d-1")
RAY = "(RayTrainWorker pid=4242, ip=10.0.0.7) "
# Characters a mutation puts in: hex of both cases, JSON's own, non-ASCII of every width, a lone surrogate, NUL,
# control characters and an escape, the prefix's letters.
ALPHABET = [*"0123456789abcdefABCDEF", *'{}[]":,. \\-', "é", "€", "𝄞", "\ud800", "\udfff", "\x00", "\x1b", "\r",
            "\t", "\x7f", "\u2028", "\ufeff", *"FSDP_EVENT"]  # fmt: skip


def genuine_events() -> list[Event]:
    """One event of each kind the ranks print, with text that leaves room to mutate."""
    return [
        Placement(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0, node_ip="10.0.0.7",
                  hostname="worker-0", pod="job-worker-0", device="NVIDIA H100", time=1e9),
        Transport(rank=0, transport="efa", plugin="aws-ofi-nccl", evidence="NET/OFI Selected provider is efa",
                  time=1e9),
        Probe(rank=0, scope="all", ranks=2, size_bytes=1 << 20, allreduce_busbw_gbps=12.5,
              allgather_busbw_gbps=10.0, time=1e9),
        Step(rank=0, step=2, total_steps=10, loss=2.5, tokens_per_second=1000.0, tokens_per_second_per_device=500.0,
             mfu=0.4, extra={"grad_norm": 1.5}, time=1e9),
        Checkpoint(rank=0, step=2, path="s3://bucket/run/step_00000002", seconds=1.5, time=1e9),
        Export(rank=0, step=10, path="s3://bucket/run/hf", verified=True, time=1e9),
        Summary(rank=0, steps=10, final_loss=1.5, first_loss=5.0, tokens_per_second=1000.0, time=1e9),
        Failure(rank=1, message="URLError: <urlopen error [Errno -2] Name or service not known>", time=1e9),
    ]  # fmt: skip


def mutate(line: str, rng: random.Random) -> str:
    """`line` changed inside its signed part (the MAC and the JSON), never only after it: what follows the JSON on
    a line is not part of the event, so a change there leaves the same event."""
    first = line.index("FSDP_EVENT ") + len("FSDP_EVENT ")
    last = len(line) - 1  # an insertion goes before the JSON's closing brace at the latest
    for _ in range(100):
        op = rng.randrange(7)
        at = rng.randrange(first, last)
        char = rng.choice(ALPHABET)
        if op == 0:  # replace one character
            mutated = line[:at] + char + line[at + 1 :]
        elif op == 1:  # insert one
            mutated = line[:at] + char + line[at:]
        elif op == 2:  # delete one
            mutated = line[:at] + line[at + 1 :]
        elif op == 3:  # cut the line
            mutated = line[:at]
        elif op == 4:  # a run of one character (a surrogate, NUL, é...) in place of the text from here
            mutated = line[:at] + char * rng.randrange(1, 80) + line[at + rng.randrange(0, 80) :]
        elif op == 5:  # change the case of the MAC
            mutated = line[:first] + line[first : first + 64].upper() + line[first + 64 :]
        else:  # edit a JSON value as an attacker would: a number, a string
            text = line[first + 65 :]
            payload = json.loads(text)
            name = rng.choice(sorted(payload))
            value = payload[name]
            payload[name] = (value + 1) if isinstance(value, int | float) and not isinstance(value, bool) else "x"
            mutated = line[: first + 65] + json.dumps(payload, separators=(",", ":"), sort_keys=True)
        if mutated != line:
            return mutated
    raise AssertionError("no mutation changed the line")


@dataclass
class Figures:
    tried: int = 0
    raised: int = 0
    verified: int = 0
    """Mutated lines that verified (must stay 0)."""
    folded: int = 0
    """Events of mutated lines that reached a fold under the verifier (must stay 0)."""
    forged: int = 0
    """Mutated lines the verifier refused (counted in `forgedEvents`)."""
    unread: int = 0
    """Mutated lines with no event prefix left (plain text)."""
    fold_raised: int = 0
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"lines tried {self.tried}, raised {self.raised}, verified {self.verified}, folded {self.folded}, "
            f"forged counted {self.forged}, not an event line {self.unread}, fold raised {self.fold_raised}"
        )


def job() -> Job:
    return parse_job({"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": "q", "uid": "u"},
                      "spec": {"workers": {"replicas": 2}}})  # fmt: skip


def run(lines: int, seed: int = 0) -> Figures:
    """Mutate `lines` genuine signed lines (each signer: a rank, the driver, the controller) and read them back."""
    rng = random.Random(seed)
    signers = [Signer(KEY), Signer(KEY, emitter=DRIVER), Signer(KEY, emitter=CONTROLLER)]
    kinds = genuine_events()
    figures = Figures()
    verifier = Verifier(KEY)
    accepted: list[Event] = []  # events of mutated lines the verifier let through: folded as the operator would
    unchecked: list[Event] = []  # what the same lines parse to without a verifier, folded to exercise the fold
    for _ in range(lines):
        event = rng.choice(kinds)
        original = RAY + event.to_line(rng.choice(signers))
        mutated = mutate(original, rng)
        figures.tried += 1
        try:
            found = parse_event(mutated, verifier)
            loose = parse_event(mutated)
        except Exception as e:  # the figure this script exists for
            figures.raised += 1
            figures.errors.append(f"{type(e).__name__}: {e!s:.200} <- {mutated!r:.300}")
            continue
        if isinstance(found, Event):
            figures.verified += 1
            accepted.append(found)
        elif found is FORGED:
            figures.forged += 1
        else:
            figures.unread += 1
        if isinstance(loose, Event):
            unchecked.append(loose)
    now = datetime.now(UTC)
    try:
        folded = fold_events(job(), JobStatus(), accepted, now=now, forged=figures.forged)
        figures.folded = len(accepted) - folded.rejected
        if folded.status.forged_events != figures.forged:
            raise AssertionError(f"forgedEvents {folded.status.forged_events}, refused {figures.forged}")
        fold_events(job(), JobStatus(), unchecked, now=now)
    except Exception as e:
        figures.fold_raised += 1
        figures.errors.append(f"fold: {type(e).__name__}: {e!s:.300}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    figures = run(args.lines, args.seed)
    print(figures.line())
    for error in figures.errors[:20]:
        print(" ", error)
    bad = figures.raised or figures.verified or figures.folded or figures.fold_raised
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
