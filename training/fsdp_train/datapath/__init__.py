"""The data path, from a source to the rows a rank trains on.

A source read and tokenized (``data``, with ``tokenizer_choice``), documents packed into rows and counted
(``packing``), rows fed to the ranks (``feed``), and the fingerprint that ties a checkpoint to its data
(``fingerprint``).

May import ``contract`` and ``state``. No torch at module level: ``fsdpctl data check`` runs it in the
operator's process.
"""
