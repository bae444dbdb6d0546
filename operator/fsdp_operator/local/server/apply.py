"""Server-side apply for the emulated API server (`PATCH` with `application/apply-patch+yaml`), as helm 4 and
`kubectl apply --server-side` use it.

From the Kubernetes documentation, "Server-Side Apply": each applier (`fieldManager`) owns the fields of
its last applied configuration, recorded in `metadata.managedFields` (operation `Apply`, `fieldsV1`); an
apply merges the configuration into the live object, and a field the same manager applied before and
no longer applies is removed unless another manager owns it ("Merge strategy"); a field another applier
owns with a different value is a 409 conflict naming the manager and the fields, unless `force=true`,
which takes the field over ("Conflicts"). Fields nobody applied, such as those the server defaulted, stay
untouched: this is why a defaulted `spec.strategy.rollingUpdate` survives an apply that switches a
Deployment to `Recreate`.

Not reproduced: lists are atomic (the real server merges associative lists such as `containers` by their
keys, item by item); writes other than apply (create, update, merge patch) are not recorded as owners, so
they never cause conflicts; `fieldsV1` lists owned leaves and maps without the `.` markers and `k:`/`v:`
list keys of the real format.
"""

from __future__ import annotations

import copy
from typing import Any

from fsdp_operator.local.server.resources import Obj, ResourceType
from fsdp_operator.local.server.store import ApiError, now_timestamp

Path = tuple[str, ...]

# Identity, not content: never owned, never removed.
_IDENTITY = {("apiVersion",), ("kind",), ("metadata",), ("metadata", "name"), ("metadata", "namespace")}
# Maps at the top (spec, metadata, ...) are structure, not owned themselves: dropping `spec.x` never drops `spec`.
_TOP_LEVEL = 1


def field_paths(config: Obj) -> set[Path]:
    """Every field the configuration sets: leaves (scalars, lists, empty maps) and the maps below the top level."""
    paths: set[Path] = set()

    def walk(node: Any, path: Path) -> None:
        if isinstance(node, dict) and node:
            if len(path) > _TOP_LEVEL:
                paths.add(path)
            for key, value in node.items():
                walk(value, (*path, str(key)))
        elif path:
            paths.add(path)

    walk({k: v for k, v in config.items() if k not in ("status",)}, ())
    return paths - _IDENTITY - {p for p in paths if p[:1] == ("metadata",) and p[1:2] == ("managedFields",)}


def apply(live: Obj | None, config: Obj, rtype: ResourceType, manager: str, *, force: bool) -> Obj:
    """The object after `manager` applies `config` to `live` (None: it does not exist yet)."""
    version = str(config.get("apiVersion") or rtype.api_version())
    new_paths = field_paths(config)
    entries = list(((live or {}).get("metadata") or {}).get("managedFields") or [])
    mine: set[Path] = set()
    others: dict[str, set[Path]] = {}
    kept: list[Obj] = []
    for entry in entries:
        paths = _paths_of(entry.get("fieldsV1") or {})
        if entry.get("operation") == "Apply" and entry.get("manager") == manager:
            mine |= paths
        elif entry.get("operation") == "Apply":
            others.setdefault(str(entry.get("manager")), set()).update(paths)
            kept.append(entry)
        else:
            kept.append(entry)
    result = copy.deepcopy(live) if live is not None else {}
    if live is not None:
        conflicts = sorted(
            (owner, path)
            for owner, paths in others.items()
            for path in new_paths & paths
            if _get(live, path) != _get(config, path)
        )
        if conflicts and not force:
            raise _conflict(rtype, config, conflicts)
        for owner, path in conflicts:  # forced: the applier takes the field over
            others[owner].discard(path)
    owned_by_others = set().union(*others.values()) if others else set()
    for path in sorted(mine - new_paths, key=len):
        if path not in owned_by_others and not any(p[: len(path)] == path for p in owned_by_others | new_paths):
            _remove(result, path)
    _merge(result, {k: v for k, v in config.items() if k != "status"})
    meta = result.setdefault("metadata", {})
    kept = [
        {**entry, "fieldsV1": _fields_v1(others[str(entry.get("manager"))])}
        if entry.get("operation") == "Apply"
        else entry
        for entry in kept
        if entry.get("operation") != "Apply" or others.get(str(entry.get("manager")))
    ]
    meta["managedFields"] = [
        *kept,
        {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": version,
            "time": now_timestamp(),
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields_v1(new_paths),
        },
    ]
    return result


def _conflict(rtype: ResourceType, config: Obj, conflicts: list[tuple[str, Path]]) -> ApiError:
    name = str((config.get("metadata") or {}).get("name") or "")
    lines = [f'conflict with "{owner}": .{".".join(path)}' for owner, path in conflicts]
    count = len(conflicts)
    message = f"Apply failed with {count} conflict{'s' if count > 1 else ''}: " + "\n".join(lines)
    causes = [{"reason": "FieldManagerConflict", "message": line, "field": "." + ".".join(p)} for (_, p), line in
              zip(conflicts, lines, strict=True)]  # fmt: skip
    return ApiError(409, "Conflict", message, details={"name": name, "group": rtype.group, "kind": rtype.plural},
                    causes=causes)  # fmt: skip


def _get(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _remove(obj: Obj, path: Path) -> None:
    parent = _get(obj, path[:-1])
    if isinstance(parent, dict):
        parent.pop(path[-1], None)


def _merge(live: Obj, config: Obj) -> None:
    """Maps merge key by key; scalars and (atomic) lists replace."""
    for key, value in config.items():
        if isinstance(value, dict) and isinstance(live.get(key), dict):
            _merge(live[key], value)
        else:
            live[key] = copy.deepcopy(value)


def _fields_v1(paths: set[Path]) -> Obj:
    tree: Obj = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def _paths_of(fields: Obj) -> set[Path]:
    """Inverse of `_fields_v1`: a path for every node below the top level, and every leaf."""
    paths: set[Path] = set()

    def walk(node: Obj, path: Path) -> None:
        children = [k for k in node if k.startswith("f:")]
        if path and (not children or len(path) > _TOP_LEVEL):
            paths.add(path)
        for key in children:
            value = node[key]
            walk(value if isinstance(value, dict) else {}, (*path, key[2:]))

    walk(fields, ())
    return paths
