"""`python -m surface.grafana`: surface/grafana/dashboards.py."""

import sys

from surface.grafana.dashboards import main

sys.exit(main())
