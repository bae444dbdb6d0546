"""The grammars Kubernetes, OCI registries and pip apply to strings, as checks that say what is wrong.

Each check takes a string and returns None when it is well-formed, or a short reason that never
repeats the value (the caller decides how much of it may be shown). The rules are written out
from their specifications (Kubernetes' `apimachinery/pkg/util/validation`, `resource.ParseQuantity`,
the OCI distribution reference grammar) because no maintained Python package implements them as
the API server does: the Kubernetes client's own `kubernetes.utils.parse_quantity` accepts " 1",
"1e3Gi", "1K" and non-ASCII digits, all of which the API server refuses. Pip requirements use
`packaging`, the library pip itself uses.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from urllib.parse import unquote, urlsplit

from fsdp_train.contract.config import STORAGE_SCHEMES as TRAINING_STORAGE_SCHEMES
from packaging.requirements import InvalidRequirement, Requirement

from fsdp_operator.api.buckets import BUCKET_RULES


@dataclass(frozen=True, slots=True)
class Grammar:
    """A named string grammar: the check, the longest value allowed, and (where RE2 can say it) a CRD pattern."""

    name: str
    check: Callable[[str], str | None]
    max_length: int
    pattern: str | None = None
    format_characters: bool = False
    """Values may hold Unicode format characters (they reach no container, URI, path, name or message)."""


# --- characters no string of a manifest may carry --------------------------------------------------------


# NUL ends a C string early (an environment value, an argv entry, a path); control characters other than
# tab and line breaks, lone surrogates (no UTF-8 form), and format characters (Unicode category Cf: soft
# hyphen, bidirectional overrides such as U+202E, zero-width characters, tag characters U+E0000-E007F)
# make what is shown differ from what is used: a bucket name, an env value or a status message that reads
# one way and means another.
_HIDDEN_CATEGORIES = {"Cc": "control character", "Cs": "lone surrogate", "Cf": "invisible format character"}
_ALLOWED_CONTROLS = "\t\n\r"


def _hidden(text: str) -> int:
    """The position of the first hidden character of `text`, or -1."""
    if text.isprintable():  # C speed; false for every Cc, Cf and Cs character (and a few harmless others)
        return -1
    for at, char in enumerate(text):
        if (
            not char.isprintable()
            and char not in _ALLOWED_CONTROLS
            and unicodedata.category(char) in _HIDDEN_CATEGORIES
        ):
            return at
    return -1


def hidden_character(value: str, *, format_characters: bool = False) -> str | None:
    """Why `value` may not reach a container, a URI, a path, a name or a message; None when it may.

    `format_characters`: allow category Cf (for text that reaches none of those, such as annotations:
    an emoji sequence joined by U+200D is ordinary there).
    """
    at = _hidden(value)
    while at >= 0 and format_characters and unicodedata.category(value[at]) == "Cf":
        rest = _hidden(value[at + 1 :])
        at = -1 if rest < 0 else at + 1 + rest
    if at < 0:
        return None
    char = value[at]
    what = (
        "a NUL character" if char == "\0" else f"the {_HIDDEN_CATEGORIES[unicodedata.category(char)]} U+{ord(char):04X}"
    )
    return f"contains {what} at position {at}"


def visible(text: str) -> str:
    """`text` with every control, surrogate and format character written as an escape (``\\u202e``).

    For what the operator writes into messages: a user's output, an exception text, a rank's report.
    """
    if _hidden(text) < 0:
        return text
    return "".join(
        (f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
        if not c.isprintable() and c not in _ALLOWED_CONTROLS and unicodedata.category(c) in _HIDDEN_CATEGORIES
        else c
        for c in text
    )


# --- Kubernetes names (k8s.io/apimachinery/pkg/util/validation) -------------------------------------

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_ENV_NAME = r"[-._a-zA-Z][-._a-zA-Z0-9]*"


def _dns1123_label(value: str) -> str | None:
    if len(value) > 63 or not re.fullmatch(_DNS1123_LABEL, value):
        return (
            "must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return None


def _dns1123_subdomain(value: str) -> str | None:
    if len(value) > 253 or not re.fullmatch(_DNS1123_SUBDOMAIN, value):
        return "must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253 characters"
    return None


def _qualified_name(value: str) -> str | None:
    """A label or annotation key: an optional DNS-1123 subdomain prefix and '/', then a name of <= 63."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or _dns1123_subdomain(prefix)):
        return "has a prefix that is not a DNS-1123 subdomain (the part before '/')"
    if not name or len(name) > 63 or not re.fullmatch(_QUALIFIED_NAME, name):
        return (
            "must be a qualified name: at most 63 letters, digits, '-', '_' or '.', starting and ending "
            "with a letter or digit, with an optional DNS subdomain prefix and '/'"
        )
    return None


