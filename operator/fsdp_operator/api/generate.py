"""What is generated from the field declarations: the OpenAPI schema of `spec`, the CRD, docs/api.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

from fsdp_operator.api.fields import (
    Declared,
    Meta,
    Quantity,
    _default_value,
    _is_declaration,
    _item_meta,
    _max_length,
    _num,
    _unwrap_optional,
    declared,
    leaves,
)
from fsdp_operator.api.schema import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    PRINTER_COLUMNS,
    SHORT_NAMES,
    SINGULAR,
    STATUS_SCHEMA,
    VERSION,
    Schema,
)


def openapi(cls: type, description: str, *, defaults: bool = True) -> dict[str, Any]:
    """The OpenAPI v3 schema of a declaration, as the CRD carries it.

    Without `defaults`, the API server fills nothing in (for pieces of a PodSpec passed on as written).
    """
    properties = {d.key: _field_schema(d, defaults=defaults) for d in declared(cls)}
    schema: dict[str, Any] = {"type": "object", "description": description, "properties": properties}
    required = [d.key for d in declared(cls) if d.meta.required]
    if required:
        schema["required"] = required
    return schema


def _field_schema(d: Declared, *, defaults: bool) -> dict[str, Any]:
    schema = _type_schema(_unwrap_optional(d.hint), d.meta, defaults=defaults)
    schema["description"] = d.meta.doc if d.meta.unset is None else f"{d.meta.doc} Unset: {d.meta.unset}."
    default = None if d.optional or d.meta.unset is not None or not defaults else _default_value(d)
    if not defaults:
        pass
    elif _is_declaration(d.hint):
        # `default: {}` lets the API server descend and fill nested defaults when a group is omitted.
        schema["default"] = {}
    elif default not in (None, [], {}):
        schema["default"] = default
    return _ordered(schema)


def _ordered(schema: dict[str, Any]) -> dict[str, Any]:
    first = ("type", "description")
    return {**{k: schema[k] for k in first if k in schema}, **{k: v for k, v in schema.items() if k not in first}}


def _type_schema(hint: Any, meta: Meta, *, defaults: bool = True) -> dict[str, Any]:
    if _is_declaration(hint):
        return openapi(hint, meta.doc, defaults=defaults)
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer", **_bound_schema(meta, integer=True)}
    if hint is float:
        return {"type": "number", **_bound_schema(meta, integer=False)}
    if get_origin(hint) is Literal:
        return {"type": "string", "enum": list(get_args(hint))}
    if hint is Quantity:
        schema: dict[str, Any] = {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
        }
        if meta.grammar is not None and meta.grammar.pattern:
            schema["pattern"] = meta.grammar.pattern
        return schema
    if hint is str:
        schema = {"type": "string", "maxLength": _max_length(meta)}
        if meta.grammar is not None and meta.grammar.check("") is not None:
            schema["minLength"] = 1  # the parser refuses "": so does the API server, before the operator sees it
        if meta.grammar is not None and meta.grammar.pattern:
            schema["pattern"] = meta.grammar.pattern
        return schema
    if hint is Any:  # checked by the rules of its declaration (model.overrides: model_configs)
        return {"x-kubernetes-preserve-unknown-fields": True}
    origin = get_origin(hint)
    if origin is list:
        (item_hint,) = get_args(hint)
        if meta.shape is not None:
            items = openapi(meta.shape, meta.doc, defaults=False)
        else:
            items = _type_schema(item_hint, _item_meta(meta))
        items.pop("description", None)
        schema = {"type": "array", "items": items}
        if meta.max_items is not None:
            schema["maxItems"] = meta.max_items
        return schema
    if origin is dict:
        _, value_hint = get_args(hint)
        if value_hint == (int | str):
            # A real API server allows types under anyOf only in exactly this int-or-string shape; bounds go
            # beside it (numeric keywords apply to integers only), or the CRD is not structural.
            value_schema: dict[str, Any] = {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
                **_bound_schema(meta, integer=True),
            }
        else:
            value_meta = Meta(doc="", grammar=meta.values, max_length=meta.max_length)
            value_schema = _type_schema(value_hint, value_meta)
        schema = {"type": "object", "additionalProperties": value_schema}
        if meta.max_items is not None:
            schema["maxProperties"] = meta.max_items
        return schema
    raise TypeError(f"no schema for the declared type {hint!r}")


def _bound_schema(meta: Meta, *, integer: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cast: Callable[[float], float | int] = int if integer else float
    if meta.minimum is not None:
        out["minimum"] = cast(meta.minimum)
        if meta.exclusive_minimum:
            out["exclusiveMinimum"] = True
    if meta.maximum is not None:
        out["maximum"] = cast(meta.maximum)
    return out


def reference(cls: type, path: str) -> list[tuple[str, str, str, str]]:
    """(field path, type, default, description with bounds) for every field under `cls`."""
    rows = []
    for d in declared(cls):
        sub = f"{path}.{d.key}"
        hint = _unwrap_optional(d.hint)
        if _is_declaration(hint):
            rows.append((sub, "object", "", d.meta.doc))
            rows += reference(hint, sub)
            continue
        if d.meta.shape is not None:
            rows.append((sub, "array of objects", "", d.meta.doc))
            rows += reference(d.meta.shape, f"{sub}[]")
            continue
        default = _default_value(d)
        shown_default = (
            f"unset: {d.meta.unset}"
            if d.meta.unset is not None
            else "unset"
            if d.optional
            else ""
            if default in ([], {}, None)
            else _doc_value(default)
        )
        rows.append((sub, _type_words(hint, d.meta), shown_default, _doc_with_bounds(d)))
    return rows


def _doc_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value == "" or value.strip() != value else value
    return str(value)


def _type_words(hint: Any, meta: Meta) -> str:
    if hint is bool:
        return "boolean"
    if hint is int:
        return "integer"
    if hint is float:
        return "number"
    if hint is Quantity:
        return "quantity"
    if get_origin(hint) is Literal:
        return " or ".join(f'"{a}"' if a == "" else a for a in get_args(hint))
    if hint is str:
        return f"string ({meta.grammar.name})" if meta.grammar is not None else "string"
    origin = get_origin(hint)
    if origin is list:
        (item,) = get_args(hint)
        return f"array of {_type_words(item, _item_meta(meta))}"
    if origin is dict:
        _, value_hint = get_args(hint)
        keys = meta.keys.name if meta.keys is not None else "string"
        values = (
            "integer or string"
            if value_hint == (int | str)
            else _type_words(value_hint, Meta(doc="", grammar=meta.values))
        )
        return f"map of {keys} to {values}"
    if hint is Any:
        return "value"
    return str(hint)


def _doc_with_bounds(d: Declared) -> str:
    m = d.meta
    limits = []
    if m.minimum is not None:
        limits.append(f"{'>' if m.exclusive_minimum else '>='} {_num(m.minimum)}")
    if m.maximum is not None:
        limits.append(f"<= {_num(m.maximum)}")
    if m.max_items is not None:
        limits.append(f"at most {m.max_items} entries")
    suffix = f" ({', '.join(limits)})" if limits else ""
    return f"{m.doc}{suffix}"


def spec_schema() -> Schema:
    """The OpenAPI schema of `spec`, generated from the declarations in spec.py."""
    from fsdp_operator.api import model_configs, spec

    generated = openapi(spec.Spec, spec.Spec.__doc__ or "")
    overrides = generated["properties"]["model"]["properties"]["overrides"]
    # Typed per config field, so the API server refuses `num_hidden_layers: "2"` and prunes (or, with strict
    # field validation, refuses) `trust_remote_code`; the family check is the operator's (model_configs).
    overrides.pop("additionalProperties")
    overrides["properties"] = model_configs.openapi_properties()
    return generated


IMMUTABLE_HOW_TO_RERUN = (
    "delete the job and apply it again to run another spec (Argo CD: the sync options Replace=true,Force=true; "
    "Flux: force: true)"
)


def immutability_rules() -> list[Schema]:
    """The CRD's CEL rules (`x-kubernetes-validations` at its root) that refuse an edit of a field not declared
    `mutable` once the operator has taken the job (`status.submissionId`, recorded at its first pass): a running
    job cannot follow another spec, so `observedGeneration` never claims one it does not run (docs/gitops.md).

    One rule per field, so that the refusal names it (`fieldPath`, reason `FieldValueForbidden`, Kubernetes 1.28+);
    a declaration with mutable fields gets rules for its other fields. Before the operator took the job (and for a
    job whose spec failed validation, which never gets a submission id) every field may change. Transition rules
    (they use `oldSelf`) run on updates only, never on creates."""
    from fsdp_operator.api import spec

    def rules(cls: type, path: list[str]) -> list[Schema]:
        out: list[Schema] = []
        for d in declared(cls):
            here = [*path, d.key]
            if d.meta.mutable:
                continue
            if d.nested is not None and any(m.meta.mutable for _, m in leaves(d.nested)):
                out += rules(d.nested, here)
                continue
            out.append(_immutable(here))
        return out

    return rules(spec.Spec, ["spec"])


def _immutable(path: list[str]) -> Schema:
    def present(root: str) -> str:  # null-safe: `has(a.b.c)` needs a.b
        return " && ".join(f"has({'.'.join([root, *path[: i + 1]])})" for i in range(1, len(path)))

    new, old = ".".join(["self", *path]), ".".join(["oldSelf", *path])
    same = f"({present('self')} ? {present('oldSelf')} && {new} == {old} : !({present('oldSelf')}))"
    dotted = ".".join(path)
    return {
        "rule": f"!has(oldSelf.status) || !has(oldSelf.status.submissionId) || {same}",
        "message": f"{dotted} cannot change once the operator has taken the job; {IMMUTABLE_HOW_TO_RERUN}",
        "fieldPath": "." + dotted,
        "reason": "FieldValueForbidden",
    }


def crd() -> Schema:
    """The CustomResourceDefinition manifest."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["all", "ray"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An FSDP training run on a KubeRay RayCluster.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": STATUS_SCHEMA,
                            },
                            "required": ["spec"],
                            "x-kubernetes-validations": immutability_rules(),
                        }
                    },
                }
            ],
        },
    }


