"""The cluster behind the emulated API server: a local stand-in for the KubeRay controller (``kuberay``: each
RayCluster becomes Ray processes on this machine) and the kubelet's side of a pod's life (``kubelet``), both
clients of the API server over HTTP, as KubeRay and the kubelet are (``watching``: list, then watch).

Never imports ``local.server``: tests/unit/test_architecture.py holds the boundary.
"""