def _label_value(value: str) -> str | None:
    if len(value) > 63 or (value and not re.fullmatch(_QUALIFIED_NAME, value)):
        return (
            "must be a label value: empty, or at most 63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit"
        )
    return None


def _env_name(value: str) -> str | None:
    if not re.fullmatch(_ENV_NAME, value):
        return "must be an environment variable name: letters, digits, '_', '-' or '.', not starting with a digit"
    return None


def _free_text(value: str) -> str | None:
    return None


def or_empty(grammar: Grammar) -> Grammar:
    """`grammar`, or the empty string."""

    def check(value: str) -> str | None:
        return None if value == "" else grammar.check(value)

    return Grammar(f"{grammar.name} or empty", check, grammar.max_length)


DNS1123_LABEL = Grammar("DNS-1123 label", _dns1123_label, 63, f"^{_DNS1123_LABEL}$")
DNS1123_SUBDOMAIN = Grammar("DNS-1123 subdomain", _dns1123_subdomain, 253)
QUALIFIED_NAME = Grammar("qualified name (label or annotation key)", _qualified_name, 317)
LABEL_VALUE = Grammar("label value", _label_value, 63)
ENV_NAME = Grammar("environment variable name", _env_name, 256, f"^{_ENV_NAME}$")
# Annotation and environment values: anything; their size is bounded where they are declared.
TEXT = Grammar("text", _free_text, 32768)
ANNOTATION_TEXT = Grammar("text", _free_text, 32768, format_characters=True)


# --- quantities (k8s.io/apimachinery/pkg/api/resource.ParseQuantity) ----------------------------------

# <signedNumber><suffix>; the suffix is a binary SI suffix, a decimal SI suffix, or a decimal exponent
# with an integer power. No white space anywhere, and no exponent together with a suffix ("1e3Gi").
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?")
# The pattern controller-gen writes for resource.Quantity in CRDs (KubeRay's included).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_SCALE = {
    "n": Decimal(10) ** -9,
    "u": Decimal(10) ** -6,
    "m": Decimal(10) ** -3,
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
# Kubernetes keeps quantities as int64 milli-units in many places; beyond that no consumer can hold them.
QUANTITY_MAX = Decimal(2**63 - 1) / 1000
_NOT_A_QUANTITY = "is not a Kubernetes quantity (examples: 2, 500m, 8Gi, 1e3)"


