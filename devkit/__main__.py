"""``python -m devkit start|stop|status|env``: the development servers."""

import sys

from devkit.cli import main

sys.exit(main(sys.argv[1:]))
