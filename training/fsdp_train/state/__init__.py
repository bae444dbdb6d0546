"""What a run reads and keeps.

Where files come from (``storage``: local paths, ``s3://``, ``hf://``, model sources fetched to the node),
checkpoints (``checkpoint``, with ``staging``'s pinned buffers for asynchronous saves) and their commit to Ray
Train (``ray_commit``).

May import ``contract`` only.
"""