def parse_quantity(value: int | str) -> Decimal:
    """A Kubernetes quantity (``40``, ``500m``, ``160Gi``) as a number; ValueError when it does not parse."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(_NOT_A_QUANTITY)
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY.fullmatch(value) if len(value) <= 64 else None
    if match is None:
        raise ValueError(_NOT_A_QUANTITY)
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix not in _SCALE:  # a decimal exponent (`1e3`); `E` and `Ei` are suffixes
        power = int(suffix[1:])
        if abs(power) > 40:  # far outside what any resource can be; keeps the arithmetic exact and small
            raise ValueError("is out of range")
        return number.scaleb(power)
    return number * _SCALE[suffix]


def _positive_quantity(value: str) -> str | None:
    try:
        amount = parse_quantity(value)
    except ValueError as e:
        return str(e)
    if amount <= 0:
        return "must be positive"
    if amount > QUANTITY_MAX:
        return "is out of range"
    return None


POSITIVE_QUANTITY = Grammar("positive quantity", _positive_quantity, 64, QUANTITY_PATTERN)


def _cpu_quantity(value: str) -> str | None:
    reason = _positive_quantity(value)
    if reason is None and parse_quantity(value) * 1000 % 1 != 0:
        # Kubernetes counts CPU in millicores: 1n would become 1m, 1.5m 2m; say so instead of rounding.
        return "is finer than 1m (CPU is counted in whole millicores)"
    return reason


def _byte_quantity(value: str) -> str | None:
    reason = _positive_quantity(value)
    if reason is None and parse_quantity(value) % 1 != 0:
        # `160m` is 0.16 bytes, not 160 MB (M or Mi): no node can give a fraction of a byte.
        return "is not a whole number of bytes (m means milli; for megabytes write M or Mi)"
    return reason


CPU_QUANTITY = Grammar("CPU quantity", _cpu_quantity, 64, QUANTITY_PATTERN)
BYTE_QUANTITY = Grammar("byte quantity", _byte_quantity, 64, QUANTITY_PATTERN)


# --- OCI image references (github.com/distribution/reference, grammar in its reference.go) -----------

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6 = r"\[(?:[a-fA-F0-9:]+)\]"
_DOMAIN = rf"(?:{_DOMAIN_NAME}|{_IPV6})(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_REFERENCE = re.compile(rf"({_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?", re.ASCII)


# What `digest.Parse` accepts after the grammar (github.com/opencontainers/go-digest, algorithm.go): the
# algorithms it registers, each with its encoded length in lowercase hex only. The OCI image spec
# (descriptor.md, "Digests") registers sha256 and sha512; go-digest, which containerd and the kubelet use,
# also knows sha384. An upper-case or shorter digest passes the reference grammar and is refused at the pull.
DIGEST_HEX_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
# ParseNormalizedNamed (normalize.go), which the kubelet uses, refuses a name of 64 hex digits: it reads as an
# image id, not a repository.
_IMAGE_ID = re.compile(r"[a-f0-9]{64}")
# NameTotalLengthMax in reference.go: the name (domain and path) is at most 255 characters.
NAME_TOTAL_LENGTH_MAX = 255


def _image_reference(value: str) -> str | None:
    match = _REFERENCE.fullmatch(value)
    if match is None:
        return "is not an OCI image reference (registry/repository[:tag][@digest], repository in lowercase)"
    if len(match.group(1)) > NAME_TOTAL_LENGTH_MAX:
        return f"has a repository name longer than {NAME_TOTAL_LENGTH_MAX} characters"
    if _IMAGE_ID.fullmatch(value):
        return "is 64 hexadecimal digits, which the kubelet reads as an image id, not a repository"
    if match.group(3) is not None:
        return _digest(match.group(3))
    return None


def _digest(digest: str) -> str | None:
    algorithm, encoded = digest.split(":", 1)
    length = DIGEST_HEX_LENGTHS.get(algorithm)
    if length is None:
        known = ", ".join(DIGEST_HEX_LENGTHS)
        return (
            f"has a digest of the algorithm {algorithm[:20]!r}, which go-digest (containerd, the kubelet) does not "
            f"know ({known})"
        )
    if not re.fullmatch(r"[0-9a-f]+", encoded):
        return f"has a {algorithm} digest with upper-case hex digits; a digest is lowercase hex"
    if len(encoded) != length:
        return f"has a {algorithm} digest of {len(encoded)} hex digits; {algorithm} has {length}"
    return None


IMAGE_REFERENCE = Grammar("OCI image reference", _image_reference, 512)


# --- storage URIs ------------------------------------------------------------------------------------

# The schemes exactly as the training function reads them (fsdp_train.contract.config.STORAGE_SCHEMES: one table for
# both sides, so a URI accepted here is never read differently there).
STORAGE_SCHEMES = ("s3", "gs", "file")


# Control characters and white space, Unicode's included (NEL, no-break and zero-width spaces, line separators).
_CONTROL = re.compile(r"[\x00-\x20\x7f-\xa0\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u3000\ufeff]")


def _dot_dot(path: str) -> bool:
    """Whether a path has a `..` segment, percent-encoded (`%2e%2e`) or separated by backslashes included."""
    return any(unquote(segment) == ".." for segment in path.replace("\\", "/").split("/"))


def _storage_uri(value: str) -> str | None:
    """s3://bucket/prefix, gs://bucket/prefix, file:///abs/path or /abs/path; empty means none."""
    if not value:
        return None
    if _CONTROL.search(value):
        return "must not contain white space or control characters"
    if value.startswith("/"):
        path = value
    else:
        try:
            parts = urlsplit(value)
        except ValueError:
            return "is not a well-formed URI"
        if parts.scheme not in STORAGE_SCHEMES:
            return "has an unsupported scheme (use s3://, gs://, file:// or an absolute path)"
        written = value.split(":", 1)[0]
        if written != parts.scheme:
            # urlsplit lower-cases the scheme; the training function (and pyarrow, and Ray) read it as written.
            return f"has the scheme {written[:8]!r}, not in lower case; write {parts.scheme}://"
        if not value.startswith(f"{parts.scheme}://"):
            return f"must start with {parts.scheme}:// ({parts.scheme}:// and the location, e.g. file:///path)"
        if "@" in parts.netloc:
            return "must not carry credentials in the URI (user info); use the pod's credentials instead"
        if parts.query or parts.fragment or "?" in value or "#" in value:
            return "must not have a query or fragment"
        if parts.scheme == "file":
            if parts.netloc:
                return "file:// must be followed by an absolute path (file:///path)"
            path = parts.path
            if not path.startswith("/"):
                return "file:// must be followed by an absolute path (file:///path)"
        else:
            if not parts.netloc:
                return f"has no bucket ({parts.scheme}://BUCKET/prefix)"
            if (bucket := BUCKET_RULES[parts.scheme](parts.netloc)) is not None:
                return bucket
            path = parts.path
    if _dot_dot(path):
        return "must not contain '..' segments"
    if not value.startswith(TRAINING_STORAGE_SCHEMES):  # the checks above imply it; this holds both sides to one table
        return f"must start with {', '.join(TRAINING_STORAGE_SCHEMES)}"
    return None


