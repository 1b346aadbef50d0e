"""Deprecated: `python -m train.ablate` is `python -m train.studies.ablate`, which it runs."""

import sys

from .studies import ablate


def run():
    """What `python -m train.ablate` and the console scripts installed before the move run."""
    print("Warning: python -m train.ablate is deprecated; use python -m train.studies.ablate "
          "(the same flags).", file=sys.stderr, flush=True)
    ablate.run()


if __name__ == "__main__":
    run()
