"""`python -m lab ...`: the lab commands alone (same as `fabricscope lab ...`)."""

import sys

from lab.cli import main

sys.exit(main())
