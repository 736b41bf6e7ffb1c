import sys

from fabricscope.cli import main

sys.exit(main())