STORAGE_URI = Grammar("storage URI", _storage_uri, 1024)


def local_path(uri: str) -> str | None:
    """The local path a storage URI names (``/x``, ``file:///x``), or None for an object store."""
    if uri.startswith("/"):
        return uri
    if uri.startswith("file://"):
        return uri.removeprefix("file://")
    return None


def _storage_destination(value: str) -> str | None:
    reason = _storage_uri(value)
    if reason is None and (path := local_path(value)) is not None:
        return _writable_path(path)
    return reason


STORAGE_DESTINATION = Grammar("storage URI to write to", _storage_destination, 1024)

_HF_DATASET = re.compile(r"hf://datasets/[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(/[^\s]*)?")


def _data_source(value: str) -> str | None:
    """random, a storage URI, or hf://datasets/OWNER/NAME[/path]."""
    if value == "random":
        return None
    if value.startswith("hf://"):
        if not _HF_DATASET.fullmatch(value) or _dot_dot(value):
            return "must be hf://datasets/OWNER/NAME (optionally followed by a path inside the data set)"
        return None
    if not value:
        return "must not be empty (random, s3://, gs://, file://, an absolute path or hf://datasets/OWNER/NAME)"
    problem = _storage_uri(value)
    return problem and problem.replace("(use s3://", "(use random, hf://datasets/, s3://")


DATA_SOURCE = Grammar("data source", _data_source, 1024)


# --- pip requirements ---------------------------------------------------------------------------------


PIP_URL_SCHEMES = ("https", "git+https")


