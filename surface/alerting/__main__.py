"""`python -m fabricscope.surface.alerting`: surface/alerting/generate.py."""

import sys

from fabricscope.surface.alerting.generate import main

sys.exit(main())
