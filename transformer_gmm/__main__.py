"""``python -m transformer_gmm``: the ``transformer-gmm`` command line."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
