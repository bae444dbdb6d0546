"""Resource types the emulated Kubernetes API server knows: built-ins, and CRDs turned into types."""

from __future__ import annotations

import copy
import marshal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

Obj = dict[str, Any]

_ATOMS = (str, int, float, bool, type(None))
_T = TypeVar("_T")


def json_copy(value: _T) -> _T:
    """A deep copy of JSON data (what the store holds: dicts, lists, strings, numbers, booleans, null). Every read,
    write and watch event copies an object, so this is the emulated API server's commonest work with many jobs at once
    (docs/reliability.md, "Load"): `marshal` copies a rendered RayCluster in about half the time of a Python walk, and
    in a quarter of `copy.deepcopy`'s. Format version 2 writes no references, so a list or dict that appears twice in
    `value` is two in the copy, as a JSON round trip makes it. What marshal does not take (a subclass, an object, a
    nesting too deep) is copied by walking it."""
    try:
        return cast(_T, marshal.loads(marshal.dumps(cast(Any, value), _NO_REFERENCES)))
    except ValueError:
        return _walked_copy(value)


_NO_REFERENCES = 2
"""marshal's format version 2: version 3 and later share what `value` shares."""


def _walked_copy(value: _T) -> _T:
    kind = type(value)
    if kind is dict:
        return cast(_T, {key: _walked_copy(item) for key, item in cast(dict[Any, Any], value).items()})
    if kind is list:
        return cast(_T, [_walked_copy(item) for item in cast(list[Any], value)])
    if kind in _ATOMS:
        return value
    return copy.deepcopy(value)


# Field selectors every type supports, plus the ones real built-in types add.
_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True, kw_only=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry (or a built-in table column)."""

    name: str
    type: str
    json_path: str
    format: str = ""
    description: str = ""
    priority: int = 0


@dataclass(frozen=True, kw_only=True, eq=False)
class ResourceType:
    """A served resource: what discovery lists and what the storage keys objects by."""

    group: str
    versions: tuple[str, ...]
    """Served versions, the preferred one first. Objects are stored once and served in any of them."""
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    builtin: bool = True
    printer_columns: Mapping[str, tuple[PrinterColumn, ...]] = field(default_factory=dict)
    """Per version; a CRD version without columns gets the default NAME and AGE."""
    schemas: Mapping[str, Obj] = field(default_factory=dict)
    """Per version, the CRD's openAPIV3Schema (used for pruning and validation)."""
    field_selectors: frozenset[str] = _META_FIELDS
    deprecation: str = ""
    """The warning the real server sends with every request on a deprecated type (a `Warning: 299` header)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def group_resource(self) -> str:
        """`plural.group` as error messages spell it (`pods` for the core group)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_version(self, version: str | None = None) -> str:
        version = version or self.versions[0]
        return f"{self.group}/{version}" if self.group else version


def _core(kind: str, plural: str, *, namespaced: bool = True, **extra: Any) -> ResourceType:
    return ResourceType(
        group="", versions=("v1",), kind=kind, plural=plural, singular=kind.lower(), namespaced=namespaced, **extra
    )


_EVENT_FIELDS = _META_FIELDS | {
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
}


