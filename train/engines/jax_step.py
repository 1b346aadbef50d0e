"""The JAX engine's training step, apart from the run around it (input, checkpoints, signals:
train.engines.jax_engine): the model and its optimizer under a distribution, their state as
plain arrays, and the jitted functions that advance it. The memory and accelerator benchmarks
compile this same step.

A step is one `jax.jit` function of the whole state (weights, optimizer, EMA): the loss of the
global batch through `keras.StatelessScope` (the objective is the one the TensorFlow engine
uses, in `keras.ops`), its gradient summed over micro-batches, clipping and the update, as
train.run.step_math computes them. XLA's partitioner places the collectives; nothing here names
a device.
"""

import contextlib
import os

import jax
import keras

from keras_vit.scanned_blocks import ScannedBlocks

from ..data import input_plan
from ..run import config_checks, objectives, optimizers, step_math
from ..run.model_config import model_spec
from ..run.optimizers import build_optimizer
from . import jax_cpu_settings
from .jax_mesh import BATCH_AXIS


class JaxStep:
    """The model of `config` for `num_classes`, its optimizer, and the compiled step, under
    `distribution` (train.engines.jax_mesh.make_distribution).

    `state`: {"trainable", "non_trainable", "optimizer", "ema"}, lists of arrays in the order of
    the Keras variables they stand for; `train_step(state, batch) -> (state, (loss, gradient
    norm))` donates the state it is given; `eval_step(state, batch) -> the sums of
    train.run.step_math.eval_sums`.
    """

    def __init__(self, config, num_classes, distribution, abstract=False):
        self.config, self.distribution = config, distribution
        keras.distribution.set_distribution(distribution)
        keras.utils.set_random_seed(input_plan.global_seed(config))
        self.mesh = distribution.device_mesh.backend_mesh
        self.batch_devices = distribution.device_mesh.shape[0]
        self.objective = objectives.make(config, num_classes)
        self.abstract = abstract
        # Abstract: the variables get shapes and layouts but no values (Keras defers their
        # initialisation inside a stateless scope), so that XLA can plan the step of a model
        # this machine could not hold.
        scope = (lambda: keras.StatelessScope(initialize_variables=False)) if abstract else (
            contextlib.nullcontext)
        with scope():
            self.model = self.objective.build()
        # (Its step counter is made outside: a stateless scope takes no constant variable.)
        self.optimizer = build_optimizer(config_checks.section(config, optimizers.FIELDS),
                                         self.model)
        with scope():
            if abstract:  # the layouts the slots copy, which initialisation would set
                for variable in self.model.trainable_variables:
                    variable._initialize_layout()
            self.optimizer.build(self.model.trainable_variables)
        self.batch_sharding = jax.sharding.NamedSharding(self.mesh,
                                                         jax.sharding.PartitionSpec(BATCH_AXIS))
        # With remat, blocks that are alike run as one checkpointed loop (None: as they are).
        self.scanned_chain = ScannedBlocks.chain_of(self.model)
        self.state = self.initial_state()
        # The state keeps its layout from step to step (one compilation, donated buffers reused).
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        # On CPU: which kernels XLA takes from YNNPACK suits the model (a hybrid's stem or not).
        self.compile_options = jax_cpu_settings.compile_options(
            os.environ, self.mesh.devices.flat[0].platform,
            model_spec(config, num_classes).is_hybrid)
        self.train_step = jax.jit(
            self._step, donate_argnums=0,
            out_shardings=(jax.tree.map(lambda array: array.sharding, self.state),
                           (replicated, replicated)),
            compiler_options=self.compile_options)
        self.eval_step = jax.jit(self._eval_sums, compiler_options=self.compile_options)

    def initial_state(self):
        """The model's and the optimizer's variables as they are now, as a state (abstract:
        their shapes, dtypes and layouts)."""
        trainable = [self._value(v) for v in self.model.trainable_variables]
        state = {
            "trainable": trainable,
            "non_trainable": [self._value(v) for v in self.model.non_trainable_variables],
            "optimizer": [self._value(v) for v in self.optimizer.variables],
            "ema": list(trainable) if self.config.ema_decay else [],
        }
        # Arrays Keras left without a layout (on one device, or the optimizer's counters)
        # replicated over the mesh, as the step returns them: the step then compiles once,
        # not again on its second call.
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        return jax.tree.map(
            lambda array: array if isinstance(array.sharding, jax.sharding.NamedSharding)
            else jax.device_put(array, replicated), state)

    def _value(self, variable):
        if variable._value is not None or not self.abstract:  # (an abstract optimizer's
            return variable.value                              # counters have values)
        layout = self.distribution.get_variable_layout(variable)
        return jax.ShapeDtypeStruct(variable.shape, variable.dtype,
                                    sharding=layout.backend_layout)

    def batch_spec(self, batch_size, image_size):
        """The shapes of a global batch of `batch_size` images, laid out over the batch axis:
        what the step compiles for without data (`self.train_step.lower(state, spec)`)."""
        def spec(shape, dtype):
            return jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding)

        return {name: spec(shape, dtype) for name, (shape, dtype)
                in self.objective.batch_shapes(batch_size, image_size).items()}

    def _stateless(self, compute, trainable, non_trainable, batch):
        """`compute(objective, model, batch)` (of train.run.step_math) with the given weights,
        and the non-trainable variables' new values (the dropout seed's state)."""
        model = runner = self.model
        mapping = (list(zip(model.trainable_variables, trainable))
                   + list(zip(model.non_trainable_variables, non_trainable)))
        # (Nothing to initialise on leaving it: an abstract model's variables stay shapes.)
        with keras.StatelessScope(state_mapping=mapping, initialize_variables=False) as scope:
            if self.scanned_chain is not None:
                runner = ScannedBlocks(model, self.scanned_chain, trainable, non_trainable)
            results = compute(self.objective, runner, batch)
        updated = [scope.get_current_value(variable) for variable in
                   model.non_trainable_variables]
        if runner is not model:  # the blocks' seed states, updated inside the loop
            updated = [runner.updated.get(id(variable), new)
                       for variable, new in zip(model.non_trainable_variables, updated)]
        updated = [old if new is None else new for old, new in zip(non_trainable, updated)]
        return results, updated

    def _step(self, state, batch):
        config = self.config
        non_trainable = state["non_trainable"]

        def micro_loss(trainable, non_trainable, micro):
            results, non_trainable = self._stateless(
                step_math.loss_sums, trainable, non_trainable, micro)
            loss_sum, count = results
            return loss_sum, (count, non_trainable)

        gradient = jax.value_and_grad(micro_loss, has_aux=True)

        def gradients_of(micro):
            nonlocal non_trainable  # the dropout seed's state, threaded through the batches
            (loss_sum, (count, non_trainable)), grads = gradient(
                state["trainable"], non_trainable, micro)
            return grads, loss_sum, count

        grads, loss_sum, count = step_math.accumulate(
            _micro_batches(batch, config.accum_steps, self.batch_devices), gradients_of)
        grads, grad_norm = step_math.clipped_mean(grads, count, config.grad_clip_norm)
        trainable, optimizer = self.optimizer.stateless_apply(state["optimizer"], grads,
                                                              state["trainable"])
        new_state = {"trainable": trainable, "non_trainable": non_trainable,
                     "optimizer": optimizer,
                     "ema": step_math.moving_averages(state["ema"], trainable, config.ema_decay)}
        return new_state, (loss_sum / count, grad_norm)

    def _eval_sums(self, state, batch):
        weights_key = "ema" if self.config.ema_decay else "trainable"
        sums, _ = self._stateless(step_math.eval_sums, state[weights_key],
                                  state["non_trainable"], batch)
        return sums


def _micro_batches(batch, accum_steps, batch_devices):
    """The global batch as `accum_steps` micro-batches, each made of every device's next slice
    of its own share (as each TensorFlow replica splits its share), so no example moves."""
    if accum_steps == 1:
        return [batch]
    micro = []
    for index in range(accum_steps):
        part = {}
        for name, value in batch.items():
            shares = value.reshape((batch_devices, accum_steps, -1) + value.shape[1:])
            part[name] = shares[:, index].reshape((-1,) + value.shape[1:])
        micro.append(part)
    return micro
