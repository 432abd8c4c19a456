"""``python -m keeper_middleware.integrations.proxy``: the same as ``keeper-proxy``."""

import sys

from keeper_middleware.integrations.proxy.cli import main

sys.exit(main())
