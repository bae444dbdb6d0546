"""The entry points and the training loop.

Ray Train's entry (``ray_entry``), the bundled function's loop (``loop``), a user's own function
(``user_function``), the checks made before anything slow (``preflight``) and the faults the tests inject
(``fault_hooks``). ``python -m fsdp_train`` (the package's ``__main__``) runs the loop under torchrun.

The top room: it may import every other.
"""
