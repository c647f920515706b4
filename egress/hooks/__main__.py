"""`python -m egress.hooks` = `egress-hooks`."""

import sys

from egress.hooks.cli import main

sys.exit(main())
