"""Deprecated: `python -m train.mpp_study` is `python -m train.studies.mpp`, which it runs."""

import sys

from .studies import mpp

if __name__ == "__main__":
    print("Warning: python -m train.mpp_study is deprecated; use python -m train.studies.mpp "
          "(the same flags).", file=sys.stderr, flush=True)
    mpp.run()
