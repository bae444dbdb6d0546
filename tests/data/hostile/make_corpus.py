"""Writes the hostile-manifest corpus: one file per case and EXPECTED.tsv with what `fsdpctl validate` must say.

Run from anywhere: `python tests/data/hostile/make_corpus.py`. The expectations below are written by
hand (exit code and the start of the first problem line, or a part of the exit-2 message); the test
(tests/unit/test_hostile_manifests.py) checks every file through the real `fsdpctl validate` entry
point. The two cases larger than a repository file should be (over the API server's 3 MiB and over
the 1.5 MiB object limit) are built by the test itself and listed there.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
HEAD = "apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata:\n  name: j\n"


def spec(text: str) -> str:
    return f"{HEAD}spec: {text}\n"


def meta(text: str) -> str:
    return f"apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata: {text}\nspec: {{}}\n"


# (file stem, class, content, exit code, expected: start of the first problem (exit 1) or part of the error (exit 2))
CASES: list[tuple[str, str, str | bytes, int, str]] = [
    # --- value shapes at any path ---
    ("shape-spec-list", "shape", spec("[a, b]"), 1, "spec: expected object, got array"),
    ("shape-spec-string", "shape", spec("'all'"), 1, "spec: expected object, got string"),
    ("shape-metadata-list", "shape", meta("[j]"), 1, "metadata: expected object, got array"),
    ("shape-metadata-string", "shape", meta("j"), 1, "metadata: expected object, got string"),
    ("shape-name-int", "shape", meta("{name: 7}"), 1, "metadata.name: expected string, got integer 7"),
    ("shape-name-map", "shape", meta("{name: {a: 1}}"), 1, "metadata.name: expected string, got object"),
    ("shape-labels-list", "shape", meta("{name: j, labels: [a]}"), 1, "metadata.labels: expected object, got array"),
    ("shape-label-value-map", "shape", meta("{name: j, labels: {a: {b: c}}}"), 1, "metadata.labels.a: expected"),
    ("shape-annotations-str", "shape", meta("{name: j, annotations: x}"), 1, "metadata.annotations: expected object"),
    ("shape-generation-str", "shape", meta("{name: j, generation: two}"), 1, "metadata.generation: expected integer"),
    ("shape-generation-float", "shape", meta("{name: j, generation: 1.5}"), 1, "metadata.generation: expected integer"),
    ("shape-workers-list", "shape", spec("{workers: [2]}"), 1, "spec.workers: expected object, got array"),
    ("shape-replicas-list", "shape", spec("{workers: {replicas: [2]}}"), 1, "spec.workers.replicas: expected integer"),
    ("shape-tolerations-map", "shape", spec("{workers: {tolerations: {key: a}}}"), 1, "spec.workers.tolerations: exp"),
    ("shape-toleration-str", "shape", spec("{head: {tolerations: [a]}}"), 1, "spec.head.tolerations[0]: expected obj"),
    ("shape-env-map", "shape", spec("{network: {env: {A: b}}}"), 1, "spec.network.env: expected array, got object"),
    ("shape-pip-string", "shape", spec("{runtimeEnv: {pip: pandas}}"), 1, "spec.runtimeEnv.pip: expected array"),
    ("shape-envvars-list", "shape", spec("{runtimeEnv: {envVars: [A]}}"), 1, "spec.runtimeEnv.envVars: expected obj"),
    ("shape-overrides-float", "shape", spec("{model: {overrides: {x: 1.5}}}"), 1, "spec.model.overrides.x: expected"),
    ("shape-bool-string", "shape", spec("{training: {compile: 'yes'}}"), 1, "spec.training.compile: expected boolean"),
    ("shape-int-key", "shape", spec("{1: 2}"), 1, "spec.1: unknown field"),
    ("shape-null-key", "shape", spec("{~: 2}"), 2, "has no JSON form"),
    ("shape-list-key", "shape", spec("{? [a]: 2}"), 2, "a mapping key must be a string"),
    # --- encodings ---
    ("enc-utf16le", "encoding", spec("{}").encode("utf-16"), 2, "is UTF-16 text; save it as UTF-8"),
    ("enc-utf16be", "encoding", b"\xfe\xff" + spec("{}").encode("utf-16-be"), 2, "is UTF-16 text"),
    ("enc-utf16-nobom", "encoding", spec("{}").encode("utf-16-le"), 2, "contains a NUL byte at offset 1"),
    ("enc-utf32", "encoding", spec("{}").encode("utf-32"), 2, "is UTF-32 text"),
    ("enc-latin1", "encoding", spec("{model: {name: caf\u00e9}}").encode("latin-1"), 2, "is not UTF-8 text (byte 0xe9"),
    ("enc-binary", "encoding", bytes(range(256)), 2, "contains a NUL byte at offset 0"),
    ("enc-control-char", "encoding", spec('{model: {name: "a\x07b"}}'), 2, "not valid YAML"),
    ("enc-bad-escape", "encoding", spec('{model: {name: "\\ud800"}}'), 2, "not valid YAML"),
    # --- duplicate keys ---
    ("dup-top", "duplicate-keys", spec("{}") + "spec: {}\n", 2, "duplicate key 'spec' (kubectl refuses it too)"),
    ("dup-nested", "duplicate-keys", spec("{workers: {replicas: 2, replicas: 3}}"), 2, "duplicate key 'replicas'"),
    ("dup-label", "duplicate-keys", meta("{name: j, labels: {a: x, a: y}}"), 2, "duplicate key 'a'"),
    ("dup-int-and-string", "duplicate-keys", spec("{1: a, '1': b}"), 2, "duplicate key '1'"),
    # --- aliases ---
    (
        "alias-billion-laughs",
        "aliases",
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}' if i > 1 else '*a'] * 10)}]\n" for i in range(1, 10))
        + HEAD
        + "spec: {}\n",
        2,
        "expands to more than 100000 values (aliases included)",
    ),
    ("alias-recursive", "aliases", spec("&s {model: *s}"), 2, "the alias *s refers to a collection that contains it"),
    (
        "alias-wide-strings",
        "aliases",
        f"x: &x {'y' * 60000}\n" + f"l: [{', '.join(['*x'] * 40)}]\n" + HEAD + "spec: {}\n",
        2,
        "larger than 1572864 bytes once aliases are expanded",
    ),
    ("alias-undefined", "aliases", spec("{model: *nothere}"), 2, "not valid YAML"),
    # --- nesting ---
    ("nest-deep-flow", "nesting", spec("[" * 150 + "]" * 150), 2, "nested deeper than 100 levels"),
    (
        "nest-deep-block",
        "nesting",
        HEAD + "spec:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(120)),
        2,
        "nested deeper than 100 levels",
    ),
    ("nest-deep-in-labels", "nesting", meta("{name: j, labels: " + "{a: " * 110 + "x" + "}" * 110 + "}"), 2, "deeper"),
    # --- NaN and infinity ---
    (
        "nan-learning-rate",
        "nan-inf",
        spec("{training: {learningRate: .nan}}"),
        1,
        "spec.training.learningRate: must be a finite",
    ),
    (
        "inf-learning-rate",
        "nan-inf",
        spec("{training: {learningRate: .inf}}"),
        1,
        "spec.training.learningRate: must be a finite",
    ),
    (
        "neg-inf-bandwidth",
        "nan-inf",
        spec("{network: {minCrossNodeBandwidthGBps: -.inf}}"),
        1,
        "spec.network.minCrossNo",
    ),
    (
        "nan-steps",
        "nan-inf",
        spec("{training: {steps: .NaN}}"),
        1,
        "spec.training.steps: expected integer, got number nan",
    ),
    ("inf-cpu", "nan-inf", spec("{head: {cpu: .inf}}"), 1, "spec.head.cpu: expected quantity (integer or string)"),
    # --- integer and number bounds ---
    (
        "int-replicas-huge",
        "bounds",
        spec("{workers: {replicas: 100000}}"),
        1,
        "spec.workers.replicas: must be at most 512",
    ),
    (
        "int-replicas-zero",
        "bounds",
        spec("{workers: {replicas: 0}}"),
        1,
        "spec.workers.replicas: must be at least 1, got 0",
    ),
    (
        "int-seed-2p64",
        "bounds",
        spec("{training: {seed: 18446744073709551616}}"),
        1,
        "spec.training.seed: must be at most",
    ),
    (
        "int-steps-overflow",
        "bounds",
        spec("{training: {steps: 9223372036854775808}}"),
        1,
        "spec.training.steps: must be",
    ),
    (
        "int-digits-5000",
        "bounds",
        spec("{training: {steps: " + "9" * 5000 + "}}"),
        1,
        "spec.training.steps: expected integer",
    ),
    ("int-negative-deadline", "bounds", spec("{runPolicy: {activeDeadlineSeconds: -5}}"), 1, "spec.runPolicy.activeDe"),
    (
        "int-probe-huge",
        "bounds",
        spec("{training: {probeSizeBytes: 1e15}}"),
        1,
        "spec.training.probeSizeBytes: must be at most",
    ),
    (
        "int-seqlen-small",
        "bounds",
        spec("{training: {seqLen: 4}}"),
        1,
        "spec.training.seqLen: must be at least 8, got 4",
    ),
    (
        "num-lr-zero",
        "bounds",
        spec("{training: {learningRate: 0}}"),
        1,
        "spec.training.learningRate: must be greater than 0",
    ),
    (
        "num-lr-ten",
        "bounds",
        spec("{training: {learningRate: 10}}"),
        1,
        "spec.training.learningRate: must be at most 1",
    ),
    (
        "int-overrides-huge",
        "bounds",
        spec("{model: {overrides: {layers: 4294967296}}}"),
        1,
        "spec.model.overrides.layers",
    ),
    (
        "int-gpus-17",
        "bounds",
        spec("{workers: {gpusPerWorker: 17}}"),
        1,
        "spec.workers.gpusPerWorker: must be at most 16",
    ),
    # --- quantities ---
    (
        "qty-leading-space",
        "quantity",
        spec("{workers: {cpu: ' 4'}}"),
        1,
        "spec.workers.cpu: ' 4' is not a Kubernetes quantity",
    ),
    ("qty-trailing-space", "quantity", spec("{workers: {cpu: '4 '}}"), 1, "spec.workers.cpu: '4 ' is not a Kubernetes"),
    ("qty-exponent-binary", "quantity", spec("{workers: {memory: 1e3Gi}}"), 1, "spec.workers.memory: '1e3Gi' is not"),
    ("qty-two-dots", "quantity", spec("{workers: {memory: 1.5.5Gi}}"), 1, "spec.workers.memory: '1.5.5Gi' is not"),
    ("qty-empty", "quantity", spec("{head: {memory: ''}}"), 1, "spec.head.memory: '' is not a Kubernetes quantity"),
    (
        "qty-capital-k",
        "quantity",
        spec("{head: {memory: 8K}}"),
        1,
        "spec.head.memory: '8K' is not a Kubernetes quantity",
    ),
    (
        "qty-negative",
        "quantity",
        spec("{workers: {sharedMemory: -1Gi}}"),
        1,
        "spec.workers.sharedMemory: '-1Gi' must be posit",
    ),
    ("qty-zero", "quantity", spec("{workers: {cpu: 0}}"), 1, "spec.workers.cpu: '0' must be positive"),
    (
        "qty-huge-exponent",
        "quantity",
        spec("{workers: {cpu: '1e999999999'}}"),
        1,
        "spec.workers.cpu: '1e999999999' is out",
    ),
    (
        "qty-arabic-digits",
        "quantity",
        spec("{workers: {cpu: '\u0664'}}"),
        1,
        "spec.workers.cpu: '\u0664' is not a Kubernetes",
    ),
    ("qty-newline", "quantity", spec('{workers: {cpu: "4\\n"}}'), 1, "spec.workers.cpu: '4\\n' is not a Kubernetes"),
    (
        "qty-bool",
        "quantity",
        spec("{workers: {cpu: true}}"),
        1,
        "spec.workers.cpu: expected quantity (integer or string)",
    ),
    ("qty-fraction-exponent", "quantity", spec("{workers: {cpu: '1e1.5'}}"), 1, "spec.workers.cpu: '1e1.5' is not"),
    # --- names and namespaces ---
    ("name-upper", "names", meta("{name: Job}"), 1, "metadata.name: 'Job' must be a DNS-1123 label"),
    ("name-64", "names", meta("{name: " + "a" * 64 + "}"), 1, "metadata.name: longer than 63 characters"),
    ("name-dot", "names", meta("{name: a.b}"), 1, "metadata.name: 'a.b' must be a DNS-1123 label"),
    ("name-missing", "names", meta("{namespace: ml}"), 1, "metadata.name: required"),
    (
        "metadata-missing",
        "names",
        "apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nspec: {}\n",
        1,
        "metadata.name: req",
    ),
    (
        "namespace-underscore",
        "names",
        meta("{name: j, namespace: my_ns}"),
        1,
        "metadata.namespace: 'my_ns' must be a DNS",
    ),
    ("name-trailing-dash", "names", meta("{name: j-}"), 1, "metadata.name: 'j-' must be a DNS-1123 label"),
    # --- labels and annotations ---
    (
        "label-key-bad",
        "labels-annotations",
        meta("{name: j, labels: {'-a': x}}"),
        1,
        "metadata.labels: key '-a' must be",
    ),
    (
        "label-prefix-bad",
        "labels-annotations",
        meta("{name: j, labels: {'Ex.com/a': x}}"),
        1,
        "metadata.labels: key 'Ex.c",
    ),
    (
        "label-value-long",
        "labels-annotations",
        meta("{name: j, labels: {a: " + "v" * 64 + "}}"),
        1,
        "metadata.labels.a: lon",
    ),
    (
        "label-value-space",
        "labels-annotations",
        meta("{name: j, labels: {a: 'b c'}}"),
        1,
        "metadata.labels.a: 'b c' must",
    ),
    (
        "annotation-key-bad",
        "labels-annotations",
        meta("{name: j, annotations: {'a b': x}}"),
        1,
        "metadata.annotations: key",
    ),
    (
        "annotation-int",
        "labels-annotations",
        meta("{name: j, annotations: {a: 1}}"),
        1,
        "metadata.annotations.a: expected",
    ),
    (
        "selector-key-bad",
        "labels-annotations",
        spec("{workers: {nodeSelector: {'a b': x}}}"),
        1,
        "spec.workers.nodeSelector: key",
    ),
    (
        "selector-value-bad",
        "labels-annotations",
        spec("{head: {nodeSelector: {a: '@'}}}"),
        1,
        "spec.head.nodeSelector.a: '@'",
    ),
    # --- environment variable names ---
    (
        "env-name-digit",
        "env-names",
        spec("{network: {env: [{name: 1A, value: x}]}}"),
        1,
        "spec.network.env[0].name: '1A'",
    ),
    (
        "env-name-equals",
        "env-names",
        spec("{network: {env: [{name: 'A=B'}]}}"),
        1,
        "spec.network.env[0].name: 'A=B' must",
    ),
    ("env-name-missing", "env-names", spec("{network: {env: [{value: x}]}}"), 1, "spec.network.env[0].name: required"),
    (
        "envvars-key-space",
        "env-names",
        spec("{runtimeEnv: {envVars: {'A B': x}}}"),
        1,
        "spec.runtimeEnv.envVars: key 'A B'",
    ),
    # --- image references ---
    (
        "image-uppercase",
        "image",
        spec("{image: Rayproject/Ray:1}"),
        1,
        "spec.image: 'Rayproject/Ray:1' is not an OCI image",
    ),
    ("image-space", "image", spec("{image: 'ray :1'}"), 1, "spec.image: 'ray :1' is not an OCI image reference"),
    ("image-empty-tag", "image", spec("{image: 'ray:'}"), 1, "spec.image: 'ray:' is not an OCI image reference"),
    ("image-short-digest", "image", spec("{image: 'ray@sha256:abc'}"), 1, "spec.image: 'ray@sha256:abc' is not"),
    (
        "image-scheme",
        "image",
        spec("{image: 'https://registry/ray:1'}"),
        1,
        "spec.image: 'https://registry/ray:1' is not",
    ),
    ("image-empty", "image", spec("{image: ''}"), 1, "spec.image: '' is not an OCI image reference"),
    # --- storage URIs ---
    (
        "uri-no-bucket",
        "uri",
        spec("{training: {checkpoint: {storage: 's3://'}}}"),
        1,
        "spec.training.checkpoint.storage: 's3",
    ),
    (
        "uri-dotdot",
        "uri",
        spec("{training: {checkpoint: {storage: 's3://b1/a/../../x'}}}"),
        1,
        "spec.training.checkpoint.",
    ),
    (
        "uri-userinfo",
        "uri",
        spec("{training: {checkpoint: {storage: 's3://AKIA:s3cr3t@bkt/x'}}}"),
        1,
        "spec.training.ch",
    ),
    (
        "uri-http",
        "uri",
        spec("{training: {checkpoint: {storage: 'http://h/x'}}}"),
        1,
        "spec.training.checkpoint.storage",
    ),
    (
        "uri-relative",
        "uri",
        spec("{training: {checkpoint: {storage: 'ckpt/run1'}}}"),
        1,
        "spec.training.checkpoint.sto",
    ),
    (
        "uri-query",
        "uri",
        spec("{training: {checkpoint: {storage: 's3://bkt/x?a=1'}}}"),
        1,
        "spec.training.checkpoint.s",
    ),
    (
        "uri-file-host",
        "uri",
        spec("{training: {checkpoint: {storage: 'file://host/x'}}}"),
        1,
        "spec.training.checkpoint",
    ),
    (
        "uri-bad-bucket",
        "uri",
        spec("{training: {checkpoint: {storage: 's3://Bucket_/x'}}}"),
        1,
        "spec.training.checkpoint",
    ),
    (
        "uri-abs-dotdot",
        "uri",
        spec("{training: {checkpoint: {storage: '/mnt/../etc'}}}"),
        1,
        "spec.training.checkpoint.",
    ),
    # --- a missing spec ---
    ("spec-missing", "missing-spec", HEAD, 1, "spec: required (`spec: {}` takes every default)"),
    ("spec-null", "missing-spec", HEAD + "spec:\n", 1, "spec: required (`spec: {}` takes every default)"),
    # --- unknown fields at every level ---
    ("unknown-top", "unknown-fields", spec("{}") + "extra: 1\n", 1, "extra: unknown field"),
    ("unknown-metadata", "unknown-fields", meta("{name: j, nmae: k}"), 1, "metadata.nmae: unknown field"),
    ("unknown-spec", "unknown-fields", spec("{trainig: {}}"), 1, "spec.trainig: unknown field"),
    ("unknown-workers", "unknown-fields", spec("{workers: {replica: 3}}"), 1, "spec.workers.replica: unknown field"),
    (
        "unknown-toleration",
        "unknown-fields",
        spec("{workers: {tolerations: [{key: a, operatr: Exists}]}}"),
        1,
        "spec.work",
    ),
    (
        "unknown-env",
        "unknown-fields",
        spec("{network: {env: [{name: A, vaule: x}]}}"),
        1,
        "spec.network.env[0].vaule: un",
    ),
    (
        "unknown-valuefrom",
        "unknown-fields",
        spec("{network: {env: [{name: A, valueFrom: {vault: x}}]}}"),
        1,
        "spec.network",
    ),
    (
        "unknown-checkpoint",
        "unknown-fields",
        spec("{training: {checkpoint: {path: /x}}}"),
        1,
        "spec.training.checkpoint.pa",
    ),
    (
        "unknown-runpolicy",
        "unknown-fields",
        spec("{runPolicy: {retries: 3}}"),
        1,
        "spec.runPolicy.retries: unknown field",
    ),
    (
        "unknown-long-key",
        "unknown-fields",
        HEAD + "spec:\n  ? " + "k" * 5000 + "\n  : 1\n",
        1,
        "spec.['kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk'...]",
    ),
    # --- credentials never echoed ---
    (
        "secret-env-value-type",
        "credentials",
        spec("{network: {env: [{name: A, value: [s3cr3t]}]}}"),
        1,
        "spec.network.env[0",
    ),
    (
        "secret-envvars-type",
        "credentials",
        spec("{runtimeEnv: {envVars: {TOKEN: 12345}}}"),
        1,
        "spec.runtimeEnv.envVars.TOK",
    ),
    (
        "secret-pip-url",
        "credentials",
        spec("{runtimeEnv: {pip: ['x @ https://u:s3cr3t@h/x.whl']}}"),
        1,
        "spec.runtimeEnv.pip[0]",
    ),
    (
        "secret-annotation",
        "credentials",
        meta("{name: j, annotations: {note: [s3cr3t]}}"),
        1,
        "metadata.annotations.note",
    ),
    (
        "secret-annotation-int",
        "credentials",
        meta("{name: j, annotations: {token: 31337}}"),
        1,
        "metadata.annotations.to",
    ),
    # --- operator-owned settings ---
    (
        "owned-nccl-debug",
        "operator-owned",
        spec("{network: {env: [{name: NCCL_DEBUG, value: WARN}]}}"),
        1,
        "spec.network.e",
    ),
    (
        "owned-nccl-net",
        "operator-owned",
        spec("{runtimeEnv: {envVars: {NCCL_NET: Socket}}}"),
        1,
        "spec.runtimeEnv.envVars.NC",
    ),
    (
        "owned-fi",
        "operator-owned",
        spec("{network: {env: [{name: FI_PROVIDER, value: tcp}]}}"),
        1,
        "spec.network.env[0].na",
    ),
    (
        "owned-ld-preload",
        "operator-owned",
        spec("{runtimeEnv: {envVars: {LD_PRELOAD: /x.so}}}"),
        1,
        "spec.runtimeEnv.envVa",
    ),
    (
        "owned-ray-dedup",
        "operator-owned",
        spec("{runtimeEnv: {envVars: {RAY_DEDUP_LOGS: '1'}}}"),
        1,
        "spec.runtimeEnv.env",
    ),
    (
        "owned-debug-file",
        "operator-owned",
        spec("{runtimeEnv: {envVars: {NCCL_DEBUG_FILE: /x}}}"),
        1,
        "spec.runtimeEnv.en",
    ),
    (
        "pip-option",
        "pip",
        spec("{runtimeEnv: {pip: ['--index-url http://evil/simple']}}"),
        1,
        "spec.runtimeEnv.pip[0]: '-",
    ),
    (
        "pip-editable",
        "pip",
        spec("{runtimeEnv: {pip: ['-e .']}}"),
        1,
        "spec.runtimeEnv.pip[0]: '-e .' must be a requirement",
    ),
    (
        "pip-newline",
        "pip",
        spec('{runtimeEnv: {pip: ["a\\n--pre"]}}'),
        1,
        "spec.runtimeEnv.pip[0]: 'a\\n--pre' must be one",
    ),
    (
        "pip-bad-url",
        "pip",
        spec("{runtimeEnv: {pip: ['x @ http://[::1']}}"),
        1,
        "spec.runtimeEnv.pip[0]: 'x @ http://[::1' has a URL that is not well-formed",
    ),
    (
        "pip-garbage",
        "pip",
        spec("{runtimeEnv: {pip: ['pandas >=< 2']}}"),
        1,
        "spec.runtimeEnv.pip[0]: 'pandas >=< 2' is not",
    ),
    (
        "selector-contradicts",
        "node-selector",
        spec("{workers: {nodeSelector: {node.kubernetes.io/instance-type: p5.48xlarge}}}"),
        1,
        "spec.workers.nodeSelector.node.kubernetes.io/instance-type: 'p5.48xlarge' contradicts",
    ),
    (
        "selector-beta-contradicts",
        "node-selector",
        spec("{workers: {nodeSelector: {beta.kubernetes.io/instance-type: x}}}"),
        1,
        "spec.workers.nodeSelector.beta",
    ),
    # --- one contract with the training function ---
    (
        "warmup-equals-steps",
        "train-config",
        spec("{training: {steps: 50, warmupSteps: 50}}"),
        1,
        "spec.training.warmupSteps: must be less than spec.training.steps (50 >= 50).",
    ),
    (
        "interval-without-storage",
        "train-config",
        spec("{training: {checkpoint: {intervalSteps: 5}}}"),
        1,
        "spec.training.checkpoint.intervalSteps: set, but",
    ),
    # --- found by the second hostile pass (each failed before its fix) ---
    (
        "shape-ownerref-int",
        "shape",
        meta("{name: j, ownerReferences: [1]}"),
        1,
        "metadata.ownerReferences[0]: expected",
    ),
    (
        "shape-ownerref-fields",
        "shape",
        meta("{name: j, ownerReferences: [{kind: X, name: x, uid: u}]}"),
        1,
        "metadata.ownerReferences[0].apiVersion: required",
    ),
    ("shape-managedfields-str", "shape", meta("{name: j, managedFields: [x]}"), 1, "metadata.managedFields[0]: exp"),
    ("quantity-exa-binary", "quantity", spec("{workers: {memory: 1Ei}}"), 1, "spec.workers.memory: '1Ei' is out of"),
    ("quantity-exa-binary-cpu", "quantity", spec("{head: {cpu: 2Ei}}"), 1, "spec.head.cpu: '2Ei' is out of range"),
    (
        "uri-encoded-dotdot",
        "uri",
        spec("{data: {source: 'file:///data/%2e%2E/etc'}}"),
        1,
        "spec.data.source: 'file:///data/%2e%2E/etc' must not contain '..' segments",
    ),
    (
        "uri-backslash-dotdot",
        "uri",
        spec("{output: {storage: '/data/..\\x'}}"),
        1,
        "spec.output.storage: '/data/..\\\\x' must not contain '..' segments",
    ),
    (
        "uri-unicode-space",
        "uri",
        spec('{training: {checkpoint: {storage: "s3://bucket/a\\u2028b"}}}'),
        1,
        "spec.training.checkpoint.storage: 's3://bucket/a\\u2028b' must not contain white space",
    ),
    ("uri-model-no-bucket", "uri", spec("{model: {name: 's3:///m'}}"), 1, "spec.model.name: 's3:///m' has no bucket"),
    ("uri-model-http", "uri", spec("{model: {name: 'http://h/m'}}"), 1, "spec.model.name: 'http://h/m' has an uns"),
    (
        "secret-model-userinfo",
        "credentials",
        spec("{model: {name: 's3://AKIA:s3cr3t@bucket/m'}}"),
        1,
        "spec.model.name: 's3://***@bucket/m' must not carry credentials",
    ),
    (
        "secret-uri-one-slash",
        "credentials",
        spec("{output: {storage: 's3:u:s3cr3t@bucket/x'}}"),
        1,
        "spec.output.storage: 's3:***@bucket/x' has no bucket",
    ),
    (
        "secret-uri-space",
        "credentials",
        spec("{output: {storage: 's3://u:s3cr3t x@bucket/x'}}"),
        1,
        "spec.output.storage: 's3://***@bucket/x' must not contain white space",
    ),
    (
        "owned-lowercase",
        "operator-owned",
        spec("{network: {env: [{name: nccl_debug, value: WARN}]}}"),
        1,
        "spec.network.env[0].name: nccl_debug is set by the operator",
    ),
    (
        "owned-mixed-case-fi",
        "operator-owned",
        spec("{runtimeEnv: {envVars: {Fi_Provider: tcp}}}"),
        1,
        "spec.runtimeEnv.envVars.Fi_Provider: Fi_Provider is set by",
    ),
    (
        "owned-dedup-window",
        "operator-owned",
        spec("{runtimeEnv: {envVars: {RAY_DEDUP_LOGS_AGG_WINDOW_S: '60'}}}"),
        1,
        "spec.runtimeEnv.envVars.RAY_DEDUP_LOGS_AGG_WINDOW_S: RAY_DEDUP",
    ),
    (
        "owned-ray-log-to-stderr",
        "operator-owned",
        spec("{runtimeEnv: {envVars: {RAY_LOG_TO_STDERR: '1'}}}"),
        1,
        "spec.runtimeEnv.envVars.RAY_LOG_TO_STDERR: RAY_LOG_TO_STDERR is set",
    ),
    (
        "owned-ld-audit",
        "operator-owned",
        spec("{network: {env: [{name: LD_AUDIT, value: /x.so}]}}"),
        1,
        "spec.network.env[0].name: LD_AUDIT is set by the operator",
    ),
    (
        "pip-file-url",
        "pip",
        spec("{runtimeEnv: {pip: ['x @ file:///etc/passwd']}}"),
        1,
        "spec.runtimeEnv.pip[0]: 'x @ file:///etc/passwd' must have an https:// or git+https:// URL",
    ),
    (
        "pip-http-url",
        "pip",
        spec("{runtimeEnv: {pip: ['x @ http://h/x.whl']}}"),
        1,
        "spec.runtimeEnv.pip[0]: 'x @ http://h/x.whl' must have an https://",
    ),
    (
        "pip-env-reference",
        "pip",
        spec("{runtimeEnv: {pip: ['x @ https://h/${AWS_SECRET_ACCESS_KEY}.whl']}}"),
        1,
        "spec.runtimeEnv.pip[0]: 'x @ https://h/${AWS_SECRET_ACCESS_KEY}.w'... must not refer to environment",
    ),
    (
        "cpu-fewer-than-ranks",
        "train-config",
        spec("{workers: {cpu: 2}}"),
        1,
        "spec.workers.cpu: 2 CPUs for 4 ranks per worker; each rank needs one CPU",
    ),
    (
        "fp8-without-gpus",
        "train-config",
        spec(
            "{workers: {gpusPerWorker: 0, ranksPerWorker: 2, efaPerWorker: 0, cpu: 4}, network: {transport: socket}, "
            "training: {precision: fp8}}"
        ),
        1,
        "spec.training.precision: fp8 needs GPUs; gpusPerWorker is 0",
    ),
    (
        "compile-cache-dotdot",
        "train-config",
        spec("{training: {compileCacheDir: '/cache/../../etc'}}"),
        1,
        "spec.training.compileCacheDir: '/cache/../../etc' must not contain '..' segments",
    ),
    # --- not an FSDPTrainingJob at all ---
    ("notajob-list", "not-a-job", "- a\n- b\n", 2, "expected a mapping (an FSDPTrainingJob), got array"),
    ("notajob-scalar", "not-a-job", "42\n", 2, "expected a mapping (an FSDPTrainingJob), got integer"),
    (
        "notajob-pod",
        "not-a-job",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n",
        2,
        "got apiVersion: v1 and kind: Pod",
    ),
    ("notajob-version", "not-a-job", HEAD.replace("v1alpha1", "v1") + "spec: {}\n", 2, "got apiVersion: fsdp.dev/v1"),
    ("notajob-two-docs", "not-a-job", spec("{}") + "---\n" + spec("{}"), 2, "expected one YAML document"),
    ("notajob-empty", "not-a-job", "", 2, "found 0"),
    (
        "notajob-kind-map",
        "not-a-job",
        "apiVersion: fsdp.dev/v1alpha1\nkind: {a: 1}\n",
        2,
        "kind: [a value of type object]",
    ),
    # --- YAML syntax and tags ---
    ("yaml-unclosed", "yaml", spec("[unclosed"), 2, "not valid YAML"),
    ("yaml-tab-indent", "yaml", HEAD + "spec:\n\tworkers: {}\n", 2, "not valid YAML"),
    ("yaml-python-tag", "yaml", spec("!!python/object/apply:os.system ['true']"), 2, "not valid YAML"),
    (
        "yaml-binary-tag",
        "yaml",
        spec("{image: !!binary aGVsbG8=}"),
        2,
        "the tag tag:yaml.org,2002:binary has no JSON form",
    ),
    ("yaml-set-tag", "yaml", spec("!!set {a, b}"), 2, "the tag tag:yaml.org,2002:set has no JSON form"),
    ("yaml-bad-int-tag", "yaml", spec("{workers: {replicas: !!int 'two'}}"), 2, "the value cannot be read as int"),
    ("yaml-custom-tag", "yaml", spec("{workers: !Workers {replicas: 2}}"), 2, "the tag !Workers has no JSON form"),
    # --- accepted as kubectl would accept them (controls) ---
    ("ok-yaml12-numbers", "accepted", spec("{training: {learningRate: 1e-4, steps: 1e3, seed: 0o17}}"), 0, ""),
    ("ok-utf8-bom", "accepted", "\ufeff" + spec("{}"), 0, ""),
    (
        "ok-merge-keys",
        "accepted",
        HEAD + "spec:\n  head: {nodeSelector: &sel {pool: train}}\n  workers: {nodeSelector: {<<: *sel, zone: a}}\n",
        0,
        "",
    ),
    (
        "ok-small-aliases",
        "accepted",
        HEAD + "spec:\n  head: {nodeSelector: &sel {pool: train}}\n  workers: {nodeSelector: *sel}\n",
        0,
        "",
    ),
    ("ok-null-fields", "accepted", spec("{workers: null, training: {checkpoint: ~}}"), 0, ""),
]


def main() -> None:
    for old in HERE.glob("*.yaml"):
        old.unlink()
    rows = ["# file\tclass\texit code\texpected (exit 1: start of the first problem; exit 2: part of the error)"]
    for stem, kind, content, code, expected in CASES:
        data = content if isinstance(content, bytes) else content.encode()
        (HERE / f"{stem}.yaml").write_bytes(data)
        rows.append(f"{stem}.yaml\t{kind}\t{code}\t{expected.encode('unicode_escape').decode()}")
    (HERE / "EXPECTED.tsv").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
