"""``python -m fedtune``: the ``fedtune`` command line (:func:`fedtune.cli.main`)."""

from __future__ import annotations

import sys

from fedtune.cli import main

if __name__ == "__main__":
    sys.exit(main())
