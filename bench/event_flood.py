"""One job floods its log with event lines; how long does another job's apply take to become a RayCluster?

    python bench/event_flood.py --baseline REV [--lines 1000000] [--samples 30]

Runs the same measurement twice in one invocation, each in its own process: against this checkout and against
git revision REV (exported with `git archive`), and prints the two side by side. Each run is the real operator
loop (kopf, the emulated API server over HTTP, the fake KubeRay and fake Ray of tests/support): the job `flood`
gets `--lines` step and failure event lines at once (signed with its attempt's key where the tree signs), and
while the operator reads them, jobs `calm-N` are applied one after another; a thread times each from the POST
to its RayCluster appearing in the API server's store. A run with no flood gives the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = 3


def measure(tree: Path, lines: int, samples: int) -> dict[str, Any]:
    """Run in the child process: `tree`'s operator with `tree`'s test harness."""
    for path in ("operator", "training", "tests", "tests/integration"):
        sys.path.insert(0, str(tree / path))
    import requests
    from fsdp_operator.api import render
    from fsdp_operator.local.server import ThreadedApiServer
    from fsdp_train.contract import events
    from test_operator import JOBS, World, manifest

    signer_type = getattr(events, "Signer", None)  # a tree from before signing prints unsigned lines

    def payloads(count: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(count):
            if i % 20 == 19:  # a failure in 20: folding them was quadratic
                out.append({"v": 1, "kind": "failure", "rank": i % 8, "time": 1e9, "message": f"worker {i} lost"})
            else:
                out.append({"v": 1, "kind": "step", "rank": 0, "time": 1e9, "step": 1 + i % 99,
                            "total_steps": 100, "loss": 2.0, "tokens_per_second": 1000.0,
                            "tokens_per_second_per_device": 125.0})  # fmt: skip
        return out

    def log_of(submission: Any, items: list[dict[str, Any]]) -> str:
        key = submission.runtime_env.get("env_vars", {}).get("FSDP_EVENT_KEY", "")
        prefix = "(RayTrainWorker pid=4242, ip=10.0.0.7) "
        if signer_type is not None and key:
            signer = signer_type(bytes.fromhex(key))
            return "".join(prefix + signer.line(p) + "\n" for p in items)
        return "".join(f"{prefix}{events.PREFIX} {json.dumps(p, separators=(',', ':'))}\n" for p in items)

    def timed_applies(api_url: str, count: int, tag: str, out: list[float], store: Any) -> None:
        http = requests.Session()
        for n in range(-WARM_UP, count):  # the first few warm the operator's caches and connections: not counted
            name = f"calm-{tag}-{n + WARM_UP}"
            started = time.monotonic()
            response = http.post(api_url + JOBS, json=manifest(name), timeout=30)
            assert response.status_code == 201, response.text
            cluster = render.raycluster_name(name)
            while not any(c["metadata"]["name"] == cluster for c in store.find("rayclusters", "ray.io")):
                time.sleep(0.002)
            if n >= 0:
                out.append(time.monotonic() - started)
            http.delete(f"{api_url}{JOBS}/{name}", timeout=30)
            time.sleep(0.05)

    async def run(flood: bool, tag: str) -> dict[str, Any]:
        with ThreadedApiServer() as api:
            w = World(api)
            w.ray.script = None  # jobs stay RUNNING until finished: the flood's log is what is read
            async with w.kuberay.running(), w.operator():
                if flood:
                    # No transport lines in the flood: without requireEFA it is read to its end, not failed closed.
                    w.apply(manifest("flood", runPolicy={"cleanup": "Keep"}, network={"requireEFA": False}))
                    sid = await _eventually(lambda: w.status("flood").get("submissionId") or None)
                    await _eventually(lambda: sid in w.ray.created or None)
                    job = w.ray.job(sid)
                    items = payloads(lines)
                    job.log += await asyncio.to_thread(log_of, job.submission, items)
                    await _eventually(lambda: w.status("flood").get("logOffset", 0) > 0 or None, timeout=120)
                latencies: list[float] = []
                lags: list[float] = []
                worker = threading.Thread(target=timed_applies, args=(api.url, samples, tag, latencies, api.store))
                worker.start()
                loop = asyncio.get_running_loop()
                while worker.is_alive():  # the operator's event loop: how late does a 10 ms sleep wake up?
                    started = loop.time()
                    await asyncio.sleep(0.01)
                    lags.append(loop.time() - started - 0.01)
                read = w.status("flood").get("logOffset", 0) if flood else 0
                return {"latencies": latencies, "lags": lags, "flood_bytes_read_during": read}

    async def _eventually(condition: Any, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            await asyncio.sleep(0.02)
        raise TimeoutError("condition never held")

    results = {}
    for flood in (False, True):
        figures = asyncio.run(run(flood, "f" if flood else "i"))
        lat = sorted(figures["latencies"])
        results["flood" if flood else "idle"] = {
            "samples": len(lat),
            "p50_ms": round(1000 * statistics.median(lat), 1),
            "p95_ms": round(1000 * lat[max(0, int(len(lat) * 0.95) - 1)], 1),
            "max_ms": round(1000 * lat[-1], 1),
            "loop_lag_p95_ms": round(1000 * sorted(figures["lags"])[int(len(figures["lags"]) * 0.95)], 1),
            "loop_lag_max_ms": round(1000 * max(figures["lags"]), 1),
            "flood_bytes_read": figures["flood_bytes_read_during"],
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="git revision to compare with (exported with git archive)")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child), args.lines, args.samples)))
        return 0
    trees: dict[str, Path] = {"this checkout": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline], check=True, capture_output=True
            )
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            trees = {f"baseline {args.baseline}": base, **trees}
        rows = []
        for label, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": f"{tree}/operator:{tree}/training"}
            child = [sys.executable, __file__, "--child", str(tree), "--lines", str(args.lines),
                     "--samples", str(args.samples)]  # fmt: skip
            done = subprocess.run(child, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-4000:], file=sys.stderr)
                return 1
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            for mode in ("idle", "flood"):
                f = figures[mode]
                rows.append(
                    f"| {label} | {mode} | {f['samples']} | {f['p50_ms']} | {f['p95_ms']} | {f['max_ms']} "
                    f"| {f['loop_lag_p95_ms']} | {f['loop_lag_max_ms']} | {f['flood_bytes_read']} |"
                )
    print(f"apply -> RayCluster of another job while one job's log holds {args.lines} event lines")
    print("| tree | flood | samples | p50 ms | p95 ms | max ms | loop lag p95 ms | loop lag max ms | flood bytes read "
          "|")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
