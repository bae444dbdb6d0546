"""What the kubelet, S3, etcd or the job itself would refuse later is refused when the job is validated,
as a class, with the field named: image digests, storage URIs as both sides read them, bucket names, ..."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from fsdp_operator.api import buckets, formats, manifest_yaml, schema
from fsdp_operator.api.spec import SpecError, parse_job
from fsdp_train.contract.config import ConfigError, TrainConfig
from fsdp_train.state import storage
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
_alnum = st.text(alphabet=string.ascii_lowercase + string.digits, min_size=1, max_size=6)
_component = st.builds(lambda a, sep, b: a + sep + b, _alnum, st.sampled_from(["", ".", "_", "__", "-", "---"]), _alnum)
_domain = st.one_of(st.just(""), st.sampled_from(["registry.example.com/", "localhost:5000/", "[::1]:5000/", "Host/"]))
_tag = st.one_of(
    st.just(""),
    st.builds(
        lambda a, b: f":{a}{b}",
        st.sampled_from(string.ascii_letters + string.digits + "_"),
        st.text(alphabet=string.ascii_letters + string.digits + "_.-", max_size=20),
    ),
)


@st.composite
def _references(draw: st.DrawFn, algorithm: str | None = None) -> str:
    name = draw(_domain) + "/".join(draw(st.lists(_component, min_size=1, max_size=3)))
    digest = ""
    if algorithm is not None:
        n = formats.DIGEST_HEX_LENGTHS[algorithm]
        digest = f"@{algorithm}:" + draw(st.text(alphabet=HEX, min_size=n, max_size=n))
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
        and not buckets.IPV4.fullmatch(b)
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


# --- a local checkpoint or output path with more than one worker -------------------------------------------------


@pytest.mark.parametrize("field", ["training.checkpoint.storage", "output.storage"])
@pytest.mark.parametrize("location", ["/tmp/ckpt", "file:///tmp/ckpt", "/shared-not/ckpt"])
@pytest.mark.parametrize("replicas", [2, 3, 512])
def test_a_local_path_with_several_workers_and_no_shared_volume_is_refused(
    field: str, location: str, replicas: int
) -> None:
    spec: dict[str, Any] = {"workers": {"replicas": replicas}}
    group, *rest = field.split(".")
    node = spec.setdefault(group, {})
    for key in rest[:-1]:
        node = node.setdefault(key, {})
    node[rest[-1]] = location
    (found,) = problems(spec)
    assert found.startswith(f"spec.{field}: {location!r} is a path on each worker's own disk, and with {replicas} ")
    assert "use s3:// or gs://, or declare a shared volume (spec.sharedVolume)" in found
    spec["sharedVolume"] = {"claimName": "efs", "mountPath": "/shared"}
    (found,) = problems(spec)
    assert found.endswith("put it under spec.sharedVolume.mountPath (/shared)")
    node[rest[-1]] = location.replace("/tmp", "/shared").replace("/shared-not", "/shared")
    parse_job(manifest(spec))


@pytest.mark.parametrize("location", ["/tmp/ckpt", "s3://bucket/ckpt", "gs://bucket/ckpt"])
def test_one_worker_or_an_object_store_needs_no_shared_volume(location: str) -> None:
    parse_job(manifest({"workers": {"replicas": 1}, "training": {"checkpoint": {"storage": location}}}))
    if "://" in location:
        parse_job(manifest({"workers": {"replicas": 8}, "output": {"storage": location}}))


def test_the_shared_volume_is_mounted_in_the_head_and_every_worker() -> None:
    from fsdp_operator.api import render

    volume = {"claimName": "fsx-claim", "mountPath": "/fsx"}
    job = parse_job(manifest({"sharedVolume": volume, "training": {"checkpoint": {"storage": "/fsx/run1"}}}))
    cluster = render.raycluster(job)
    for group in (cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]):
        pod = group["template"]["spec"]
        assert {"name": "shared", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in pod["volumes"]
        assert {"name": "shared", "mountPath": "/fsx"} in pod["containers"][0]["volumeMounts"]
    without = render.raycluster(parse_job(manifest({})))
    assert "shared" not in json.dumps(without["spec"]["headGroupSpec"]["template"]["spec"]["volumes"])


@pytest.mark.parametrize(
    ("volume", "expected"),
    [
        ({"claimName": "efs"}, "spec.sharedVolume.mountPath: required"),
        ({"mountPath": "/shared"}, "spec.sharedVolume.claimName: required"),
        ({"claimName": "EFS", "mountPath": "/shared"}, "spec.sharedVolume.claimName: 'EFS' must be a DNS-1123"),
        ({"claimName": "efs", "mountPath": "shared"}, "spec.sharedVolume.mountPath: 'shared' must be an absolute"),
        ({"claimName": "efs", "mountPath": "/tmp/ray"}, "spec.sharedVolume.mountPath: '/tmp/ray' is in /tmp/ray"),
        ({"claimName": "efs", "mountPath": "/dev/shm/x"}, "spec.sharedVolume.mountPath: '/dev/shm/x' is in /dev"),
        ({"claimName": "efs", "mountPath": "/"}, "spec.sharedVolume.mountPath: '/' is the root directory"),
    ],
)
def test_a_shared_volume_is_well_formed(volume: dict[str, str], expected: str) -> None:
    (found,) = problems({"sharedVolume": volume})
    assert found.startswith(expected), found


# --- the RayCluster against etcd's limit ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "largest"),
    [
        ({"env": [{"name": f"V{i}", "value": "x" * 10240} for i in range(128)]}, "spec.env"),
        ({"network": {"env": [{"name": f"NCCL_V{i}", "value": "x" * 16000} for i in range(100)]}}, "spec.network.env"),
        (
            {
                "env": [{"name": f"V{i}", "value": "x" * 3000} for i in range(100)],
                "network": {"env": [{"name": f"NCCL_V{i}", "value": "x" * 8000} for i in range(120)]},
            },
            "spec.network.env",
        ),
    ],
)
def test_a_raycluster_larger_than_etcd_stores_is_refused_naming_the_largest_field(
    spec: dict[str, Any], largest: str
) -> None:
    from fsdp_operator.api import render

    (found,) = problems(spec)
    assert found.startswith(f"{largest}: the RayCluster would be about ")
    assert "over the 1507328 that fit in etcd's 1572864-byte limit" in found
    # What the rendered object really takes: over the limit too.
    smaller = json.loads(json.dumps(spec))
    for env in (smaller.get("env", []), smaller.get("network", {}).get("env", [])):
        for item in env:
            item["value"] = item["value"][: len(item["value"]) // 3]
    job = parse_job(manifest(smaller))
    assert len(json.dumps(render.raycluster(job), separators=(",", ":"))) < 1536 * 1024 - 64 * 1024


LONG_LABELS = {f"example.com/label-{i:02d}" + "k" * 30: "v" * 63 for i in range(64)}


@pytest.mark.parametrize(
    ("spec", "labels"),
    [
        ({}, {}),
        ({"env": [{"name": f"V{i}", "value": "x" * 9000} for i in range(80)]}, {}),
        (
            {
                "image": "registry.example.com/" + "/".join(["a" * 60] * 3) + ":" + "t" * 128,
                "serviceAccountName": "s" * 253,
                "queueName": "q" * 63,
                "workers": {"nodeSelector": {f"example.com/k{i}": "v" * 63 for i in range(60)},
                            "tolerations": [{"key": f"t{i}", "operator": "Exists"} for i in range(64)]},
                "head": {"nodeSelector": {f"example.com/k{i}": "v" * 63 for i in range(64)},
                         "tolerations": [{"key": f"t{i}", "operator": "Exists"} for i in range(64)]},
                "network": {"env": [{"name": f"NCCL_{i}", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                                    for i in range(128)]},
                "placement": {"availabilityZone": "us-east-1b", "capacityReservationId": "cr-0a1b2c3d4e5f6a7b8"},
                "sharedVolume": {"claimName": "c" * 253, "mountPath": "/" + "m" * 1000},
            },
            LONG_LABELS,
        ),
    ],
)  # fmt: skip
def test_the_size_estimate_bounds_the_rendered_raycluster(spec: dict[str, Any], labels: dict[str, str]) -> None:
    """The spec cannot render itself (render builds on it): its estimate must be at least the real size, and
    close to it."""
    from fsdp_operator.api import cluster_rules, render

    m = manifest(spec)
    m["metadata"].update(name="n" * 63, namespace="s" * 63, labels=labels)
    job = parse_job(m)
    rendered = len(json.dumps(render.raycluster(job), separators=(",", ":")))
    estimate, _ = cluster_rules.cluster_bytes(job.spec, job.labels)
    assert rendered <= estimate < rendered + cluster_rules.RAYCLUSTER_REST_BYTES


def test_a_large_environment_that_fits_passes() -> None:
    parse_job(manifest({"env": [{"name": f"V{i}", "value": "x" * 5000} for i in range(128)]}))


# --- model.overrides: what can be built ----------------------------------------------------------------------------

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [
        ("num_hidden_layers", 2147483647, "must be at most 1024"),
        ("hidden_size", 10**6, "must be at most 65536"),
        ("intermediate_size", 10**7, "must be at most 262144"),
        ("vocab_size", 2**31 - 1, "must be at most 4194304"),
        ("num_attention_heads", 4096, "must be at most 1024"),
        ("max_position_embeddings", 2**30, "must be at most 16777216"),
        ("num_hidden_layers", 0, "must be at least 1"),
        ("num_key_value_heads", -2, "must be at least 1"),
        ("pad_token_id", 2**23, "must be at most 4194303"),
    ],
)
def test_every_override_has_bounds(field: str, value: int, bound: str) -> None:
    (found,) = problems({"model": {"overrides": {field: value}}})
    assert found.startswith(f"spec.model.overrides.{field}: {bound}"), found


@pytest.mark.parametrize(
    ("name", "overrides", "expected"),
    [
        ("Qwen/Qwen2.5-1.5B", {"num_attention_heads": 7}, "Qwen/Qwen2.5-1.5B's hidden_size (1536) is not a multiple"),
        ("Qwen/Qwen2.5-1.5B", {"num_key_value_heads": 5}, "num_attention_heads (12) is not a multiple of spec.model"),
        ("Qwen/Qwen2.5-1.5B", {"hidden_size": 1548}, "the attention head size (129) is odd"),
        ("Qwen/Qwen2.5-1.5B", {**TINY, "hidden_size": 66}, "is not a multiple of spec.model.overrides.num_att"),
        ("Qwen/Qwen2.5-1.5B", {**TINY, "pad_token_id": 512}, "spec.model.overrides.pad_token_id: 512 is not an id"),
        ("Qwen/Qwen2.5-1.5B", {"vocab_size": 1000, "eos_token_id": 1000}, "eos_token_id: 1000 is not an id"),
        ("meta-llama/Llama-3.2-1B", {"head_dim": 7}, "the attention head size (7) is odd"),
        ("org/some-model", {"hidden_size": 30, "num_attention_heads": 4}, "(30) is not a multiple of"),
        ("org/some-model", {"num_attention_heads": 6, "num_key_value_heads": 4}, "(6) is not a multiple of"),
    ],
)
def test_overrides_that_build_no_model_are_refused(name: str, overrides: dict[str, Any], expected: str) -> None:
    found = problems({"model": {"name": name, "init": "random", "overrides": overrides}})
    assert found[0].startswith("spec.model.overrides.") and expected in found[0], found


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("Qwen/Qwen2.5-1.5B", TINY),
        ("Qwen/Qwen2.5-1.5B", {"num_key_value_heads": 4}),  # 12 heads in groups of 3
        ("Qwen/Qwen2.5-1.5B", {"num_hidden_layers": 2}),
        ("org/some-model", {"hidden_size": 30}),  # its heads are unknown here: the training function judges it
        ("meta-llama/Llama-3.2-1B", {"head_dim": 64, "hidden_size": 2048, "num_attention_heads": 32}),
    ],
)
def test_overrides_that_build_a_model_pass(name: str, overrides: dict[str, Any]) -> None:
    parse_job(manifest({"model": {"name": name, "init": "random", "overrides": overrides}}))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=1, max_value=16),
    st.integers(min_value=1, max_value=16),
)
def test_the_attention_rules_agree_with_the_arithmetic(head_dim: int, groups: int, kv_heads: int) -> None:
    """hidden = heads * head_dim with heads a multiple of kv_heads passes exactly when head_dim is even."""
    heads = groups * kv_heads
    overrides = {"hidden_size": heads * head_dim, "num_attention_heads": heads, "num_key_value_heads": kv_heads}
    spec = {"model": {"name": "org/some-model", "init": "random", "overrides": overrides}}
    if head_dim % 2:
        (found,) = problems(spec)
        assert "odd" in found
    else:
        parse_job(manifest(spec))
    overrides["num_key_value_heads"] = kv_heads + 1
    if heads % (kv_heads + 1):
        assert any("is not a multiple of" in p for p in problems(spec))


# --- floors: shared memory and the validation split ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "floor"),
    [
        ({"sharedMemory": 1}, "1Gi"),
        ({"sharedMemory": "1023Mi"}, "1Gi"),
        ({"sharedMemory": "64Mi"}, "1Gi"),
        ({"sharedMemory": "63Mi", "gpusPerWorker": 0, "efaPerWorker": 0, "ranksPerWorker": 1}, "64Mi"),
        ({"sharedMemory": "1k", "gpusPerWorker": 0, "efaPerWorker": 0, "ranksPerWorker": 1}, "64Mi"),
    ],
)
def test_shared_memory_below_its_floor_is_refused(workers: dict[str, Any], floor: str) -> None:
    found = problems({"workers": workers, "network": {"transport": "socket"}})
    assert len(found) == 1 and found[0].startswith(
        f"spec.workers.sharedMemory: {workers['sharedMemory']} is less than {floor}: "
    )


def test_shared_memory_at_its_floor_passes() -> None:
    parse_job(manifest({"workers": {"sharedMemory": "1Gi"}}))
    cpu = {"sharedMemory": "64Mi", "gpusPerWorker": 0, "efaPerWorker": 0, "ranksPerWorker": 1, "instanceType": ""}
    parse_job(manifest({"workers": cpu, "network": {"transport": "socket"}}))


@pytest.mark.parametrize("split", [5e-324, 1e-300, 1e-9, 9.99e-7])
def test_a_validation_split_below_its_floor_is_refused_on_both_sides(split: float) -> None:
    (found,) = problems({"data": {"source": "s3://bucket/d", "validationSplit": split}})
    assert found.startswith("spec.data.validationSplit: must be 0 (none) or at least 1e-06"), found
    assert "use spec.data.validationSource" in found
    with pytest.raises(ConfigError):
        TrainConfig.from_dict({"data": "s3://bucket/d", "validation_split": split})


@pytest.mark.parametrize("split", [0, 1e-6, 0.001, 0.5])
def test_a_validation_split_at_or_above_its_floor_passes(split: float) -> None:
    parse_job(manifest({"data": {"source": "s3://bucket/d", "validationSplit": split}}))


# --- system paths for caches and local storage ----------------------------------------------------------------------

SYSTEM_PATHS = ["/proc/sys/kernel", "/proc", "/sys/fs", "/dev", "/dev/shm/cache", "/etc/ckpt", "/usr/lib/x",
                "/bin", "/lib64/x", "/boot", "/run/x", "/var/run/x", "//proc/x", "/./etc/x", "/"]  # fmt: skip


@pytest.mark.parametrize("path", SYSTEM_PATHS)
def test_system_directories_are_refused_for_caches_and_local_storage(path: str) -> None:
    (found,) = problems({"training": {"compileCacheDir": path}})
    assert found.startswith(f"spec.training.compileCacheDir: {path!r} is "), found
    assert "a directory of the system or the image" in found
    for spec in (
        {"workers": {"replicas": 1}, "training": {"checkpoint": {"storage": path}}},
        {"workers": {"replicas": 1}, "output": {"storage": "file://" + path}},
    ):
        (found,) = problems(spec)
        assert "a directory of the system or the image" in found, found


@pytest.mark.parametrize("path", ["/tmp/cache", "/cache", "/var/cache/x", "/home/ray/.cache", "/procx", "/etcd/x",
                                  "/mnt/fsx/cache", "/opt/x"])  # fmt: skip
def test_other_directories_pass(path: str) -> None:
    parse_job(manifest({"training": {"compileCacheDir": path}}))


# --- instance types as AWS spells them ------------------------------------------------------------------------------


@given(st.sampled_from(["g6.12xlarge", "p5.48xlarge", "g5.4xlarge", "p4d.24xlarge"]), st.data())
def test_an_instance_type_in_another_case_is_refused_with_the_spelling(name: str, data: st.DataObject) -> None:
    upper = data.draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    spelled = "".join(c.upper() if up else c for c, up in zip(name, upper, strict=True))
    reason = formats.INSTANCE_TYPE.check(spelled)
    if spelled == name:
        assert reason is None
    else:
        assert reason == f"is not spelled as EC2 spells instance types (lower case): use {name!r}"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("G6.12XLARGE", "use 'g6.12xlarge'"),
        ("g6-12xlarge", "is not an EC2 instance type"),
        ("g6", "is not an EC2 instance type"),
        ("g6.", "is not an EC2 instance type"),
        (".12xlarge", "is not an EC2 instance type"),
        ("g6.12xlarge.", "is not an EC2 instance type"),
    ],
)
def test_instance_types_ec2_does_not_spell_so_are_refused(value: str, reason: str) -> None:
    (found,) = problems({"workers": {"instanceType": value, "efaPerWorker": 0}, "network": {"transport": "socket"}})
    assert found.startswith(f"spec.workers.instanceType: {value!r} ") and reason in found, found


@pytest.mark.parametrize("value", ["g7.future", "u-6tb1.112xlarge", "m7i.metal-24xl", "p6e-gb200.36xlarge", ""])
def test_instance_types_as_ec2_spells_them_pass(value: str) -> None:
    parse_job(manifest({"workers": {"instanceType": value, "efaPerWorker": 0}, "network": {"transport": "socket"}}))


# --- placement against the workers' nodeSelector --------------------------------------------------------------------

RESERVATION = "cr-0123456789abcdef0"


@pytest.mark.parametrize(
    ("placement", "selector", "expected"),
    [
        (
            {"capacityReservationId": RESERVATION},
            {"karpenter.k8s.aws/capacity-reservation-id": "cr-11111111111111111"},
            "spec.workers.nodeSelector.karpenter.k8s.aws/capacity-reservation-id: 'cr-11111111111111111' contradicts "
            f"spec.placement.capacityReservationId ({RESERVATION})",
        ),
        (
            {"capacityReservationId": RESERVATION},
            {"karpenter.sh/capacity-type": "spot"},
            f"spec.workers.nodeSelector.karpenter.sh/capacity-type: spot contradicts spec.placement.capacityReservation"
            f"Id ({RESERVATION})",
        ),
        (
            {"availabilityZone": "us-east-1b"},
            {"failure-domain.beta.kubernetes.io/zone": "us-east-1a"},
            "spec.workers.nodeSelector.failure-domain.beta.kubernetes.io/zone: 'us-east-1a' contradicts "
            "spec.placement.availabilityZone (us-east-1b)",
        ),
        (
            {},
            {"topology.kubernetes.io/zone": "us-east-1b", "failure-domain.beta.kubernetes.io/zone": "us-east-1a"},
            "spec.workers.nodeSelector.failure-domain.beta.kubernetes.io/zone: 'us-east-1a' contradicts "
            "spec.workers.nodeSelector.topology.kubernetes.io/zone (us-east-1b)",
        ),
        (
            {},
            {"karpenter.k8s.aws/instance-family": "p5"},
            "spec.workers.nodeSelector.karpenter.k8s.aws/instance-family: 'p5' contradicts spec.workers.instanceType "
            "(g6.12xlarge)",
        ),
        (
            {},
            {"karpenter.k8s.aws/instance-size": "48xlarge"},
            "spec.workers.nodeSelector.karpenter.k8s.aws/instance-size: '48xlarge' contradicts spec.workers.instance",
        ),
    ],
)
def test_a_selector_contradicting_the_placement_is_refused_naming_both(
    placement: dict[str, str], selector: dict[str, str], expected: str
) -> None:
    (found,) = problems({"placement": placement, "workers": {"nodeSelector": selector}})
    assert found.startswith(expected), found


def test_a_selector_repeating_the_placement_passes_and_the_reservation_is_rendered_once() -> None:
    from fsdp_operator.api import render

    selector = {
        "karpenter.k8s.aws/capacity-reservation-id": RESERVATION,
        "karpenter.sh/capacity-type": "on-demand",
        "karpenter.k8s.aws/instance-family": "g6",
        "karpenter.k8s.aws/instance-size": "12xlarge",
        "topology.kubernetes.io/zone": "us-east-1b",
    }
    placement = {"capacityReservationId": RESERVATION, "availabilityZone": "us-east-1b"}
    job = parse_job(manifest({"placement": placement, "workers": {"nodeSelector": selector}}))
    rendered = render.raycluster(job)["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
    assert rendered["karpenter.k8s.aws/capacity-reservation-id"] == RESERVATION


# --- pip entries and strict JSON --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("pandas\\", "ends in a backslash"),
        ("pandas>=2 \\", "ends in a backslash"),
        ("pkg @ https://example.com/pkg.whl\\", "ends in a backslash"),
        ("pkg @ https://example.com/a\\b.whl", "contains a backslash"),
        ("pandas # pinned later", "' #'"),
        ("pandas\nnumpy", "one requirement specifier on one line"),
        ("pandas\r", "one requirement specifier on one line"),
    ],
)
def test_a_pip_entry_is_one_requirement(entry: str, reason: str) -> None:
    (found,) = problems({"runtimeEnv": {"pip": ["numpy", entry]}})
    assert found.startswith("spec.runtimeEnv.pip[1]: ") and reason in found, found


@given(st.from_regex(r"[a-z]([a-z0-9_-]{0,9}[a-z0-9])?(==[0-9]{1,3}(\.[0-9]{1,3}){0,2})?", fullmatch=True))
def test_a_requirement_with_a_backslash_after_it_is_refused(requirement: str) -> None:
    assert formats.PIP_REQUIREMENT.check(requirement) is None
    assert "backslash" in (formats.PIP_REQUIREMENT.check(requirement + "\\") or "")
    assert "backslash" in (formats.PIP_REQUIREMENT.check(requirement + " \\") or "")


JOB = '"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", "metadata": {"name": "j"}'


@pytest.mark.parametrize(
    "text",
    [
        "{" + JOB + ', "spec": {},}',
        "{" + JOB + ', "spec": {"workers": {"replicas": 2,}}}',
        "{" + JOB + ', "spec": {"runtimeEnv": {"pip": ["pandas",]}}}',
        "{" + JOB + ', "spec": {}} // a comment',
        "{" + JOB + ", 'spec': {}}",
        "{" + JOB + ', "spec": {"workers": {"replicas": 0x2}}}',
        '\n  { "apiVersion": "fsdp.dev/v1alpha1",\n "kind": "FSDPTrainingJob", }',
        "{}\n{" + JOB + ', "spec": {},}',
    ],
)
def test_a_json_manifest_is_held_to_json_as_kubectl_holds_it(text: str) -> None:
    with pytest.raises(manifest_yaml.ManifestError) as info:
        manifest_yaml.load_all(text)
    assert str(info.value).startswith("not valid JSON: line "), info.value


@pytest.mark.parametrize(
    "text",
    [
        "{" + JOB + ', "spec": {}}',
        "{}",
        "{apiVersion: fsdp.dev/v1alpha1, kind: FSDPTrainingJob, metadata: {name: j}, spec: {},}",  # YAML, not JSON
    ],
)
def test_json_and_a_yaml_flow_mapping_are_read(text: str) -> None:
    (document,) = manifest_yaml.load_all(text)
    assert isinstance(document, dict)
