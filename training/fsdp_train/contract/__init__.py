"""What the ranks and the operator share.

The events a rank prints and the operator parses (``wire``, ``event_base``, ``health_events``, ``events``), the
failures a rank names (``failures``), the training config the operator writes (``config``), the tables both sides
read (``catalog``: instance types and their GPUs; ``known_models``: the model configs built without a download),
the per-rank memory estimate the operator judges a job by (``memory``) and NCCL's log lines, read the same way by a
rank and by ``fsdpctl diagnose`` (``nccl``).

Imports no other room of this package and never torch: the operator imports it
(tests/unit/test_architecture.py lists what the operator may import of the training package).
"""
