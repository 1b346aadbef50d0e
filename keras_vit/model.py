"""Builds a ViT (or a ResNet+ViT hybrid, or an Axial-ViT) as a Keras functional model, from a
`keras_vit.ViTConfig`.

The model is a plain chain of named layers, in the order of the original:
[hybrid ResNet] -> embedding -> cls -> posembed_input -> dropout -> encoderblock_{i} ->
encoder_norm -> pool -> [pre_logits] -> head. The paper's variants change only the middle:
`posembed_{i}` before block i (or `posembed_input` again) with the every-layer placements,
relative position logits inside each block's attention (or from one MLP before the blocks,
`relative_position`, that every block adds), and `encoderblock_{i}_row`,
`encoderblock_{i}_column` for Axial-ViT. Later ViTs' options (timm's names) add `reg` (register
tokens, before `cls`), `pre_norm` before the blocks, LayerScale inside them, and `fc_norm`
after `pool` in place of `encoder_norm`.
"""

import math
import re

import keras
from keras import ops

from keras_vit import layers as vit_layers
from keras_vit.layers import resnet
from keras_vit.architecture.execution import Execution, set_execution
from keras_vit.preprocessing import EvalPreprocessing
from keras_vit.architecture.spec import FIELDS, ViTConfig, upgrade_fields
from keras_vit.architecture.variants import _describe


def _dtype_policy(dtype):
    try:
        return keras.dtype_policies.get(dtype or keras.config.dtype_policy())
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"dtype must be None or a Keras dtype policy such as 'float32', 'bfloat16' or "
            f"'mixed_bfloat16', got {dtype!r} ({error}).") from error


def _head_dtype(policy):
    """The head runs in float32 under mixed policies so that outputs are float32."""
    policy = keras.dtype_policies.get(policy)
    return "float32" if policy.compute_dtype != policy.variable_dtype else policy


def _check_images(model, images):
    """Refuses images whose dtype the model would silently misread, before any op runs.

    Keras casts a functional model's inputs to the Input's float32 before any layer sees them,
    so uint8 pixels 0..255 would run as floats 0..255 instead of [-1, 1] and give confident
    wrong answers. Integer (and bool and string) images are therefore refused here, where the
    caller's dtype is still visible. Float images are taken as they are: the model cannot tell
    0..255 floats from [-1, 1] cheaply, so scaling them is the caller's precondition.
    """
    images = keras.tree.flatten(images)
    if len(images) != 1 or not hasattr(images[0], "dtype"):
        return  # nested Python lists and other structures: Keras' own conversion decides
    try:
        dtype = keras.backend.standardize_dtype(images[0].dtype)
    except (ValueError, TypeError, AttributeError):
        dtype = str(images[0].dtype)
    if "float" in dtype:
        check_image_size(model, images[0])
        return
    advice = (" Scale uint8 pixels 0..255 with keras_vit.preprocess_inputs(images), which "
              "returns float32 in [-1, 1]." if "int" in dtype else "")
    raise TypeError(
        f"Model {model.name!r} takes float images scaled to [-1, 1], got images of dtype "
        f"{dtype}.{advice}")


