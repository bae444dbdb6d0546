"""Nodes that are going away, before their pods are: the termination taints of Karpenter and the AWS Node
Termination Handler on the nodes that host a running job's workers (`decide/interruptions.py` acts on them).

The taints, as their projects document them:

- `karpenter.sh/disrupted` (Karpenter v1; `karpenter.sh/disruption` before v1): "Add the karpenter.sh/disrupted:
  NoSchedule taint to the node(s) to prevent pods from scheduling to it", the first step of every disruption
  (Drift, Consolidation, Interruption), before the node is drained (https://karpenter.sh/docs/concepts/disruption/).
- `aws-node-termination-handler/spot-itn`, `.../scheduled-maintenance`, `.../asg-lifecycle-termination`: the
  Node Termination Handler with `taintNode: true` (`TAINT_NODE`) taints a node when an interruption event arrives,
  before it cordons and drains it (https://github.com/aws/aws-node-termination-handler, configuration). Its
  `rebalance-recommendation` taint is no termination and is not acted on.

A worker pod on such a node is deleted gracefully (its own grace period) once: its preStop hook then tells the ranks
and waits for the checkpoint (`fsdp_train.watch.notice`), minutes before a drain would reach it, if ever.
"""

from __future__ import annotations

from typing import Any

from fsdp_operator.decide.observed import NodeNotice
from fsdp_operator.runtime.kube import Kube
from fsdp_operator.runtime.watched import NODE_TYPE_LABEL, Watched

TERMINATION_TAINTS = (
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/asg-lifecycle-termination",
)


def termination_taint(node: dict[str, Any]) -> str:
    """The first termination taint of `node` (its key), or ''."""
    taints = (node.get("spec") or {}).get("taints") or []
    keys = {str(t.get("key")) for t in taints if isinstance(t, dict)}
    return next((key for key in TERMINATION_TAINTS if key in keys), "")


async def node_notices(
    kube: Kube, namespace: str, cluster_name: str, *, taints: bool, watched: Watched | None = None
) -> tuple[NodeNotice, ...]:
    """The job's worker pods being deleted (whoever deleted them), and with `taints` (the operator's `nodeNotices`)
    those not yet being deleted on nodes with a termination taint.

    The pods come from the operator's pod watch where it runs (`watched.py`: no request pass after pass), else a list.
    """
    if watched is not None and watched.pods_watched:
        pods = [
            p
            for p in watched.pods(namespace, cluster_name)
            if ((p.get("metadata") or {}).get("labels") or {}).get(NODE_TYPE_LABEL) == "worker"
        ]
    else:
        pods = await kube.list_pods(namespace, f"ray.io/cluster={cluster_name},{NODE_TYPE_LABEL}=worker")
    notices = [
        NodeNotice(str(p["metadata"].get("name", "")), str(p["metadata"].get("uid", "")),
                   str((p.get("spec") or {}).get("nodeName") or ""), "", deleting=True)
        for p in pods
        if (p.get("metadata") or {}).get("deletionTimestamp")
    ]  # fmt: skip
    placed = {
        str(p["spec"]["nodeName"]): p
        for p in pods
        if (p.get("spec") or {}).get("nodeName") and not (p.get("metadata") or {}).get("deletionTimestamp")
    }
    if not placed or not taints:
        return tuple(notices)
    for node in await kube.list_nodes(""):
        name = str((node.get("metadata") or {}).get("name", ""))
        if name in placed and (taint := termination_taint(node)):
            meta = placed[name]["metadata"]
            notices.append(NodeNotice(str(meta.get("name", "")), str(meta.get("uid", "")), name, taint))
    return tuple(notices)
