"""The architecture: what a ViT is, as data, and how a built one runs.

- `spec`: `ViTConfig`, the one typed description of an architecture (no Keras);
- `spec_rules`: what each of its fields may be and the rules between them, by family of options;
- `variants`: the paper's table of sizes (Ti, S, B, L, H; hybrids; Axial-ViT);
- `execution`: how a built model runs (the attention kernel, remat), which no file holds.
"""

from keras_vit.imports import modules_on_first_use

__getattr__ = modules_on_first_use(__name__)  # each module loads on first use