def check_image_size(model, images):
    """Refuses, for a model of any image size without padding, images it cannot cut into
    patches: a side smaller than one patch, or one the pixels per patch do not divide (the
    convolution would silently drop the rest). Sides known only when a TensorFlow graph runs
    (a SavedModel, a `tf.function` of unknown height and width) get an assertion in the graph:
    an INVALID_ARGUMENT error with the same message."""
    spec = getattr(model, "spec", None)
    if (spec is None or not spec.dynamic_image_size or spec.dynamic_image_pad
            or len(getattr(images, "shape", ())) != 4 or keras.backend.is_keras_tensor(images)):
        return
    stride = spec.total_stride
    if None in tuple(images.shape[1:3]) and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        sides = tf.shape(images)[1:3]
        # In a tf.function an assertion runs without a data dependency (automatic control
        # dependencies); XLA never sees it, as its shapes are static.
        tf.debugging.Assert(
            tf.reduce_all(sides % stride == 0),
            [f"Model {model.name!r} takes image sides that are multiples of {stride} pixels "
             "(its patches); got height and width", sides], summarize=4, name="check_sides")
        return
    for side, value in zip(("height", "width"), images.shape[1:3]):
        if not isinstance(value, int):
            continue
        if value < stride:
            raise ValueError(
                f"Model {model.name!r} takes images of at least one patch, {stride}x{stride} "
                f"pixels; got {side} {value} (shape {tuple(images.shape)}). Resize the images "
                f"to at least {stride} pixels, or build the model with dynamic_image_pad=True "
                "to pad images to whole patches.")
        if value % stride:
            below = value // stride * stride
            raise ValueError(
                f"Model {model.name!r} takes image sides that are multiples of {stride} pixels "
                f"(its patches); got {side} {value} (shape {tuple(images.shape)}). Crop or "
                f"resize to {below} or {below + stride}, or build the model with "
                "dynamic_image_pad=True to pad images to a multiple.")


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTModel(keras.Model):
    """The functional `keras.Model` that `vit()` returns, with input checks at the boundary.

    - Images of an integer, bool or string dtype raise a `TypeError` that points at
      `keras_vit.preprocess_inputs` (Keras would silently cast uint8 pixels 0..255 to float
      and the model would run on an input range it was never trained for). Float images must
      be scaled to [-1, 1]; the model cannot tell 0..255 floats apart cheaply and does not try.
    - A batch of 0 images returns an empty `[0, ...]` output (of the model's output shape and
      dtype) from a direct call and from `predict`, without running the layers (TensorFlow's
      CPU convolution mishandles an empty batch).

    The checks are Python checks on static dtypes and shapes: they cost nothing per step once
    traced. Everything else is a plain functional model (`.keras` saving, `clone_model`,
    `keras.Model` APIs). `spec` is the `ViTConfig` it was built from, saved in its config
    (None for a model saved before specs existed). `preprocessing` is the
    `keras_vit.EvalPreprocessing` its weights expect (a checkpoint's resize and crop, set by
    `from_pretrained`; keras_vit's own by default), which `keras_vit.prepare_images` and the
    exported SavedModel apply; saved in its config when not the default.
    """

    def __init__(self, *args, spec=None, preprocessing=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.spec = spec
        self.preprocessing = preprocessing

    @property
    def preprocessing(self):
        return self._preprocessing

    @preprocessing.setter
    def preprocessing(self, value):
        if value is not None and not isinstance(value, EvalPreprocessing):
            raise TypeError(f"preprocessing must be a keras_vit.EvalPreprocessing (or None for "
                            f"keras_vit's own), got {_describe(value)}.")
        self._preprocessing = value or EvalPreprocessing()

    def get_config(self):
        config = super().get_config()
        if self.spec is not None:
            config["vit_spec"] = self.spec.to_dict()
        if self.preprocessing != EvalPreprocessing():  # older files and configs unchanged
            config["vit_preprocessing"] = self.preprocessing.to_dict()
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        spec = config.pop("vit_spec", None)
        preprocessing = config.pop("vit_preprocessing", None)
        model = super().from_config(config, custom_objects=custom_objects)
        model.spec = None if spec is None else ViTConfig.from_dict(spec)
        if preprocessing is not None:
            model.preprocessing = EvalPreprocessing.from_dict(preprocessing)
        return model

    def _empty_output(self, images):
        batch = getattr(images, "shape", None)
        if batch is None or len(batch) == 0 or batch[0] != 0:
            return None
        outputs = self.outputs
        if any(None in tuple(output.shape[1:]) for output in outputs):
            # A model of any image size: the output shapes of these images' size.
            outputs = keras.tree.flatten(self.compute_output_spec(
                keras.KerasTensor((None,) + tuple(batch[1:]), dtype=self.inputs[0].dtype)))
        empty = [ops.zeros((0,) + tuple(output.shape[1:]), dtype=output.dtype)
                 for output in outputs]
        return empty[0] if len(empty) == 1 else empty

    def __call__(self, inputs, *args, **kwargs):
        # Here, not in call(): Keras' own __call__ would wrap the message in a dump of the
        # inputs. Keras' fit, evaluate and predict call the model through it too.
        _check_images(self, inputs)
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs, training=None, mask=None, **kwargs):
        flat = keras.tree.flatten(inputs)
        empty = self._empty_output(flat[0]) if len(flat) == 1 else None
        if empty is not None:
            return empty
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def predict(self, x, *args, **kwargs):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            _check_images(self, x)
            empty = self._empty_output(x)
            if empty is not None:  # Keras' predict loop fails on 0 samples
                return keras.tree.map_structure(keras.ops.convert_to_numpy, empty)
        return super().predict(x, *args, **kwargs)

    # What each weight is to a trainer (timm's `group_matcher` and `no_weight_decay`, keras-hub's
    # `get_layout_map`): the model knows its layers, so optimizers and engines name none.

    def layer_indices(self, variables):
        """The depth of each of `variables` (the model's weights), for layer-wise learning
        rates: 0 for the layers before the first encoder block (patch embedding, ResNet stem,
        tokens, position embeddings), i + 1 for encoder block i (both halves of an Axial block,
        and a position embedding added just before the block), and `num_blocks` + 1 for what
        follows the last block (final norm, pooling, head). Raises ValueError naming a weight
        that is not the model's."""
        layers = self.layers
        blocks = [_block_number(layer.name) for layer in layers]
        first = next((position for position, block in enumerate(blocks) if block is not None),
                     len(layers))
        depth_of, upcoming = {}, self.num_blocks + 1  # after the last block
        for position in reversed(range(len(layers))):
            if blocks[position] is not None:
                upcoming = blocks[position] + 1
            for weight in layers[position].weights:
                depth_of[id(weight)] = 0 if position < first else upcoming
        unknown = [variable.path for variable in variables if id(variable) not in depth_of]
        if unknown:
            raise ValueError(f"Not weights of model {self.name!r}: {', '.join(unknown)}.")
        return [depth_of[id(variable)] for variable in variables]

    @property
    def num_blocks(self):
        """The number of encoder blocks (an Axial block's row and column halves count once)."""
        return len({_block_number(layer.name) for layer in self.layers} - {None})

    @staticmethod
    def decays(variable):
        """Whether weight decay applies to `variable`: kernels of dense and convolutional layers
        only; not biases, norms, position embeddings, tokens, LayerScale factors or the
        attention-pooling probe (big_vision decays `.*/kernel`; timm skips 1-D weights and its
        embeddings and tokens)."""
        return variable.name == "kernel"

    @staticmethod
    def get_layout_map(device_mesh, model_axis="model"):
        """A `keras.distribution.LayoutMap` over `device_mesh` that splits each encoder block's
        two matrix pairs over its `model_axis` Megatron's way: the columns of the first matrix
        of a pair (q, k, v; the MLP's first), the rows of the second (the attention's output;
        the MLP's second), so that a block needs one all-reduce per pair. Every other weight is
        whole on every device."""
        layout = keras.distribution.LayoutMap(device_mesh)
        attention, mlp = ".*MultiHeadDotProductAttention_1", ".*MlpBlock_3"  # as checkpoints
        layout[rf"{attention}/(query|key|value)/kernel"] = (None, model_axis)
        layout[rf"{attention}/(query|key|value)/bias"] = (model_axis,)
        layout[rf"{attention}/out/kernel"] = (model_axis, None)
        layout[rf"{mlp}/(Dense_0|Gate_0)/kernel"] = (None, model_axis)  # Gate_0: SwiGLU's
        layout[rf"{mlp}/(Dense_0|Gate_0)/bias"] = (model_axis,)
        layout[rf"{mlp}/Dense_1/kernel"] = (model_axis, None)
        return layout


