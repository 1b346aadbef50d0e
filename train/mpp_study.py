"""Deprecated: `python -m train.mpp_study` is `python -m train.studies.mpp`, which it runs."""

import sys

from .studies import mpp


def run():
    """What `python -m train.mpp_study` and the console scripts installed before the move run."""
    print("Warning: python -m train.mpp_study is deprecated; use python -m train.studies.mpp "
          "(the same flags).", file=sys.stderr, flush=True)
    mpp.run()


if __name__ == "__main__":
    run()