REFUSED_UP_FRONT_INTRO = (
    "What the kubelet, an object store, etcd or the training function itself would refuse later (or what could "
    "never work) is refused by `fsdpctl validate` and by the operator before anything is created, each problem "
    "naming its field."
)
REFUSED_UP_FRONT: tuple[tuple[str, str, str], ...] = (
    ("`spec.image`", "anything outside the reference grammar; a digest of an algorithm other than sha256, sha384 "
     "or sha512, with upper-case hex digits, or of the wrong length (64, 96, 128 hex digits); a name of 64 hex "
     "digits (an image id); a name over 255 characters",
     "github.com/distribution/reference (regexp.go, normalize.go), github.com/opencontainers/go-digest, OCI "
     "image-spec descriptor.md \"Digests\""),
    ("storage URIs (`checkpoint.storage`, `output.storage`, `data.source`, `data.validationSource`, "
     "`model.name`, `data.tokenizer`)",
     "a scheme other than `s3://`, `gs://`, `file:///` (and `hf://datasets/` for data) spelled in lower case, or "
     "an absolute path: `S3://b/x`, `file:/x`, `file://host/x`. The training function reads the same table "
     "(fsdp_train.contract.config.STORAGE_SCHEMES) and refuses the same URIs",
     "what the training function, pyarrow and Ray Train read"),
    ("S3 bucket names", "other than 3-63 characters of lowercase letters, digits, `.` and `-`, starting and ending "
     "with a letter or digit; two adjacent periods; an IP address; the prefixes `xn--`, `sthree-`, "
     "`amzn-s3-demo-`; the suffixes `-s3alias`, `--ol-s3`, `.mrap`, `--x-s3`, `--table-s3`",
     "AWS S3 User Guide, \"General purpose bucket naming rules\""),
    ("Cloud Storage bucket names", "outside 3-63 characters (222 with dots, 63 between dots) of lowercase letters, "
     "digits, `-`, `_` and `.`; an IP address; the prefix `goog`; `google` anywhere",
     "Cloud Storage documentation, \"Bucket names\""),
    ("a local checkpoint or output path with more than one worker",
     "unless it lies under `spec.sharedVolume.mountPath` (a ReadWriteMany PersistentVolumeClaim every Ray "
     "container mounts): each worker would write its own shards to its own disk, and nothing could resume. "
     "Otherwise use `s3://` or `gs://`", "Ray Train: storage_path must be shared storage for multi-node runs"),
    ("the RayCluster's size", "over 1.5 MiB less 64 KiB kept for what the API server and KubeRay add; the problem "
     "names the largest spec field (`spec.env` counts twice: it is set in the head and in the workers)",
     "etcd's `--max-request-bytes` (1.5 MiB by default)"),
    ("`spec.model.overrides`", "a value beyond the bounds in the table above; `hidden_size` not a multiple of "
     "`num_attention_heads`; `num_attention_heads` not a multiple of `num_key_value_heads`; an odd head size; "
     "a token id outside `vocab_size`. Judged on the model's own config where the operator knows it "
     "(Qwen/Qwen2.5-1.5B), else on the overrides given",
     "transformers 5.13: LlamaConfig's own check, repeat_kv, rotary embeddings, nn.Embedding's padding_idx"),
    ("`spec.workers.sharedMemory`", "less than 1Gi with GPUs, 64Mi without",
     "NCCL troubleshooting guide (\"Docker\": --shm-size=1g); Docker's 64 MiB default"),
    ("`spec.data.validationSplit`", "between 0 and 1e-06 (it would hold out nothing; use validationSource)",
     "the training function's split (each document held out with that probability)"),
    ("`spec.training.compileCacheDir`, local checkpoint and output paths", "the root directory, or one in /proc, "
     "/sys, /dev, /etc, /boot, /bin, /sbin, /lib*, /usr, /run, /var/run, /var/lib/kubelet",
     "Filesystem Hierarchy Standard 3.0; proc(5), sysfs(5)"),
    ("`spec.workers.instanceType`", "anything but EC2's lower-case family.size (`G6.12XLARGE` is refused with "
     "`g6.12xlarge` suggested)", "EC2 User Guide, \"Amazon EC2 instance type naming conventions\""),
    ("transport variables", "NCCL_*, FI_*, OFI_NCCL_*, TORCH_NCCL_*, RDMAV_*, IBV_*, MLX5_*, UCX_*, GLOO_*, TP_*, "
     "NVSHMEM_*, CUDA_* in `spec.env` or `spec.runtimeEnv.envVars` (they belong in `spec.network.env`); "
     "LD_LIBRARY_PATH and NCCL_CONF_FILE in every one of the three", "the DLC's aws-ofi-nccl and NCCL settings"),
    ("a JSON manifest", "one that starts as JSON (`{\"`) and is not strict JSON: a trailing comma, a comment, a "
     "single-quoted string", "kubectl's JSON decoder (encoding/json)"),
    ("`spec.runtimeEnv.pip`", "an entry with a line break, a backslash (pip joins a line ending in one with the "
     "next) or ` #` (a comment)", "pip's requirements file format"),
    ("placement against `spec.workers.nodeSelector`", "a `karpenter.k8s.aws/capacity-reservation-id` other than "
     "`placement.capacityReservationId`; `karpenter.sh/capacity-type: spot` with a reservation; a zone label "
     "(`topology.kubernetes.io/zone`, `failure-domain.beta.kubernetes.io/zone`) other than "
     "`placement.availabilityZone` or than each other; an instance-type, `karpenter.k8s.aws/instance-family` "
     "or `instance-size` label other than `instanceType`'s", "what the renderer would silently overwrite"),
)  # fmt: skip
ACCEPTED_WITH_REASON: tuple[str, ...] = (
    "A local checkpoint or output path with one worker: the one worker pod writes and reads it (it is lost with "
    "the pod; a restarted pod starts over).",
    "`sha384` digests: go-digest, which containerd and the kubelet use, knows them, although the OCI image spec "
    "registers only sha256 and sha512.",
    "A YAML flow mapping that starts with `{` but whose keys are not quoted (`{apiVersion: ...}`) is read as YAML, "
    "as before; only a document that starts as JSON is held to JSON.",
    "Cross-field override rules whose fields are not all known (a model other than Qwen/Qwen2.5-1.5B with, say, "
    "only `hidden_size` overridden): the training function's transformers judges them when it builds the model.",
)


