#!/usr/bin/env python3
"""``scripts/dev.sh``'s way to the development servers: the command of :mod:`devkit.cli`.

python scripts/services.py start|stop|status|env    # the same as python -m devkit ...
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devkit.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
