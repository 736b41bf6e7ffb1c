"""`python -m surface.alerting`: surface/alerting/generate.py."""

import sys

from surface.alerting.generate import main

sys.exit(main())
