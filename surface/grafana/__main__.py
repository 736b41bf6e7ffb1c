"""`python -m fabricscope.surface.grafana`: surface/grafana/dashboards.py."""

import sys

from fabricscope.surface.grafana.dashboards import main

sys.exit(main())
