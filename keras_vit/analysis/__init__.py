"""Looking inside a ViT: the analyses of the paper's section 4.5 and appendix D.7/D.8, and its
few-shot linear metric (section 4.1).

    from keras_vit import analysis
    rollout = analysis.attention_rollout(model, images)        # [N, gh, gw], each sums to 1
    overlay = analysis.overlay(images_uint8, rollout)          # heat map over the images
    dist = analysis.mean_attention_distance(model, images)     # [layers, heads] in pixels
    sim = analysis.position_embedding_similarity(model)        # [gh*gw, gh, gw]
    pcs = analysis.embedding_filters(model, n=28)              # [n, kh, kw, 3]
    acc = analysis.few_shot_accuracy(model, train_data, test_data, shots=(1, 5, 10, 25))

`images` are what the model takes: `[N, height, width, 3]` at its input size, scaled to [-1, 1]
(`keras_vit.preprocess_inputs`). Every function works for non-square grids, for hybrids and for
"gap" models, and on a `keras_vit.native.NaFlexViT` with its input dict, each image at its own
grid (`attention_maps`, rollout, distance, few-shot; the weights' pictures are its classic
model's). The results are numpy arrays; `keras_vit.analysis.plotting` draws them. The
functions named `*_from_attention` and `few_shot_from_features` do the arithmetic on arrays, without
a model.

The room: `attention` (token layout, rollout, attention distance), `embeddings` (position
similarity, patch-embedding filters), `few_shot` (the linear few-shot metric), `plotting`
(their figures) and `flops` (what a model costs); this module hands on the first three's
names, as `keras_vit.analysis` had them before it was a room.
"""

from keras_vit.imports import modules_on_first_use
from keras_vit.analysis.attention import (  # noqa: F401
    TokenLayout, token_layout, rollout_from_attention, attention_rollout, check_images, overlay,
    patch_center_distances, attention_distance_from_attention, mean_attention_distance,
    ImageAttention, attention_maps, check_naflex_inputs)
from keras_vit.analysis.embeddings import (  # noqa: F401
    position_embedding_similarity, position_similarity_summary, first_layer_filters,
    embedding_filter_count, embedding_filters)
from keras_vit.analysis.few_shot import (  # noqa: F401
    DEFAULT_SHOTS, DEFAULT_L2_REG, ridge_classifier, few_shot_from_features, feature_model,
    representations, few_shot_accuracy)

__getattr__ = modules_on_first_use(__name__)  # plotting and flops load on first use
