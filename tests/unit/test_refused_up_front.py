"""What the kubelet, S3, etcd or the job itself would refuse later is refused when the job is validated,
as a class, with the field named: image digests, storage URIs as both sides read them, bucket names, ..."""

from __future__ import annotations

import string
from typing import Any

import pytest
from fsdp_operator.api import formats, schema
from fsdp_operator.api.spec import SpecError, parse_job
from fsdp_train import storage
from fsdp_train.config import ConfigError, TrainConfig
from hypothesis import given, settings
from hypothesis import strategies as st


def manifest(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {"name": "job"},
        "spec": {} if spec is None else spec,
    }


def problems(spec: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_job(manifest(spec))
    return info.value.problems


# --- image references: the distribution reference grammar, then go-digest's algorithms and lengths -------------

HEX = "0123456789abcdef"
_component = st.from_regex(r"[a-z0-9]+([._]|__|-+)?[a-z0-9]+", fullmatch=True)
_domain = st.one_of(st.just(""), st.sampled_from(["registry.example.com/", "localhost:5000/", "[::1]:5000/", "Host/"]))
_tag = st.one_of(st.just(""), st.from_regex(r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True))


@st.composite
def _references(draw: st.DrawFn, algorithm: str | None = None) -> str:
    name = draw(_domain) + "/".join(draw(st.lists(_component, min_size=1, max_size=3)))
    digest = ""
    if algorithm is not None:
        n = formats.DIGEST_HEX_LENGTHS[algorithm]
        digest = f"@{algorithm}:" + "".join(draw(st.lists(st.sampled_from(HEX), min_size=n, max_size=n)))
    return name + draw(_tag) + digest


@given(st.one_of(_references(), *(_references(a) for a in formats.DIGEST_HEX_LENGTHS)))
def test_well_formed_references_are_accepted(reference: str) -> None:
    assert formats.IMAGE_REFERENCE.check(reference) is None, reference


@given(_references("sha256"), st.integers(min_value=0, max_value=63))
def test_an_upper_case_digit_of_a_digest_is_refused(reference: str, at: int) -> None:
    name, digest = reference.rsplit(":", 1)
    digest = digest[:at] + "A" + digest[at + 1 :]
    reason = formats.IMAGE_REFERENCE.check(f"{name}:{digest}")
    assert reason == "has a sha256 digest with upper-case hex digits; a digest is lowercase hex"


@given(st.sampled_from(sorted(formats.DIGEST_HEX_LENGTHS)), st.integers(min_value=32, max_value=200))
def test_a_digest_of_the_wrong_length_for_its_algorithm_is_refused(algorithm: str, length: int) -> None:
    reason = formats.IMAGE_REFERENCE.check(f"ray@{algorithm}:{'a' * length}")
    if length == formats.DIGEST_HEX_LENGTHS[algorithm]:
        assert reason is None
    else:
        assert reason == f"has a {algorithm} digest of {length} hex digits; {algorithm} has " + str(
            formats.DIGEST_HEX_LENGTHS[algorithm]
        )


@pytest.mark.parametrize(
    ("image", "reason"),
    [
        ("ray@sha256:" + "A" * 64, "upper-case hex digits"),
        ("ray@sha256:" + "a" * 33, "sha256 digest of 33 hex digits; sha256 has 64"),
        ("ray@sha512:" + "a" * 64, "sha512 digest of 64 hex digits; sha512 has 128"),
        ("ray@md5:" + "a" * 32, "the algorithm 'md5'"),
        ("ray@sha256+b64:" + "a" * 64, "the algorithm 'sha256+b64'"),
        ("a" * 64, "reads as an image id"),
        ("ray:" + "t" * 129, "is not an OCI image reference"),
        ("r/" * 128 + "x", "longer than 255"),
    ],
)
def test_references_the_kubelet_refuses_are_refused_naming_spec_image(image: str, reason: str) -> None:
    (found,) = problems({"image": image})
    assert found.startswith("spec.image: ") and reason in found, found


# --- storage URIs: one table, read alike by the operator and by the training function -------------------------

URIS = [
    ("s3://bucket/x", True),
    ("gs://bucket/x", True),
    ("file:///ckpt", True),
    ("file:////ckpt", True),
    ("/ckpt", True),
    ("S3://bucket/x", False),
    ("s3:/bucket/x", False),
    ("s3:bucket/x", False),
    ("Gs://bucket/x", False),
    ("file:/ckpt", False),
    ("file:ckpt", False),
    ("file://ckpt", False),
    ("FILE:///ckpt", False),
    ("ckpt/run", False),
    ("http://host/x", False),
    ("hdfs://host/x", False),
    ("hf://datasets/o/n", False),
]


def training_accepts(uri: str) -> bool:
    try:
        TrainConfig.from_dict({"checkpoint_path": uri, "output_path": uri})
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize(("uri", "accepted"), URIS)
def test_the_operator_and_the_training_function_read_a_storage_uri_alike(uri: str, accepted: bool) -> None:
    assert (formats.STORAGE_URI.check(uri) is None) is accepted
    assert training_accepts(uri) is accepted
    if accepted and uri.startswith(("file:", "/")):
        _, path = storage.filesystem(uri)
        assert path.startswith("/")


@given(
    st.sampled_from(["s3", "gs", "file"]).flatmap(
        lambda s: st.tuples(*(st.sampled_from([c, c.upper()]) for c in s)).map("".join)
    ),
    st.sampled_from([":", ":/", "://", ":///", ":////"]),
)
def test_every_spelling_of_a_scheme_is_judged_alike_on_both_sides(scheme: str, separator: str) -> None:
    uri = f"{scheme}{separator}bucket/x"
    assert (formats.STORAGE_URI.check(uri) is None) is training_accepts(uri), uri


@pytest.mark.parametrize("field", ["training.checkpoint.storage", "output.storage", "data.source"])
def test_an_upper_case_scheme_is_refused_naming_the_field(field: str) -> None:
    group, *rest = field.split(".")
    spec: dict[str, Any] = {}
    node = spec.setdefault(group, {})
    for key in rest[:-1]:
        node = node.setdefault(key, {})
    node[rest[-1]] = "S3://bucket/x"
    found = problems(spec)
    assert f"spec.{field}: 'S3://bucket/x' has the scheme 'S3', not in lower case; write s3://" in found


# --- S3 and Cloud Storage bucket names ---------------------------------------------------------------------------

_BUCKET_CHARS = string.ascii_lowercase + string.digits
_valid_s3 = st.builds(
    lambda first, middle, last: first + middle + last,
    st.sampled_from(_BUCKET_CHARS),
    st.text(alphabet=_BUCKET_CHARS + ".-", min_size=1, max_size=61),
    st.sampled_from(_BUCKET_CHARS),
).filter(
    lambda b: (
        ".." not in b
        and not b.startswith(("xn--", "sthree-", "amzn-s3-demo-"))
        and not b.endswith(("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"))
        and not formats._IPV4.fullmatch(b)
    )
)


@given(_valid_s3)
def test_bucket_names_s3_accepts_are_accepted(bucket: str) -> None:
    assert formats.STORAGE_URI.check(f"s3://{bucket}/prefix") is None


@settings(max_examples=60)
@given(
    _valid_s3,
    st.sampled_from(
        [
            (lambda b: b[:1] + ".." + b[1:], "two adjacent periods"),
            (lambda b: b[:1] + "A" + b[1:], "lowercase letters, digits"),
            (lambda b: "-" + b, "starting and ending with a letter or digit"),
            (lambda b: b + ".", "starting and ending with a letter or digit"),
            (lambda b: b[:1] + "_" + b[1:], "lowercase letters, digits"),
            (lambda b: "xn--" + b, "starting with xn--"),
            (lambda b: "sthree-" + b, "starting with sthree-"),
            (lambda b: b + "-s3alias", "ending in -s3alias"),
            (lambda b: b + "--ol-s3", "ending in --ol-s3"),
            (lambda b: b + "--x-s3", "ending in --x-s3"),
            (lambda b: (b * 64)[:64], "3-63 characters"),
            (lambda b: b[:2] if len(b) > 2 else b[:1] + "x" if False else b[:2], "3-63 characters"),
        ]
    ),
)
def test_bucket_names_s3_refuses_are_refused_with_the_rule(bucket: str, mutation: Any) -> None:
    mutate, rule = mutation
    name = mutate(bucket)
    if rule == "3-63 characters" and 3 <= len(name) <= 63:
        return  # the bucket was already short or long enough to stay inside the bounds
    reason = formats.STORAGE_URI.check(f"s3://{name}/prefix")
    assert reason is not None and rule in reason, (name, reason)


@pytest.mark.parametrize(
    ("uri", "rule"),
    [
        ("s3://my..bucket/x", "two adjacent periods"),
        ("s3://192.168.1.1/x", "formatted as an IP address"),
        ("s3://10.0.0.255/x", "formatted as an IP address"),
        ("s3://ab/x", "3-63 characters"),
        ("s3://" + "a" * 64 + "/x", "3-63 characters"),
        ("s3://amzn-s3-demo-bucket/x", "starting with amzn-s3-demo-"),
        ("s3://data.mrap/x", "ending in .mrap"),
        ("s3://tables--table-s3/x", "ending in --table-s3"),
        ("gs://192.168.1.1/x", "formatted as an IP address"),
        ("gs://goog-data/x", "goog"),
        ("gs://my-google-data/x", "google"),
        ("gs://a..b/x", "an empty part"),
        ("gs://" + "a" * 64 + "/x", "3-63 characters"),
    ],
)
def test_bucket_names_the_stores_refuse_are_refused(uri: str, rule: str) -> None:
    (found,) = problems({"training": {"checkpoint": {"storage": uri}}})
    assert found.startswith("spec.training.checkpoint.storage: ") and rule in found, found


@pytest.mark.parametrize("uri", ["s3://my.bucket-1/x", "s3://123/x", "s3://a-b.c-d/x", "gs://my_bucket/x",
                                 "gs://" + ".".join(["a" * 60] * 3) + "/x"])  # fmt: skip
def test_bucket_names_the_stores_accept_pass(uri: str) -> None:
    assert formats.STORAGE_URI.check(uri) is None
