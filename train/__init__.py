"""The training tools: `train` in a checkout (`python -m train.main`), `keras_vit.train` in an
installed package (`keras-vit-train`, `python -m keras_vit.train.main`). Its modules import
each other relatively, so both names work; one process must use only one of them."""

import os
import sys

_other = sys.modules.get("keras_vit.train" if __name__ == "train" else "train")
_other_file = getattr(_other, "__file__", None)  # another project's `train` is no concern
if _other_file and os.path.samefile(os.path.dirname(_other_file), os.path.dirname(__file__)):
    raise ImportError(f"{__name__} is {_other.__name__} imported again under another name: "
                      "its absl flags would be defined twice. Import only one of the two.")
