"""`fsdpctl capacity`: the ranked plan of where an instance type can run, as a table (with progress) or JSON.

Exit codes as for every fsdpctl command: 0 when at least one zone can take the request, 1 when none can
(not offered, quota short, refused by a probe, or no region could be checked), 2 for unusable input
(an instance type or region EC2 does not know, no AWS credentials). No AWS error prints a traceback:
each becomes a sentence in its region's row.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import IO, Any

from fsdp_operator.capacity import ec2 as capacity
from fsdp_operator.capacity import plan as capacity_plan
from fsdp_operator.capacity.ec2 import Boto3Clients, ClientFactory, NoCredentials, UnknownInstanceType
from fsdp_operator.capacity.plan import Plan, Region

EXIT_OK, EXIT_FINDING, EXIT_BAD_INPUT = 0, 1, 2
CREDENTIALS_HINT = (
    "no AWS credentials found: set AWS_PROFILE (or --profile), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
    "or run `aws configure` / `aws sso login`"
)


def _regions(clients: Boto3Clients, factory: ClientFactory, wanted: Sequence[str]) -> tuple[list[str], set[str]]:
    """The regions to check and the opt-in ones not enabled; ValueError names a region EC2 does not know."""
    home = clients.home_region()
    try:
        enabled, disabled = capacity.enabled_regions(factory("ec2", home))
    except NoCredentials:
        raise
    except Exception:
        # Not allowed to list regions (or no endpoint): check what was asked and let each region answer.
        enabled, disabled = [], set()
    if not wanted:
        return enabled or [home], disabled
    known = set(clients.known_regions()) | set(enabled) | disabled
    unknown = [r for r in wanted if r not in known]
    if unknown:
        raise ValueError(f"--regions: {', '.join(unknown)} is not an EC2 region (known: {', '.join(sorted(known))})")
    return list(dict.fromkeys(wanted)), disabled


def _request(
    clients: Boto3Clients,
    factory: ClientFactory,
    names: list[str],
    disabled: set[str],
    instance_type: str,
    count: int,
) -> capacity_plan.Request:
    """The request, its vCPUs per instance from the catalog or EC2: asked of the home region when it is checked,
    else of the checked regions in turn (one that is not enabled, or that errs, does not decide it)."""
    home = clients.home_region()
    live = [r for r in names if r not in disabled]
    candidates = list(dict.fromkeys([home] if home in live or not live else live))
    error: Exception | None = None
    for region in candidates:
        try:
            return capacity.request_for(factory("ec2", region), instance_type, count)
        except (NoCredentials, UnknownInstanceType):
            raise
        except Exception as e:
            error = error or e
    assert error is not None
    raise error


def run(
    instance_type: str,
    count: int,
    *,
    regions: Sequence[str] = (),
    probe: bool = False,
    output: str = "table",
    profile: str | None = None,
    clients: Boto3Clients | None = None,
    factory: ClientFactory | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """The whole command; `clients`/`factory` are replaced in tests (moto, botocore's Stubber)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    if count < 1:
        print(f"error: --count must be at least 1, got {count}", file=err)
        return EXIT_BAD_INPUT
    clients = clients or Boto3Clients(profile=profile)
    factory = factory or clients
    try:
        clients.require_credentials()
        names, disabled = _regions(clients, factory, regions)
        request = _request(clients, factory, names, disabled, instance_type, count)
        plan = _check(factory, names, disabled, request, probe, output, err)
    except NoCredentials as e:
        detail = str(e)
        print(f"error: {CREDENTIALS_HINT}" + ("" if "no AWS credentials" in detail else f" ({detail})"), file=err)
        return EXIT_BAD_INPUT
    except UnknownInstanceType:
        print(f"error: --instance-type: EC2 does not know {instance_type!r} (example: g6.12xlarge)", file=err)
        return EXIT_BAD_INPUT
    except ValueError as e:
        print(f"error: {e}", file=err)
        return EXIT_BAD_INPUT
    except Exception as e:  # the request itself could not be made (its region erred): one line, no traceback
        print(f"error: {capacity.describe_error(e, 'instance type', 'the first region')}", file=err)
        return EXIT_FINDING
    for leftover in capacity_plan.leftovers(plan):
        print(f"warning: {leftover}", file=err)
    if output == "json":
        print(json.dumps(capacity_plan.to_json(plan), indent=2), file=out)
    else:
        print_table(plan, out)
    return EXIT_OK if any(r.usable for r in capacity_plan.rank(plan)) else EXIT_FINDING


def _check(
    factory: ClientFactory,
    names: list[str],
    disabled: set[str],
    request: capacity_plan.Request,
    probe: bool,
    output: str,
    err: IO[str],
) -> Plan:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    skipped = {
        r: Region(r, error=f"{r} is an opt-in region not enabled for this account") for r in names if r in disabled
    }
    live = [r for r in names if r not in disabled]
    console = Console(file=err)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=output == "json" or not console.is_terminal,
    ) as progress:
        tasks = {r: progress.add_task(f"{r}: waiting", total=1) for r in live}
        overall = progress.add_task(f"{len(live)} regions, {request.count}x {request.instance_type}", total=len(live))

        def on_step(region: str, step: str) -> None:
            progress.update(tasks[region], description=f"{region}: {step}")

        def on_done(region: Region) -> None:
            state = (
                f"error: {region.error}" if region.error else f"{sum(z.offered for z in region.zones)} zones offer it"
            )
            progress.update(tasks[region.name], description=f"{region.name}: {state}", completed=1)
            progress.advance(overall)

        try:
            plan = capacity.check(factory, live, request, probe=probe, on_step=on_step, on_done=on_done)
        except KeyboardInterrupt:
            console.print("interrupted: every reservation made so far was cancelled", style="yellow")
            raise
    checked = {r.name: r for r in plan.regions}
    return Plan(request, tuple(checked.get(r) or skipped[r] for r in names), probe)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def print_table(plan: Plan, out: IO[str]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    request = plan.request
    console = Console(file=out, width=max(Console(file=out).width, 160), highlight=False)
    title = f"{request.count}x {request.instance_type} ({request.vcpus} vCPUs)" + (", probed" if plan.probed else "")
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    for column in ("rank", "region", "zone", "offered", "quota free", "spot", "probe", "why"):
        table.add_column(column, overflow="fold")
    for r in capacity_plan.rank(plan):
        free = r.quota.free if r.quota is not None else None
        table.add_row(
            str(r.rank),
            r.region,
            r.zone.name,
            "yes" if r.zone.offered else "no",
            "-" if free is None else capacity_plan.number(free),
            _cell(r.zone.spot_score),
            r.zone.probe.outcome if r.zone.probe else "-",
            r.why,
        )
    console.print(table)
    for region in plan.regions:
        if region.error:
            console.print(f"{region.name}: not checked: {region.error}")
        for note in region.notes:
            console.print(f"{region.name}: {note}")
        if region.quota is not None and region.quota.error:
            console.print(f"{region.name}: {region.quota.error}")
    wanted = capacity_plan.increases(plan)
    if wanted:
        console.print("quota short; to ask for more:")
        for increase in wanted:
            console.print(f"  {increase.command}", soft_wrap=True)
    best = next((r for r in capacity_plan.rank(plan) if r.usable), None)
    if best is None:
        console.print(f"no zone can take {request.count}x {request.instance_type} now")
    else:
        console.print(f"best: {best.region} {best.zone.name}")
