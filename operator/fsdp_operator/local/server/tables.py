"""Server-side printing for the emulated API server: `meta.k8s.io/v1` Tables, as `kubectl get` asks for."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from fsdp_operator.local.server.resources import Obj, PrinterColumn, ResourceType

_NAME = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}
_AGE = PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp")

_TOKEN = re.compile(r"\.([A-Za-z0-9_\-/]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*==\s*[\"']([^\"']*)[\"']\)\]|\[\*\]")


def json_path(obj: Any, path: str) -> list[Any]:
    """Evaluate the JSONPath subset printer columns use: `.a.b`, `[0]`, `[*]`, `[?(@.type=="Ready")]`."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    path = path.removeprefix("$")
    current: list[Any] = [obj]
    position = 0
    while position < len(path):
        match = _TOKEN.match(path, position)
        if not match:
            return []
        position = match.end()
        field, index, filter_key, filter_value = match.groups()
        following: list[Any] = []
        for value in current:
            if field is not None and isinstance(value, dict) and field in value:
                following.append(value[field])
            elif index is not None and isinstance(value, list) and int(index) < len(value):
                following.append(value[int(index)])
            elif filter_key is not None and isinstance(value, list):
                following.extend(item for item in value if _lookup(item, filter_key) == filter_value)
            elif field is None and index is None and filter_key is None and isinstance(value, list):
                following.extend(value)
        current = following
    return current


def _lookup(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def human_duration(seconds: float) -> str:
    """Kubernetes' `duration.HumanDuration`, which the AGE column shows."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 60 * 2:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24 - 365 * (hours // 24 // 365)
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def age(timestamp: str | None) -> str | None:
    if not timestamp:
        return None
    try:
        created = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return human_duration((datetime.now(UTC) - created).total_seconds())


# The real server's Event table (pkg/printers/internalversion: `eventColumnDefinitions`), whose Name is a hidden
# (priority 1) column at its end, not its first: `kubectl get events` showed only NAME and AGE here.
_EVENT_COLUMNS = (
    PrinterColumn(name="Last Seen", type="string", json_path=".lastTimestamp"),
    PrinterColumn(name="Type", type="string", json_path=".type"),
    PrinterColumn(name="Reason", type="string", json_path=".reason"),
    PrinterColumn(name="Object", type="string", json_path=""),
    PrinterColumn(name="Subobject", type="string", json_path=".involvedObject.fieldPath", priority=1),
    PrinterColumn(name="Source", type="string", json_path=".source.component", priority=1),
    PrinterColumn(name="Message", type="string", json_path=".message"),
    PrinterColumn(name="First Seen", type="string", json_path=".firstTimestamp", priority=1),
    PrinterColumn(name="Count", type="string", json_path=".count", priority=1),
    PrinterColumn(name="Name", type="string", json_path=".metadata.name", priority=1),
)


def _is_event(rtype: ResourceType) -> bool:
    return rtype.kind == "Event" and rtype.group == ""


def _columns(rtype: ResourceType, version: str) -> tuple[PrinterColumn, ...]:
    if _is_event(rtype):
        return _EVENT_COLUMNS
    if rtype.kind == "Pod" and rtype.group == "":
        return (
            PrinterColumn(name="Ready", type="string", json_path="", description="ready/total containers"),
            PrinterColumn(name="Status", type="string", json_path=".status.phase"),
            PrinterColumn(name="Restarts", type="string", json_path=""),
            _AGE,
            PrinterColumn(name="IP", type="string", json_path=".status.podIP", priority=1),
            PrinterColumn(name="Node", type="string", json_path=".spec.nodeName", priority=1),
        )
    if rtype.kind == "Namespace" and rtype.group == "":
        return (PrinterColumn(name="Status", type="string", json_path=".status.phase"), _AGE)
    declared = rtype.printer_columns.get(version, ())
    # A CRD without columns prints NAME and AGE; one with columns prints NAME and exactly those columns.
    return declared if declared else (_AGE,)


def _pod_cell(column: PrinterColumn, obj: Obj) -> Any:
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    if column.name == "Ready":
        total = len((obj.get("spec") or {}).get("containers") or [])
        return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"
    if column.name == "Status" and (obj.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    if column.name == "Restarts":
        return str(sum(int(s.get("restartCount", 0)) for s in statuses))
    return None


def _event_cell(column: PrinterColumn, obj: Obj) -> Any:
    if column.name == "Object":
        involved = obj.get("involvedObject") or {}
        return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"
    if column.name in ("Last Seen", "First Seen"):
        stamp = obj.get("lastTimestamp" if column.name == "Last Seen" else "firstTimestamp") or obj.get("eventTime")
        return age(stamp if isinstance(stamp, str) else None) or "<unknown>"
    return None


def _cell(column: PrinterColumn, obj: Obj, rtype: ResourceType) -> Any:
    if rtype.kind == "Pod" and rtype.group == "" and (cell := _pod_cell(column, obj)) is not None:
        return cell
    if _is_event(rtype) and (cell := _event_cell(column, obj)) is not None:
        return cell
    values = json_path(obj, column.json_path)
    if not values:
        return None
    value = values[0] if len(values) == 1 else ",".join(str(v) for v in values)
    if column.type == "date":
        return age(value) if isinstance(value, str) else value
    if column.type == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if column.type == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if column.type == "boolean" and isinstance(value, bool):
        return value
    if isinstance(value, (dict, list)):
        return str(value)
    return value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def column_definitions(rtype: ResourceType, version: str) -> list[Obj]:
    definitions: list[Obj] = [] if _is_event(rtype) else [dict(_NAME)]
    for column in _columns(rtype, version):
        definitions.append(
            {
                "name": column.name,
                "type": "string" if column.type == "date" else column.type,
                "format": column.format,
                "description": column.description,
                "priority": column.priority,
            }
        )
    return definitions


def row(rtype: ResourceType, version: str, obj: Obj, include_object: str) -> Obj:
    cells: list[Any] = [] if _is_event(rtype) else [(obj.get("metadata") or {}).get("name")]
    cells.extend(_cell(column, obj, rtype) for column in _columns(rtype, version))
    result: Obj = {"cells": cells}
    if include_object == "Object":
        result["object"] = obj
    elif include_object != "None":
        result["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {},
        }
    return result


def table(
    rtype: ResourceType,
    version: str,
    objects: list[Obj],
    *,
    resource_version: str,
    include_object: str = "PartialObjectMetadata",
    headers: bool = True,
) -> Obj:
    """A `meta.k8s.io/v1` Table of the objects; `headers=False` for watch events after the first."""
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": column_definitions(rtype, version) if headers else [],
        "rows": [row(rtype, version, obj, include_object) for obj in objects],
    }