def _pip_requirement(value: str) -> str | None:
    if re.search(r"[\x00-\x1f\x7f]", value):
        return "must be one requirement specifier on one line"
    if value.lstrip().startswith("-"):
        return "must be a requirement specifier, not a pip option"
    # Ray writes the entries into a requirements file, one a line, and pip reads that file line by line
    # (pip's req_file.py): a line ending in a backslash is joined with the next entry, and ` #` starts a
    # comment that cuts the rest of the entry off. No requirement specifier needs either.
    if "\\" in value:
        if value.rstrip().endswith("\\"):
            return "ends in a backslash, with which pip joins this entry to the next one; one requirement per entry"
        return "contains a backslash, which no requirement specifier has (pip reads it as a line continuation)"
    if re.search(r"(^|\s)#", value):
        return "contains ' #', which pip reads as the start of a comment; one requirement per entry, no comments"
    try:
        requirement = Requirement(value)
    except InvalidRequirement:
        return "is not a requirement specifier (PEP 508, e.g. 'pandas>=2.2')"
    if requirement.url is not None:
        try:
            parts = urlsplit(requirement.url)
        except ValueError:
            return "has a URL that is not well-formed"
        if "@" in parts.netloc:
            return "must not carry credentials in its URL"
        if parts.scheme not in PIP_URL_SCHEMES or not parts.netloc:
            # file:// installs whatever lies on the node; http:// and the rest can be tampered with on the way.
            return f"must have an {' or '.join(s + '://' for s in PIP_URL_SCHEMES)} URL (a direct reference)"
    if "${" in value:
        # pip expands ${VAR} in a requirements file (Ray writes one): the pod's environment would leak into a URL.
        return "must not refer to environment variables (${...})"
    return None


PIP_REQUIREMENT = Grammar("pip requirement specifier (PEP 508)", _pip_requirement, 512)


# --- smaller grammars used by one field each ------------------------------------------------------------


