"""The JAX engine's devices: a mesh of a batch axis and a model axis, and where each weight lies
on it (Keras' distribution API)."""

import jax
import keras

from keras_vit.model import ViTModel

BATCH_AXIS, MODEL_AXIS = "batch", "model"


def make_distribution(model_parallel=1, devices=None, fsdp=False):
    """Keras' distribution over `devices` (default: every device of every process): a mesh of
    a batch axis and a model axis of `model_parallel` devices, with the weights split over the
    model axis as the model's layout map says and, with `fsdp`, over the batch axis too."""
    devices = jax.devices() if devices is None else devices
    if len(devices) % model_parallel:
        raise ValueError(f"config.model_parallel={model_parallel} must divide the "
                         f"{len(devices)} devices (the batch axis takes the rest).")
    if model_parallel == 1 and not fsdp:  # (Keras' DataParallel takes a mesh of one axis)
        mesh = keras.distribution.DeviceMesh((len(devices),), [BATCH_AXIS], devices)
        return keras.distribution.DataParallel(device_mesh=mesh)
    shape = (len(devices) // model_parallel, model_parallel)
    mesh = keras.distribution.DeviceMesh(shape, [BATCH_AXIS, MODEL_AXIS], devices)
    layout = ViTModel.get_layout_map(mesh, model_axis=MODEL_AXIS)
    kind = FullyShardedParallel if fsdp else keras.distribution.ModelParallel
    return kind(layout_map=layout, batch_dim_name=BATCH_AXIS)


class FullyShardedParallel(keras.distribution.ModelParallel):
    """Keras' `ModelParallel` with fully sharded data parallelism (FSDP, ZeRO stage 3): each
    weight is also split over the batch axis, along its largest dimension that the batch axis
    divides and the model axis does not already split; a weight with no such dimension stays
    whole on every device. The optimizer's moments take their weights' layouts (Keras gives
    them), so a device holds about 1/N of the weights and of the optimizer's state. XLA
    gathers each weight where a step uses it and scatters its gradient. Keras' `LayoutMap`
    maps name patterns to fixed layouts, and FSDP needs each weight's shape: hence this rule,
    which big_vision's `fsdp` sharding rule also follows."""

    def get_variable_layout(self, variable):
        layout = super().get_variable_layout(variable)
        if BATCH_AXIS in layout.axes:  # laid out already (an optimizer slot takes its weight's)
            return layout
        mesh = self.device_mesh
        devices = dict(zip(mesh.axis_names, mesh.shape))
        # A dimension mapped to an axis of one device is not split: it is free.
        axes = [None if axis is None or devices[axis] == 1 else axis for axis in layout.axes]
        shape, batch = tuple(variable.shape), devices[BATCH_AXIS]
        free = [dim for dim, size in enumerate(shape) if axes[dim] is None and size % batch == 0]
        if batch > 1 and free:
            axes[max(free, key=lambda dim: shape[dim])] = BATCH_AXIS
        return keras.distribution.TensorLayout(axes, mesh)