def classic_model(model):
    """The keras_vit model whose layers and weights `model` runs: `model` itself, or the
    classic model inside a wrapper that runs its layers another way (`keras_vit.native.NaFlexViT`,
    its `vit`: patches at their images' own grids). The tools that find a model's blocks or
    weights by its layers look there."""
    inner = getattr(model, "vit", None)
    return inner if not isinstance(model, ViTModel) and isinstance(inner, ViTModel) else model


def _block_number(name):
    """i of an encoder block's name (`encoderblock_{i}`, or `encoderblock_{i}_{axis}` for
    Axial-ViT's halves, as `_build` names them); None for other layers."""
    match = re.fullmatch(r"encoderblock_(\d+)(_[a-z]+)?", name)
    return None if match is None else int(match.group(1))


def build(variant="B/16", *, dtype=None, name=None, attention_impl="auto", remat="none",
          **fields):
    """The model of a variant name or a `keras_vit.ViTConfig` with `fields` changed, its
    weights freshly initialised: `keras_vit.vit` without `weights` (its arguments are
    described there). Every argument is checked, and every problem reported at once, before
    any layer is built."""
    fields = upgrade_fields(fields)  # approximate_gelu= from before `activation`
    chosen = Execution(attention_impl=attention_impl, remat=remat)
    unknown = sorted(set(fields) - set(FIELDS) - {"variant"})
    if unknown:
        raise TypeError(f"vit() got unexpected arguments {unknown}; the ViTConfig fields are "
                        f"{list(FIELDS)}.")
    if isinstance(variant, ViTConfig):
        spec = variant.replace(**fields) if fields else variant
    else:
        spec = ViTConfig(variant=variant, **fields)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be None or a string, got {_describe(name)}.")
    policy = _dtype_policy(dtype)
    model = _build(spec, policy, name or spec.default_name)
    return set_execution(model, **chosen.to_dict())


