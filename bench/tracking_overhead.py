"""Step time with MLflow tracking on and off: the same `fsdpctl run-local` job, side by side, alternating.

    python bench/tracking_overhead.py --tracking-uri http://127.0.0.1:PORT [--steps 200] [--rounds 2]

Each round runs examples/tiny-cpu.yaml with `training.steps` set, once without `spec.tracking` and once with
`tracking.mlflow.trackingUri` (a running `mlflow server`), and reads the mean step time of steps 2..N from the
status the operator wrote (`status.result.stepSeconds`, the time tokens/s is over). Prints one JSON line per
run and the mean per arm.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-cpu.yaml"


def run(steps: int, tracking_uri: str | None, work: Path, index: int) -> dict[str, Any]:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["name"] = f"overhead-{'on' if tracking_uri else 'off'}-{index}"
    manifest["spec"]["training"]["steps"] = steps
    if tracking_uri:
        manifest["spec"]["tracking"] = {"mlflow": {"trackingUri": tracking_uri, "experiment": "overhead"}}
    path = work / f"{manifest['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    status_file = work / f"{manifest['metadata']['name']}.json"
    fsdpctl = Path(sys.executable).with_name("fsdpctl")
    for attempt in range(3):  # on a loaded machine a Ray node may fail to start: run it again
        proc = subprocess.run([str(fsdpctl), "run-local", "-f", str(path), "--status-out", str(status_file)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if proc.returncode == 0:
            break
        print(f"run-local failed ({attempt + 1} of 3):\n{proc.stdout[-1500:]}", file=sys.stderr, flush=True)
    else:
        raise SystemExit("run-local failed three times")
    status = json.loads(status_file.read_text())["status"]
    result = status["result"]
    step_ms = 1000 * result["stepSeconds"] / (steps - 1)
    healthy = {c["type"]: c["status"] for c in status["conditions"]}.get("TrackingHealthy", "-")
    return {"tracking": bool(tracking_uri), "steps": steps, "step_ms": round(step_ms, 2),
            "tokens_per_second": result["tokensPerSecond"], "tracking_healthy": healthy}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    arms: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            for uri in (None, args.tracking_uri):
                line = run(args.steps, uri, Path(tmp), index)
                print(json.dumps(line), flush=True)
                arms[line["tracking"]].append(line["step_ms"])
    off, on = statistics.mean(arms[False]), statistics.mean(arms[True])
    print(json.dumps({"mean_step_ms_off": round(off, 2), "mean_step_ms_on": round(on, 2),
                      "overhead_percent": round(100 * (on - off) / off, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
