"""What a real API server (v1.35) refuses in a Pod at creation, for what the operator and KubeRay put in pods.

From the Pod API reference and the Kubernetes docs ("Expose Pod Information to Containers Through Environment
Variables", "Resource Management for Pods and Containers", "Object Names and IDs", "Labels and Selectors",
"Define Environment Variables for a Container") and their checks in `pkg/apis/core/validation`; messages as
the real server prints them. docs/conformance.md says what is checked and what is not.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from decimal import ROUND_CEILING, Context, Decimal, InvalidOperation, localcontext
from typing import Any

from fsdp_operator.local.server.structural import FieldError

Obj = dict[str, Any]

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_IANA_SVC_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
_QUANTITY = re.compile(r"([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)")
_QUANTITY_MESSAGE = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"

_LABEL_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation "
    "is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_NAME_PART_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_DNS1123_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)

# Downward API fields an env var may name (validEnvDownwardAPIFieldPathExpressions), and what the
# field-label conversion of pods knows at all (ConvertDownwardAPIFieldLabel); labels and annotations only
# with a subscript in env vars.
_ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
_POD_FIELD_LABELS = frozenset(
    {
        *_ENV_FIELD_PATHS,
        "metadata.annotations",
        "metadata.labels",
        "spec.restartPolicy",
        "spec.schedulerName",
        "status.phase",
        "spec.host",
    }
)
_RESOURCE_FIELDS = (
    "limits.cpu",
    "limits.ephemeral-storage",
    "limits.memory",
    "requests.cpu",
    "requests.ephemeral-storage",
    "requests.memory",
)
_CPU_DIVISORS = frozenset({"1m", "1"})
_BYTE_DIVISORS = frozenset({"1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei"})
_BYTE_DIVISORS_TEXT = "1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei"
_STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})

# ---------------------------------------------------------------------- quantities

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exponent: suffix for suffix, exponent in _DECIMAL.items()}
# Enough digits for any quantity a cluster can hold; exponents beyond these bounds are refused, not computed.
_QUANTITY_CONTEXT = Context(prec=80, Emax=120, Emin=-120, traps=[InvalidOperation])


class QuantityError(ValueError):
    pass


def parse_quantity(text: str) -> tuple[Decimal, str]:
    """(value, format) of a resource.Quantity; format is "BinarySI", "DecimalSI" or "DecimalExponent"."""
    try:
        with localcontext(_QUANTITY_CONTEXT):
            return _parse_quantity(text)
    except ArithmeticError as e:  # an exponent beyond any real quantity
        raise QuantityError(_QUANTITY_MESSAGE) from e


def _parse_quantity(text: str) -> tuple[Decimal, str]:
    match = _QUANTITY.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None or text != text.strip():
        raise QuantityError(_QUANTITY_MESSAGE)
    number, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as e:
        raise QuantityError(_QUANTITY_MESSAGE) from e
    if suffix in _BINARY:
        return value * Decimal(1024) ** _BINARY[suffix], "BinarySI"
    if suffix in _DECIMAL:
        return value.scaleb(_DECIMAL[suffix]), "DecimalSI"
    exponent = re.fullmatch(r"[eE]([-+]?[0-9]+)", suffix)
    if exponent is None:
        raise QuantityError(_QUANTITY_MESSAGE)
    return value.scaleb(int(exponent.group(1))), "DecimalExponent"


def canonical_quantity(text: str) -> str:
    """The quantity as the real server writes it back (Quantity.String()): e.g. 1000m -> 1, 0.5Gi -> 512Mi."""
    value, fmt = parse_quantity(text)
    try:
        with localcontext(_QUANTITY_CONTEXT):
            return _canonical(value, fmt)
    except ArithmeticError as e:
        raise QuantityError(_QUANTITY_MESSAGE) from e


def _canonical(value: Decimal, fmt: str) -> str:
    # Below a nano, a Quantity rounds up (away from zero) to the nano.
    value = value.quantize(Decimal("1e-9"), rounding=ROUND_CEILING) if value > 0 else value.quantize(Decimal("1e-9"))
    if fmt == "BinarySI" and value == value.to_integral_value() and abs(value) >= 1024:
        number, power = int(value), 0
        while power < 6 and number % 1024 == 0:
            number, power = number // 1024, power + 1
        suffix = next((s for s, p in _BINARY.items() if p == power), "")
        return f"{number}{suffix}"
    if value == 0:
        return "0"
    exponent = -9
    while exponent < 18 and value.scaleb(-(exponent + 3)) == value.scaleb(-(exponent + 3)).to_integral_value():
        exponent += 3
    number = int(value.scaleb(-exponent))
    if fmt == "DecimalExponent":
        return f"{number}e{exponent}" if exponent else str(number)
    return f"{number}{_DECIMAL_SUFFIX[exponent]}"


# ---------------------------------------------------------------------- names


def qualified_name_errors(name: str) -> list[str]:
    """IsQualifiedName: an optional DNS-subdomain prefix and '/', then a name part of at most 63 characters."""
    parts = name.split("/")
    if len(parts) == 1:
        prefix, part = "", parts[0]
    elif len(parts) == 2:
        prefix, part = parts
        if not prefix:
            return ["prefix part must be non-empty"]
    else:
        return [
            _NAME_PART_MESSAGE.replace("name part", "a qualified name", 1)
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    errors = []
    if not part:
        errors.append("name part must be non-empty")
    elif len(part) > 63:
        errors.append("name part must be no more than 63 characters")
    if part and not _QUALIFIED_NAME.fullmatch(part):
        errors.append(_NAME_PART_MESSAGE)
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        errors.append(
            "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
            "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
            "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    return errors


def _metadata(meta: Obj) -> Iterator[FieldError]:
    for key, value in (meta.get("labels") or {}).items():
        for message in qualified_name_errors(str(key)):
            yield FieldError("metadata.labels", "Invalid", message, key)
        value = "" if value is None else value
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            detail = (
                "must be no more than 63 characters" if isinstance(value, str) and len(value) > 63 else _LABEL_MESSAGE
            )
            yield FieldError("metadata.labels", "Invalid", detail, value)
    annotations = meta.get("annotations") or {}
    for key in annotations:
        for message in qualified_name_errors(str(key).lower()):
            yield FieldError("metadata.annotations", "Invalid", message, key)
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > 256 * 1024:
        yield FieldError("metadata.annotations", "Invalid", "must have at most 262144 bytes", "...")


# ---------------------------------------------------------------------- the pod


def validate_pod(pod: Obj) -> list[FieldError]:
    """The errors a real server reports for this Pod at creation, in its order (metadata, then spec)."""
    errors = list(_metadata(pod.get("metadata") or {}))
    errors.extend(_pod_spec(pod.get("spec") or {}, "spec"))
    return errors


def pod_warnings(pod: Obj) -> list[str]:
    """The warnings a real server returns with an accepted Pod (`Warning` headers, pkg/api/pod/warnings.go):
    here, byte quantities that are not whole bytes (`memory: 160m` is 0.16 bytes)."""
    warnings = []
    spec = pod.get("spec") or {}
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            resources = (container or {}).get("resources") or {}
            for kind in ("limits", "requests"):
                for name, quantity in (resources.get(kind) or {}).items():
                    if name not in ("memory", "ephemeral-storage") and not str(name).startswith("hugepages-"):
                        continue
                    try:
                        value, _ = parse_quantity(str(quantity))
                    except QuantityError:
                        continue
                    if value != value.to_integral_value():
                        warnings.append(
                            f"spec.{group}[{i}].resources.{kind}[{name}]: fractional byte value "
                            f'"{canonical_quantity(str(quantity))}" is invalid, must be an integer'
                        )
    return warnings


def _pod_spec(spec: Obj, path: str) -> Iterator[FieldError]:
    volumes: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        name = str((volume or {}).get("name", ""))
        where = f"{path}.volumes[{i}].name"
        if not name:
            yield FieldError(where, "Required", "")
        elif len(name) > 63 or not _DNS1123_LABEL.fullmatch(name):
            yield FieldError(where, "Invalid", _DNS1123_LABEL_MESSAGE, name)
        elif name in volumes:
            yield FieldError(where, "Duplicate", "", name)
        volumes.add(name)
    containers = spec.get("containers") or []
    if not containers:
        yield FieldError(f"{path}.containers", "Required", "")
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            yield from _container(container or {}, f"{path}.{group}[{i}]", names, volumes)


def _container(c: Obj, path: str, names: set[str], volumes: set[str]) -> Iterator[FieldError]:
    name = str(c.get("name", ""))
    if not name:
        yield FieldError(f"{path}.name", "Required", "")
    elif len(name) > 63 or not _DNS1123_LABEL.fullmatch(name):
        yield FieldError(f"{path}.name", "Invalid", _DNS1123_LABEL_MESSAGE, name)
    elif name in names:
        yield FieldError(f"{path}.name", "Duplicate", "", name)
    names.add(name)
    if not str(c.get("image", "")).strip():
        yield FieldError(f"{path}.image", "Required", "")
    port_names: set[str] = set()
    for i, port in enumerate(c.get("ports") or []):
        yield from _port(port or {}, f"{path}.ports[{i}]", port_names)
    for i, env in enumerate(c.get("env") or []):
        yield from _env(env or {}, f"{path}.env[{i}]")
    for i, mount in enumerate(c.get("volumeMounts") or []):
        mount = mount or {}
        if not mount.get("name"):
            yield FieldError(f"{path}.volumeMounts[{i}].name", "Required", "")
        elif mount["name"] not in volumes:
            yield FieldError(f"{path}.volumeMounts[{i}].name", "NotFound", "", mount["name"])
        if not mount.get("mountPath"):
            yield FieldError(f"{path}.volumeMounts[{i}].mountPath", "Required", "")
    yield from _resources(c.get("resources") or {}, f"{path}.resources")


def _port(port: Obj, path: str, names: set[str]) -> Iterator[FieldError]:
    number = port.get("containerPort")
    if not isinstance(number, int) or not 1 <= number <= 65535:
        yield FieldError(f"{path}.containerPort", "Invalid", "must be between 1 and 65535, inclusive", number)
    name = port.get("name")
    if name:
        if len(name) > 15:
            yield FieldError(f"{path}.name", "Invalid", "must be no more than 15 characters", name)
        elif not _IANA_SVC_NAME.fullmatch(name) or "--" in name or not re.search("[a-z]", name):
            yield FieldError(
                f"{path}.name",
                "Invalid",
                "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-), contain at least one letter "
                "(a-z), and not start or end with, or contain consecutive, hyphens",
                name,
            )
        elif name in names:
            yield FieldError(f"{path}.name", "Duplicate", "", name)
        names.add(name)
    protocol = port.get("protocol", "TCP")
    if protocol not in ("TCP", "UDP", "SCTP"):
        yield FieldError(f"{path}.protocol", "Unsupported", '"SCTP", "TCP", "UDP"', protocol)


def _env(env: Obj, path: str) -> Iterator[FieldError]:
    name = env.get("name")
    if not name:
        yield FieldError(f"{path}.name", "Required", "")
    elif not all(32 <= ord(ch) <= 126 and ch != "=" for ch in str(name)):
        # Since v1.34 (RelaxedEnvironmentVariableValidation, GA) any printable ASCII but '=' is allowed.
        yield FieldError(
            f"{path}.name",
            "Invalid",
            "a valid environment variable name must consist only of printable ASCII characters other than '='",
            name,
        )
    source = env.get("valueFrom")
    if source is None:
        return
    where = f"{path}.valueFrom"
    kinds = [
        k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef", "fileKeyRef") if source.get(k)
    ]
    if env.get("value"):
        yield FieldError(where, "Invalid", "may not be specified when `value` is not empty", "")
    if not kinds:
        yield FieldError(
            where,
            "Invalid",
            "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
            "",
        )
        return
    if len(kinds) > 1:
        yield FieldError(where, "Invalid", "may not have more than one field specified at a time", "")
        return
    if "fieldRef" in kinds:
        yield from _field_ref(source["fieldRef"], f"{where}.fieldRef")
    if "resourceFieldRef" in kinds:
        yield from _resource_field_ref(source["resourceFieldRef"], f"{where}.resourceFieldRef")
    for kind in ("configMapKeyRef", "secretKeyRef"):
        if kind in kinds:
            ref = source[kind]
            if not ref.get("key"):
                yield FieldError(f"{where}.{kind}.key", "Required", "")
            if not ref.get("name"):
                yield FieldError(f"{where}.{kind}.name", "Required", "")


def _field_ref(ref: Obj, path: str) -> Iterator[FieldError]:
    field_path = str(ref.get("fieldPath", ""))
    version = ref.get("apiVersion") or "v1"  # defaulted to v1 before validation
    if not field_path:
        yield FieldError(f"{path}.fieldPath", "Required", "")
        return
    subscripted = re.fullmatch(r"([^\[\]]+)\['(.*)'\]", field_path)
    if version != "v1":
        yield FieldError(
            f"{path}.fieldPath",
            "Invalid",
            f"error converting fieldPath: unsupported pod version: {version}",
            field_path,
        )
    elif subscripted is not None:
        base, key = subscripted.groups()
        if base not in ("metadata.annotations", "metadata.labels"):
            yield FieldError(
                f"{path}.fieldPath",
                "Invalid",
                f"error converting fieldPath: field label does not support subscript: {field_path}",
                field_path,
            )
        else:
            for message in qualified_name_errors(key.lower() if base == "metadata.annotations" else key):
                yield FieldError(path, "Invalid", message, key)
    elif field_path not in _POD_FIELD_LABELS:
        yield FieldError(
            f"{path}.fieldPath",
            "Invalid",
            f"error converting fieldPath: field label not supported: {field_path}",
            field_path,
        )
    elif field_path not in _ENV_FIELD_PATHS and field_path != "spec.host":
        yield FieldError(f"{path}.fieldPath", "Unsupported", ", ".join(f'"{p}"' for p in _ENV_FIELD_PATHS), field_path)


def _resource_field_ref(ref: Obj, path: str) -> Iterator[FieldError]:
    resource = str(ref.get("resource", ""))
    if not resource:
        yield FieldError(f"{path}.resource", "Required", "")
        return
    hugepages = resource.startswith(("limits.hugepages-", "requests.hugepages-"))
    if resource not in _RESOURCE_FIELDS and not hugepages:
        yield FieldError(f"{path}.resource", "Unsupported", ", ".join(f'"{r}"' for r in _RESOURCE_FIELDS), resource)
        return
    divisor = ref.get("divisor")
    if divisor in (None, "", 0, "0"):
        return
    try:
        canonical = canonical_quantity(str(divisor))
    except QuantityError as e:
        yield FieldError(f"{path}.divisor", "Invalid", str(e), divisor)
        return
    if canonical == "0":
        return
    if resource.endswith(".cpu"):
        if canonical not in _CPU_DIVISORS:
            yield FieldError(
                f"{path}.divisor",
                "Invalid",
                "only divisor's values 1m and 1 are supported with the cpu resource",
                resource,
            )
    elif canonical not in _BYTE_DIVISORS:
        what = {"memory": "memory", "ephemeral-storage": "local ephemeral storage"}.get(
            resource.split(".", 1)[1], "hugepages"
        )
        yield FieldError(
            f"{path}.divisor",
            "Invalid",
            f"only divisor's values {_BYTE_DIVISORS_TEXT} are supported with the {what} resource",
            resource,
        )


def _resources(resources: Obj, path: str) -> Iterator[FieldError]:
    parsed: dict[str, dict[str, Decimal]] = {}
    for kind in ("limits", "requests"):
        parsed[kind] = {}
        for name, quantity in (resources.get(kind) or {}).items():
            where = f"{path}.{kind}[{name}]"
            problems = qualified_name_errors(str(name))
            if problems:
                for message in problems:
                    yield FieldError(where, "Invalid", message, name)
                continue
            if "/" not in name and name not in _STANDARD_RESOURCES and not name.startswith("hugepages-"):
                yield FieldError(where, "Invalid", "must be a standard resource type or fully qualified", name)
                continue
            try:
                value, _ = parse_quantity(str(quantity))
            except QuantityError as e:
                yield FieldError(where, "Invalid", str(e), quantity)
                continue
            if value < 0:
                yield FieldError(where, "Invalid", "must be greater than or equal to 0", str(quantity))
                continue
            extended = "/" in name and not name.startswith("kubernetes.io/")
            if extended and value != value.to_integral_value():
                yield FieldError(where, "Invalid", "must be an integer", str(quantity))
                continue
            parsed[kind][name] = value
    limits, requests = parsed["limits"], parsed["requests"]
    for name, request in requests.items():
        extended = "/" in name and not name.startswith("kubernetes.io/")
        limit = limits.get(name)
        if extended or name.startswith("hugepages-"):
            if limit is None:
                yield FieldError(f"{path}.limits", "Required", "Limit must be set for non overcommitable resources")
            elif limit != request:
                yield FieldError(
                    f"{path}.requests[{name}]",
                    "Invalid",
                    f"must be equal to {name} limit of {_text(resources, 'limits', name)}",
                    _text(resources, "requests", name),
                )
        elif limit is not None and request > limit:
            yield FieldError(
                f"{path}.requests",
                "Invalid",
                f"must be less than or equal to {name} limit of {_text(resources, 'limits', name)}",
                _text(resources, "requests", name),
            )


def _text(resources: Mapping[str, Any], kind: str, name: str) -> str:
    return canonical_quantity(str(resources[kind][name]))