def _build(spec, policy, name):
    """The layers of `spec`, in the order of the original: the stem (pixels to patch tokens),
    the encoder (prefix tokens, position embeddings, blocks), the top (norm, pooling, head)."""
    images = keras.Input(shape=(None, None, 3) if spec.dynamic_image_size
                         else spec.image_size + (3,), name="images")
    x, patch_grid = _stem(spec, images, policy)
    x = _encoder(spec, x, patch_grid, policy)
    if spec.final_norm == "tokens":
        x = vit_layers.make_norm(spec.norm_layer, spec.layer_norm_epsilon, name="encoder_norm",
                                 dtype=policy)(x)
    if spec.distillation_token:  # DeiT's two heads (the spec allows no other classifier)
        return ViTModel(images, _distilled_top(spec, x, _head_dtype(policy)), name=name,
                        spec=spec)
    return ViTModel(images, _top(spec, x, policy), name=name, spec=spec)


def _stem(spec, images, policy):
    """`(tokens, patch grid)`: the images (padded, through a hybrid's ResNet) cut into patch
    tokens; the grid is None but for a model of any image size."""
    x = images
    if spec.dynamic_image_pad:
        x = vit_layers.PadToMultiple(spec.total_stride, name="pad", dtype=policy)(x)
    if spec.is_hybrid:
        numerics = spec.resnet_numerics
        x = resnet.ResNetStem(64, numerics=numerics, name="resnet_root", dtype=policy)(x)
        for index, units in enumerate(spec.resnet_units):
            x = resnet.ResNetStage(units, 64 * 2**index, first_stride=1 if index == 0 else 2,
                                   numerics=numerics, name=f"block{index + 1}",
                                   dtype=policy)(x)
    patch = spec.patch_size
    if spec.conv_stem:  # MobileCLIP's: the patch embedding then steps 2 pixels of its map
        x = vit_layers.ConvStem(patch, spec.hidden_size // 4, name="conv_stem", dtype=policy)(x)
        patch = 2
    dynamic = spec.dynamic_image_size
    x = vit_layers.PatchEmbed(patch, spec.hidden_size, flatten=not dynamic,
                              name="embedding", dtype=policy)(x)
    grid = None
    if dynamic:
        # A model of any image size keeps the patch grid beside the tokens: the layers that
        # need the grid's size (position embeddings, relative and rotary positions, Axial-ViT)
        # read it from there when they run.
        grid = x
        x = keras.layers.Reshape((-1, spec.hidden_size), name="patch_tokens", dtype=policy)(x)
    if spec.patch_norm:  # before the position embeddings (AIMv2's)
        x = vit_layers.make_norm(spec.norm_layer, spec.layer_norm_epsilon, name="patch_norm",
                                 dtype=policy)(x)
    return x, grid


def _encoder(spec, x, patch_grid, policy):
    """The prefix tokens, the position embeddings (at the stem, or before every block) and
    the encoder blocks (Axial-ViT's row and column halves)."""
    grid, prefix = spec.grid_size, spec.num_prefix_tokens
    if spec.num_register_tokens:  # the class token goes before them
        x = vit_layers.RegisterTokens(spec.num_register_tokens, name="reg", dtype=policy)(x)
    if spec.distillation_token:  # the class token goes before it
        x = vit_layers.DistillationToken(name="dist", dtype=policy)(x)
    if spec.class_token:
        x = vit_layers.ClassToken(name="cls", dtype=policy)(x)
    relative = {"relative": "1d", "relative_2d": "2d",
                "relative_mlp": "mlp"}.get(spec.position_embedding)
    grid_input = {} if patch_grid is None else {"grid": patch_grid}

    def position_layer(name):
        kind = "none" if relative else spec.position_embedding
        return vit_layers.AddPositionEmbs(grid, num_prefix_tokens=prefix, kind=kind,
                                          interpolation=spec.position_embedding_interpolation,
                                          embed_prefix=spec.prefix_position_embeddings,
                                          name=name, dtype=policy)

    # The stem's embedding (also the first block's with the every_layer placements) keeps the
    # checkpoints' name; the analysis tools read the token layout from it.
    stem_position = position_layer("posembed_input")
    x = stem_position(x, **grid_input)
    x = keras.layers.Dropout(spec.dropout, name="dropout", dtype=policy)(x)
    if spec.pre_norm:
        x = vit_layers.make_norm(spec.norm_layer, spec.layer_norm_epsilon, name="pre_norm",
                                 dtype=policy)(x)
    shared = {}
    if spec.relative_mlp_shared:  # one MLP's logits for every block (timm's shared_rel_pos)
        relative_mlp = vit_layers.RelativePositionMlp(
            grid, spec.num_heads, prefix, hidden_dim=spec.relative_mlp_dim,
            name="relative_position", dtype=policy)
        shared = {"relative_bias": relative_mlp(x, **grid_input)}
        relative = None  # the blocks have no MLP of their own
    # Only the blocks that need the grid's size get it.
    block_grid = grid_input if relative or spec.rope or spec.axial else {}
    placement = spec.position_embedding_placement
    for index in range(spec.num_layers):
        if index and placement == "every_layer":
            x = position_layer(f"posembed_{index}")(x, **grid_input)
        elif index and placement == "every_layer_shared":
            x = stem_position(x, **grid_input)
        for block in _blocks(spec, index, relative, policy):
            x = block(x, **block_grid, **shared)
    return x


def _blocks(spec, index, relative, policy):
    """Encoder block `index`: one block, or Axial-ViT's row block and column block, each with
    an MLP (appendix D.6)."""
    options = dict(num_heads=spec.num_heads, mlp_dim=spec.mlp_dim, dropout=spec.dropout,
                   attention_dropout=spec.attention_dropout,
                   drop_path_rate=spec.drop_path_rate * index / max(spec.num_layers - 1, 1),
                   activation=spec.activation, layer_norm_epsilon=spec.layer_norm_epsilon,
                   interpolation=spec.position_embedding_interpolation,
                   qkv_bias=spec.qkv_bias, layer_scale_init=spec.layer_scale_init,
                   mlp_inner_norm=spec.mlp_inner_norm,
                   attention_inner_norm=spec.attention_inner_norm,
                   residual_post_norm=spec.residual_post_norm, norm_layer=spec.norm_layer,
                   qk_norm=spec.qk_norm,
                   num_kv_heads=(None if spec.num_kv_heads is None else spec.kv_heads(index)),
                   proj_bias=spec.proj_bias,
                   differential_lambda_init=differential_lambda_init(index) if spec.differential
                   else None,
                   parallel=spec.parallel_blocks, dtype=policy)
    if spec.axial:
        return [vit_layers.AxialEncoderBlock(axis, spec.grid_size,
                                             name=f"encoderblock_{index}_{axis}", **options)
                for axis in vit_layers.AXES]
    return [vit_layers.EncoderBlock(
        relative_position=relative, grid_size=spec.grid_size if relative or spec.rope else None,
        num_prefix_tokens=spec.num_prefix_tokens, rope=spec.rope,
        rope_temperature=spec.rope_temperature, rope_reference_grid=spec.rope_reference_grid,
        rope_grid_offset=spec.rope_grid_offset, relative_mlp_dim=spec.relative_mlp_dim,
        name=f"encoderblock_{index}", **options)]


def differential_lambda_init(index):
    """Differential attention's lambda_init in block `index` (from 0): 0.8 - 0.6 exp(-0.3 l)
    of layer l (Ye et al., "Differential Transformer", 2024, section 2.1; timm's
    `DiffAttention.set_lambda_init(depth)` with the block's index)."""
    return 0.8 - 0.6 * math.exp(-0.3 * index)


def _top(spec, x, policy):
    """The pooled representation (class token, mean, attention pooling), its norm and
    pre-logits, and the head."""
    head_dtype = _head_dtype(policy)
    if spec.classifier == "map":  # big_vision's name for it
        x = vit_layers.AttentionPooling(
            spec.map_num_heads or spec.num_heads,
            spec.mlp_dim if spec.map_mlp_dim is None else spec.map_mlp_dim,  # 0: no MLP
            num_prefix_tokens=0 if spec.map_include_prefix else spec.num_prefix_tokens,
            layer_norm_epsilon=spec.layer_norm_epsilon, activation=spec.activation,
            norm_layer=spec.norm_layer, name="MAPHead_0", dtype=policy)(x)
    else:
        x = vit_layers.TokenPooling(spec.classifier, num_prefix_tokens=spec.num_prefix_tokens,
                                    name="pool", dtype=head_dtype)(x)
    if spec.final_norm == "pooled":
        x = vit_layers.make_norm(spec.norm_layer, spec.layer_norm_epsilon, name="fc_norm",
                                 dtype=head_dtype)(x)
    if spec.representation_size is not None:
        x = keras.layers.Dense(spec.representation_size, activation="tanh", name="pre_logits",
                               kernel_initializer="lecun_normal", dtype=head_dtype)(x)
    if spec.include_top:
        x = keras.layers.Dense(spec.num_classes, name="head", kernel_initializer="zeros",
                               dtype=head_dtype)(x)
    return x


def _distilled_top(spec, tokens, dtype):
    """DeiT's two heads, on the class token (`head`) and on the distillation token
    (`head_dist`), and the mean of their logits; without a head, the mean of the two tokens
    (as timm's `VisionTransformerDistilled`)."""
    pooled = [vit_layers.TokenPooling("token", token_index=index, name=name, dtype=dtype)(tokens)
              for index, name in ((0, "pool"), (1, "pool_dist"))]
    if spec.include_top:
        pooled = [keras.layers.Dense(spec.num_classes, name=name, kernel_initializer="zeros",
                                     dtype=dtype)(token)
                  for token, name in zip(pooled, ("head", "head_dist"))]
    return keras.layers.Average(name="head_mean", dtype=dtype)(pooled)


def distillation_heads(model):
    """For a model with DeiT's distillation token (`distillation_token=True`), a functional
    model of the same weights that maps images to `(class_logits, distillation_logits)`: the
    logits of `head` and `head_dist`, which the model itself averages. A distilling run trains
    the first on the labels and the second on the teacher (DeiT, section 5.1)."""
    spec = getattr(model, "spec", None)
    if spec is None or not spec.distillation_token or not spec.include_top:
        raise ValueError(f"Model {model.name!r} has no distillation head: build it with "
                         "distillation_token=True (and a head).")
    return keras.Model(model.input, [model.get_layer("head").output,
                                      model.get_layer("head_dist").output],
                       name=f"{model.name}_heads")