def builtin_types() -> list[ResourceType]:
    """The built-in kinds the operator, kopf, kubectl and the local KubeRay stand-in use."""
    return [
        _core(
            "Namespace",
            "namespaces",
            namespaced=False,
            short_names=("ns",),
            status_subresource=True,
            field_selectors=_META_FIELDS | {"status.phase"},
        ),
        _core(
            "Pod",
            "pods",
            short_names=("po",),
            categories=("all",),
            status_subresource=True,
            field_selectors=_META_FIELDS | {"spec.nodeName", "spec.restartPolicy", "status.phase", "status.podIP"},
        ),
        _core("Node", "nodes", namespaced=False, short_names=("no",), status_subresource=True),
        _core("Service", "services", short_names=("svc",), categories=("all",), status_subresource=True),
        _core("Event", "events", short_names=("ev",), field_selectors=_EVENT_FIELDS),
        _core("ConfigMap", "configmaps", short_names=("cm",)),
        _core("Secret", "secrets", field_selectors=_META_FIELDS | {"type"}),
        _core("ServiceAccount", "serviceaccounts", short_names=("sa",)),
        _core(
            "Endpoints",
            "endpoints",
            short_names=("ep",),
            deprecation="v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice",
        ),
        ResourceType(
            group="events.k8s.io",
            versions=("v1",),
            kind="Event",
            plural="events",
            singular="event",
            namespaced=True,
            short_names=("ev",),
            field_selectors=_META_FIELDS | {"reason", "type", "regarding.kind", "regarding.name"},
        ),
        # What the Helm chart installs: the operator's Deployment (stored, defaulted and validated by
        # `workloads.py`; no controller runs it), and the API server's own EndpointSlice it may look up.
        ResourceType(
            group="apps",
            versions=("v1",),
            kind="Deployment",
            plural="deployments",
            singular="deployment",
            namespaced=True,
            short_names=("deploy",),
            categories=("all",),
            status_subresource=True,
        ),
        ResourceType(
            group="discovery.k8s.io",
            versions=("v1",),
            kind="EndpointSlice",
            plural="endpointslices",
            singular="endpointslice",
            namespaced=True,
        ),
        # The operator applies one per job to close Ray's ports; stored and served, not enforced.
        ResourceType(
            group="networking.k8s.io",
            versions=("v1",),
            kind="NetworkPolicy",
            plural="networkpolicies",
            singular="networkpolicy",
            namespaced=True,
            short_names=("netpol",),
        ),
        ResourceType(
            group="apiextensions.k8s.io",
            versions=("v1",),
            kind="CustomResourceDefinition",
            plural="customresourcedefinitions",
            singular="customresourcedefinition",
            namespaced=False,
            short_names=("crd", "crds"),
            categories=("api-extensions",),
            status_subresource=True,
        ),
    ]


class InvalidDefinition(ValueError):
    """A CRD the real server would reject (422)."""


def type_from_crd(crd: Mapping[str, Any]) -> ResourceType:
    """Turn a `CustomResourceDefinition` body into the resource type it registers."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group")
    plural = names.get("plural")
    kind = names.get("kind")
    if not group or not plural or not kind:
        raise InvalidDefinition("spec.group, spec.names.plural and spec.names.kind are required")
    expected_name = f"{plural}.{group}"
    if (crd.get("metadata") or {}).get("name") != expected_name:
        raise InvalidDefinition(
            f'metadata.name: Invalid value: must be spec.names.plural+"."+spec.group: "{expected_name}"'
        )
    scope = spec.get("scope")
    if scope not in ("Namespaced", "Cluster"):
        raise InvalidDefinition('spec.scope: Unsupported value: supported values: "Cluster", "Namespaced"')
    versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
    if not versions:
        raise InvalidDefinition("spec.versions: Invalid value: must have exactly one version marked as storage version")
    # Discovery's preferred version is the storage version's peer with the highest priority; keep it simple:
    # the storage version first, then the rest in the order given.
    versions.sort(key=lambda v: not v.get("storage", False))
    columns: dict[str, tuple[PrinterColumn, ...]] = {}
    schemas: dict[str, Obj] = {}
    status = False
    for version in versions:
        columns[version["name"]] = tuple(
            PrinterColumn(
                name=column["name"],
                type=column.get("type", "string"),
                json_path=column["jsonPath"],
                format=column.get("format", ""),
                description=column.get("description", ""),
                priority=int(column.get("priority", 0)),
            )
            for column in version.get("additionalPrinterColumns") or []
        )
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema:
            schemas[version["name"]] = schema
        status = status or "status" in (version.get("subresources") or {})
    return ResourceType(
        group=group,
        versions=tuple(v["name"] for v in versions),
        kind=kind,
        plural=plural,
        singular=names.get("singular") or kind.lower(),
        namespaced=scope == "Namespaced",
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        status_subresource=status,
        builtin=False,
        printer_columns=columns,
        schemas=schemas,
    )
