"""Weights from and to files: the original `.npz` checkpoints and the libraries' files.

- `checkpoint`: reading and writing the original `.npz` layout (any resolution, any dtype);
- `pretrained`: the published names (`weights="imagenet21k"`) and their downloads;
- `npz_architecture`: the architecture of a bare `.npz`, read from its arrays;
- `hub`: `from_pretrained` / `save_pretrained` for transformers' and timm's files and hub names;
- `torch_layouts`: those libraries' layouts, one module per checkpoint family.
"""

from keras_vit.imports import modules_on_first_use

__getattr__ = modules_on_first_use(__name__)  # each module loads on first use
