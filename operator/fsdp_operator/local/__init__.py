"""``fsdpctl run-local`` and what it runs on one machine: the emulated Kubernetes API server (``server/``), the
cluster behind it (``cluster/``: a local KubeRay and kubelet, clients of the server over HTTP), and beside them
run-local's driver (``run``) and ``fsdpctl local make-model`` (``model``).
"""
