"""The job's Secret as the loops and the finalizer read it: Ray's auth token and the event-signing key."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fsdp_train.contract.events import KEY_ENV, attempt_key

from fsdp_operator.api import render
from fsdp_operator.api.render import Submission
from fsdp_operator.runtime.shared import Runtime


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    references = (obj.get("metadata") or {}).get("ownerReferences")
    return isinstance(references, list) and any(isinstance(r, Mapping) and r.get("uid") == uid for r in references)


def _token(secret: Mapping[str, Any]) -> str:
    data = secret.get("data")
    raw = data.get(render.AUTH_TOKEN_KEY) if isinstance(data, Mapping) else None
    try:
        return base64.b64decode(str(raw or ""), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""


def _events_key(secret: Mapping[str, Any]) -> bytes:
    data = secret.get("data")
    raw = data.get(render.EVENTS_KEY_KEY) if isinstance(data, Mapping) else None
    try:
        return base64.b64decode(str(raw or ""), validate=True)
    except binascii.Error:
        return b""


def with_event_key(submission: Submission, job_key: bytes) -> Submission:
    """The submission with its attempt's signing key in the job's environment (as is, without a job key)."""
    if not job_key:
        return submission
    key = attempt_key(job_key, submission.submission_id).hex()
    env_vars = {**submission.runtime_env.get("env_vars", {}), KEY_ENV: key}
    return replace(submission, runtime_env={**submission.runtime_env, "env_vars": env_vars})


async def job_events_key(runtime: Runtime, namespace: str, job_name: str, uid: str) -> bytes:
    """The job's event-signing key from its own Secret; b'' before the Secret exists or when it is not the job's."""
    secret = await runtime.kube.get_secret(namespace, render.auth_secret_name(job_name))
    if secret is None or (uid and not _owned_by(secret, uid)):
        return b""
    return _events_key(secret)


async def cluster_token(runtime: Runtime, namespace: str, job_name: str, uid: str) -> tuple[str, str]:
    """(Ray auth token of the job's cluster, name of its Secret when that Secret is not the job's own).

    ('', '') with token auth off or before the Secret exists.
    """
    if not runtime.config.security.token_auth:
        return "", ""
    name = render.auth_secret_name(job_name)
    secret = await runtime.kube.get_secret(namespace, name)
    if secret is None:
        return "", ""
    if uid and not _owned_by(secret, uid):
        return "", name  # a token someone else chose is never sent to, or trusted for, this job's cluster
    return _token(secret), ""
