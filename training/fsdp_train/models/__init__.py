"""The model and its parallelism.

A model built from its config (``model``), its attention (``attention``, ``fa4``), its loss (``loss``), precision
and fp8 (``precision``), FSDP2 sharding, compile and activation checkpointing (``parallelize``), and Hugging Face
weights in and out (``weights``: loading into the shards, the export and its self-check).

May import ``contract``, ``state`` and ``datapath``.
"""
