"""``python -m transformer_gmm.training``: see :mod:`transformer_gmm.training.train`."""

from .train import main

if __name__ == "__main__":
    main()
