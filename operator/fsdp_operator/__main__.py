"""`python -m fsdp_operator`: the operator entry point (the same as `fsdpctl operator`)."""

import sys

from fsdp_operator.runtime.operator_main import main

sys.exit(main())
