"""Credentials that rotate: the operator keeps working when the API server stops accepting its first token.

The emulated API server authenticates by bearer token; mid-run it rotates the operator's token (the old
one answers 401 from then on), as the kubelet does with a projected service-account token and as an
exec plugin's short-lived token expires. The operator runs with its real login (kopf's `login_via_client`
through a kubeconfig) and must pick up the new token, for kopf's own requests and the controller's.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
import requests
from fsdp_operator.api import generate, schema
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.local.server.rbac import MASTERS, Access, User
from fsdp_operator.runtime.handlers import build_registry
from fsdp_operator.runtime.kube import AioKube, KubeError
from fsdp_operator.runtime.rayjobs import FakeRay
from fsdp_operator.runtime.shared import Runtime
from kubernetes.config import kube_config
from support.fake_kuberay import FakeKubeRay
from support.kopf_runner import eventually, kopf_operator
from test_operator import FAST, JOBS, Script, manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

OPERATOR = "fsdp-operator"
EXEC_PLUGIN = """
import json, sys
token = open(sys.argv[1]).read().strip()
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": token}}))
"""


def credentials(kind: str, token_file: Path) -> dict[str, Any]:
    """The kubeconfig `user` entry: a token file (as a projected service-account token) or an exec plugin."""
    if kind == "tokenFile":
        return {"tokenFile": str(token_file)}
    plugin = token_file.parent / "plugin.py"
    plugin.write_text(EXEC_PLUGIN)
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin), str(token_file)],
            "interactiveMode": "Never",
        }
    }


@pytest.mark.parametrize("kind", ["tokenFile", "exec"])
def test_the_operator_follows_a_rotated_token(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    access = Access()
    access.add_token("admin", User("admin", (MASTERS,)))
    access.add_token("first", User(OPERATOR, (MASTERS,)))
    api = ThreadedApiServer(access=access).start()
    token_file = tmp_path / "token"
    token_file.write_text("first")
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", user=credentials(kind, token_file))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    # The `kubernetes` client reads $KUBECONFIG once, when first imported.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    admin = requests.Session()
    admin.headers["Authorization"] = "Bearer admin"
    for crd in (generate.crd(), RAYCLUSTER_CRD):
        assert admin.post(f"{api.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd).ok
    ray = FakeRay(script=Script())
    kuberay = FakeKubeRay(api.url, ray)
    kuberay.headers["Authorization"] = "Bearer admin"
    runtime = Runtime(FAST, ray=ray.client)

    def phase(name: str) -> str:
        found = [j for j in api.store.find(schema.PLURAL, schema.GROUP) if j["metadata"]["name"] == name]
        return str((found[0].get("status") or {}).get("phase")) if found else ""

    async def main() -> None:
        async with kuberay.running(), kopf_operator(build_registry(runtime), api.url, login=False):
            assert (await asyncio.to_thread(admin.post, api.url + JOBS, json=manifest("before"))).ok
            await eventually(lambda: phase("before") == "Succeeded", timeout=60, message="first job")
            # Rotation: the old token is refused from now on; the file (or the plugin) gives the new one.
            access.rotate(OPERATOR, "second")
            token_file.write_text("second")
            assert (await asyncio.to_thread(admin.post, api.url + JOBS, json=manifest("after"))).ok
            await eventually(lambda: phase("after") == "Succeeded", timeout=60, message="job after the rotation")

    try:
        asyncio.run(main())
    finally:
        api.stop()
    assert isinstance(runtime._kube, AioKube)
    assert runtime._kube.headers["Authorization"] == "Bearer second"
    assert runtime._kube.refreshes >= 1
    assert access.unauthorized >= 1, "the old token was never refused: the test proved nothing"


def test_the_client_retries_once_with_fresh_credentials_and_fails_typed_without() -> None:
    access = Access()
    access.add_token("old", User(OPERATOR, (MASTERS,)))
    api = ThreadedApiServer(access=access).start()
    api.store.create(api.store.resource("customresourcedefinitions"), generate.crd())  # a 404 then names the job
    fresh: list[str | None] = [None]
    asked: list[int] = []

    async def refresh() -> Any:
        asked.append(1)
        return None if fresh[0] is None else kopf.ConnectionInfo(server=api.url, token=fresh[0])

    async def main() -> None:
        kube = AioKube(api.url, headers={"Authorization": "Bearer old"}, refresh=refresh)
        try:
            assert await kube.get_job("default", "absent") is None
            access.rotate(OPERATOR, "new")
            with pytest.raises(KubeError) as refused:  # no fresh credentials to be had: a typed 401
                await kube.get_job("default", "absent")
            assert refused.value.status == 401 and len(asked) == 1
            fresh[0] = "new"
            assert await kube.get_job("default", "absent") is None  # refreshed, and the request repeated
            assert kube.refreshes == 1 and len(asked) == 2
            assert await kube.get_job("default", "absent") is None
            assert len(asked) == 2  # no refresh while the token works
        finally:
            await kube.close()

    try:
        asyncio.run(main())
    finally:
        api.stop()