def api_reference() -> str:
    """docs/api.md: every spec field (from the declarations) and status field (from STATUS_SCHEMA)."""
    from fsdp_operator.api import model_configs, spec

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [
        "# FSDPTrainingJob API reference",
        "",
        "<!-- Generated by `make crds` from operator/fsdp_operator/api/spec.py and schema.py; do not edit "
        "(a test checks it). -->",
        "",
        f"`apiVersion: {API_VERSION}`, `kind: {KIND}`, namespaced; short names: {', '.join(SHORT_NAMES)}. "
        "`metadata.name` must be a DNS-1123 label. Every spec field is optional; the defaults reproduce "
        "the reference setup (2x g6.12xlarge with EFA). `fsdpctl validate -f JOB.yaml` checks a manifest "
        "against everything below, bounds and rules across fields included.",
        "",
        "## spec",
        "",
        "| field | type | default | description |",
        "|---|---|---|---|",
    ]
    for path, kind, default, doc in reference(spec.Spec, "spec"):
        lines.append(f"| `{path}` | {cell(kind)} | {cell(default)} | {cell(doc)} |")
    lines += [
        "",
        "### Model config overrides",
        "",
        "`spec.model.overrides` may set only these fields of the model's Hugging Face config, in these types. "
        "The family comes from `spec.model.name` (a name with `Qwen2`/`Qwen2.5` in it: qwen2; `llama`: llama); "
        "for a name that says neither, a field must be one every family has. Loader options such as "
        "`trust_remote_code` or `token` are refused.",
        "",
        "| field | type | families |",
        "|---|---|---|",
    ]
    for name, kind, families in model_configs.reference_rows():
        lines.append(f"| `{name}` | {cell(kind)} | {families} |")
    lines += [
        "",
        "### Refused up front",
        "",
        REFUSED_UP_FRONT_INTRO,
        "",
        "| what | refused | source |",
        "|---|---|---|",
    ]
    for what, refused, source in REFUSED_UP_FRONT:
        lines.append(f"| {what} | {cell(refused)} | {cell(source)} |")
    lines += ["", "Accepted, and why:", ""]
    lines += [f"- {cell(reason)}" for reason in ACCEPTED_WITH_REASON]
    lines += ["", "## status", "", "Written by the operator only.", "", "| field | type | description |"]
    lines.append("|---|---|---|")

    def walk(node: Schema, path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            kind = sub.get("type", "")
            if kind == "array" and "properties" in sub.get("items", {}):
                kind = "array of objects"
            elif "format" in sub:
                kind = f"{kind} ({sub['format']})"
            lines.append(f"| `{path}.{key}` | {kind} | {cell(sub.get('description', ''))} |")
            walk(sub, f"{path}.{key}")
            walk(sub.get("items", {}), f"{path}.{key}[]")

    walk(STATUS_SCHEMA, "status")
    return "\n".join(lines) + "\n"
