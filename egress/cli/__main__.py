"""`python -m egress.cli`: what worker processes run (see egress/mitm/workers.py)."""

import sys

from egress.cli.main import main

sys.exit(main())
