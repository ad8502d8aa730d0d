"""``python -m bench SCENARIO [--quick] ...``: :mod:`bench.harness.cli`."""

import sys

from bench.harness.cli import main

sys.exit(main())