def _model_name(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if _CONTROL.search(value):
        return "must not contain white space or control characters"
    if "://" in value and not value.startswith("hf://"):  # hf:// gets the training function's own message
        return _storage_uri(value)
    if _dot_dot(value):
        return "must not contain '..' segments"
    return None


# The directories of the system itself (Filesystem Hierarchy Standard 3.0; proc(5), sysfs(5): /proc, /sys and
# /dev are the kernel's virtual filesystems, where nothing can be cached or stored, and writing to some of them
# changes the node), and of the image's software: a job that writes its caches, checkpoints or model there
# fails (read-only or virtual) or overwrites what the container runs.
SYSTEM_DIRECTORIES = ("/proc", "/sys", "/dev", "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
                      "/libx32", "/usr", "/run", "/var/run", "/var/lib/kubelet")  # fmt: skip


def system_directory(path: str) -> str | None:
    """The system directory `path` is (or is under), or None; `//proc/./x` is /proc/x."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    normal = "/" + "/".join(parts)
    if normal == "/":
        return "/"
    return next((d for d in SYSTEM_DIRECTORIES if normal == d or normal.startswith(d + "/")), None)


def _writable_path(value: str) -> str | None:
    reason = _absolute_path(value)
    if reason is None and (system := system_directory(value)) is not None:
        where = "is the root directory" if system == "/" else f"is in {system}"
        return f"{where}, a directory of the system or the image: choose a directory of the job's own"
    return reason


def _absolute_path(value: str) -> str | None:
    if not value.startswith("/"):
        return "must be an absolute path"
    if _CONTROL.search(value):
        return "must not contain white space or control characters"
    if _dot_dot(value):
        return "must not contain '..' segments"
    return None


def _ray_version(value: str) -> str | None:
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+(?:[-+.]?[0-9A-Za-z][0-9A-Za-z.+-]*)?", value):
        return "must be a Ray version such as 2.58.0"
    return None


def _interface_names(value: str) -> str | None:
    # NCCL_SOCKET_IFNAME: a comma-separated list of interface names or prefixes, optionally starting
    # with ^ (exclude) or = (exact match).
    if not re.fullmatch(r"[\^=]?[A-Za-z0-9_.:@-]+(?:,[A-Za-z0-9_.:@-]+)*", value):
        return "must be network interface names or prefixes, comma-separated (e.g. eth0, ^lo,docker)"
    return None


def _config_key(value: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", value):
        return "must be a config key: a letter or '_', then letters, digits or '_', at most 64"
    return None


def _module_name(value: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", value):
        return "must be a layer's name in the model (q_proj, down_proj): a letter or '_', then letters, digits or '_'"
    return None


def _secret_key(value: str) -> str | None:
    if len(value) > 253 or not re.fullmatch(r"[-._a-zA-Z0-9]+", value):
        return "must be a key of a Secret or ConfigMap: letters, digits, '-', '_' or '.'"
    return None


def _field_path(value: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z0-9_.'\[\]/-]+", value):
        return "must be a field path such as metadata.name or status.podIP"
    return None


# --- EC2 placement --------------------------------------------------------------------------------------

# A zone name as EC2 and the topology.kubernetes.io/zone label spell it: us-east-1b, us-gov-west-1a,
# and Local Zones such as us-west-2-lax-1a.
_ZONE = r"[a-z]{2}(-[a-z]+)+-[0-9]+(-[a-z]+-[0-9]+)?[a-z]"


def _zone_or_auto(value: str) -> str | None:
    if value != "auto" and not re.fullmatch(_ZONE, value):
        return "must be auto or an Availability Zone name such as us-east-1b"
    return None


def _capacity_reservation_id(value: str) -> str | None:
    if not re.fullmatch(r"cr-[0-9a-f]{8}([0-9a-f]{9})?", value):
        return "must be an EC2 Capacity Reservation id: cr- and 17 hexadecimal digits"
    return None


# An EC2 instance type as EC2 spells it and as the node.kubernetes.io/instance-type label carries it: family and
# generation, then a dot and the size, all in lower case (EC2 User Guide, "Amazon EC2 instance type naming
# conventions": g6.12xlarge, p5en.48xlarge, u-6tb1.112xlarge, m7i.metal-24xl). `G6.12XLARGE` is no node's label.
_INSTANCE_TYPE = r"[a-z][a-z0-9-]*[a-z0-9]\.[a-z0-9]+(-[a-z0-9]+)*"


def _instance_type(value: str) -> str | None:
    if re.fullmatch(_INSTANCE_TYPE, value):
        return None
    if re.fullmatch(_INSTANCE_TYPE, value.lower()):
        return f"is not spelled as EC2 spells instance types (lower case): use {value.lower()!r}"
    return "is not an EC2 instance type (family.size in lower case, e.g. g6.12xlarge)"


ZONE_OR_AUTO = Grammar("Availability Zone or auto", _zone_or_auto, 64, f"^(auto|{_ZONE})$")
CAPACITY_RESERVATION_ID = Grammar(
    "Capacity Reservation id", _capacity_reservation_id, 20, r"^cr-[0-9a-f]{8}([0-9a-f]{9})?$"
)

INSTANCE_TYPE = Grammar("EC2 instance type", _instance_type, 63, f"^{_INSTANCE_TYPE}$")
MODEL_NAME = Grammar("Hugging Face model id or path", _model_name, 256)
ABSOLUTE_PATH = Grammar("absolute path", _absolute_path, 1024)
WRITABLE_PATH = Grammar("absolute path outside the system directories", _writable_path, 1024)
RAY_VERSION = Grammar("Ray version", _ray_version, 64)
INTERFACE_NAMES = Grammar("interface names", _interface_names, 256)
CONFIG_KEY = Grammar("config key", _config_key, 64)
MODULE_NAME = Grammar("layer name", _module_name, 64)
SECRET_KEY = Grammar("Secret or ConfigMap key", _secret_key, 253)
FIELD_PATH = Grammar("field path", _field_path, 256)
