"""The tf.distribute engine (`TFEngine`, train.run.engine's contract): model, optimizer, steps
on the devices, evaluation, checkpoints. train.run.loop decides when each happens; what a step
computes is train.run.step_math's; this module does it on TensorFlow.

What is trained, and its loss, is the config's objective (train.run.objectives): classification, or
masked patch prediction.

One host call runs `steps_per_loop` steps inside a `tf.function` (the TPU idiom). Each step
all-reduces the gradients once, clips their global norm, and applies them; evaluation covers the
whole eval split exactly once. Checkpoints (model, optimizer, EMA, step) go to
`workdir/checkpoints` every `checkpoint_every_steps`, at the end, and on SIGTERM; rerunning the
same command resumes from the newest readable one.

Several workers run the same code. Every worker takes part in each save (non-chief workers write
to a local temporary directory that is removed again); only the chief writes into the workdir:
checkpoints, `metrics.jsonl`, TensorBoard, `config.json` and the export.
"""

import contextlib
import functools
import os
import tempfile

import keras
import tensorflow as tf
from absl import logging

from ..data import input_plan, settings, tf_pipeline
from ..run import config_checks, objectives, optimizers, run_files, step_math
from ..run import starting_point
from ..run.engine import Engine
from ..run.optimizers import build_optimizer
from . import tf_checkpoints, tf_fused_updates
from .preemption import PreemptionWatcher
from .tf_strategy import is_chief, is_tpu


def check_config(config, num_replicas):
    """Rejects values that would fail later (or train nonsense), naming each bad field, its
    value and the valid range: every field of configs/common.py (train.run.config_checks), that
    the batches split evenly over `num_replicas`, and the JAX engine's own options."""
    config_checks.check(config, num_replicas)
    if config.fsdp:
        raise ValueError("config.fsdp=True splits the weights over the devices of the JAX "
                         "engine (KERAS_BACKEND=jax); tf.distribute keeps a whole copy on every "
                         "replica. Run on JAX, or set it to False.")
    if config.model_parallel != 1:
        raise ValueError(f"config.model_parallel={config.model_parallel} splits the blocks' "
                         "matrices over devices on the JAX engine (KERAS_BACKEND=jax); "
                         "tf.distribute's strategies here are data-parallel, a whole copy of "
                         "every weight on every replica. Run on JAX, or set it to 1.")


def update_compiled(config, strategy):
    """Whether XLA compiles the optimizer's update: on TPUs, and with config.jit_compile on
    one replica (`_make_train_loop`); elsewhere it runs op by op."""
    return is_tpu(strategy) or (config.jit_compile and strategy.num_replicas_in_sync == 1)


class TFEngine(Engine):
    """The training state on a tf.distribute strategy and the compiled functions that advance
    it."""

    def __init__(self, config, workdir, strategy, start=None):
        check_config(config, strategy.num_replicas_in_sync)
        self.config, self.workdir, self.strategy = config, workdir, strategy
        keras.utils.set_random_seed(input_plan.global_seed(config))
        self.input_dtype = (tf.bfloat16 if is_tpu(strategy) and "bfloat16" in config.dtype_policy
                            else tf.float32)
        inputs = config_checks.section(config, settings.FIELDS)  # what the input reads
        self.builder = builder = tf_pipeline.get_builder(inputs)
        self.class_names = input_plan.class_names(builder.info.features["label"])
        self.num_classes = len(self.class_names)
        self.objective = objectives.make(config, self.num_classes)
        with strategy.scope():
            self.model = self.objective.build()
            self.optimizer = build_optimizer(
                config_checks.section(config, optimizers.FIELDS), self.model,
                fused_adam=None if update_compiled(config, strategy)
                else tf_fused_updates.adam_update)
            self.optimizer.build(self.model.trainable_variables)
            self.ema = [tf.Variable(v, trainable=False, name="ema",
                                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                        for v in self.model.trainable_variables] if config.ema_decay else []
        self.is_chief = is_chief(strategy)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                              ema=self.ema)
        self.checkpoint_dir = run_files.checkpoint_dir(workdir)
        restored = tf_checkpoints.restore_newest(self.checkpoint, self.checkpoint_dir,
                                                 writable=self.is_chief)
        if restored is not None:
            logging.info("Resumed from %s at step %d.",
                         os.path.join(self.checkpoint_dir, f"ckpt-{restored}"), self.step)
        elif config.pretrained:  # what the run starts from (train.run.starting_point.resolve)
            (start or starting_point.StartingPoint(config.pretrained)).load(
                self.objective, self.model, config)
        self._check_workers_agree(restored)
        self.saved_step = restored
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.checkpoint_dir,
                                                  max_to_keep=config.keep_checkpoints)
        self.data = tf_pipeline.get_datasets(inputs, strategy, start_step=self.step,
                                                dtype=self.input_dtype, builder=builder,
                                                num_patches=self.objective.num_patches,
                                                native=self.objective.native)
        self.eval_examples = self.data.eval_examples
        self.train_loop = self._make_train_loop()
        self.eval_step = self._make_eval_step()
        self._train_iterator = iter(self.data.train)

    def _check_workers_agree(self, restored):
        """Every worker must resume from the same step; a worker that could not read the
        checkpoint the chief read would otherwise hang the cluster."""
        if not isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return
        strategy = self.strategy

        @tf.function
        def every_workers_step(step):
            return strategy.gather(strategy.run(lambda: tf.reshape(step, [1])), axis=0)

        steps = every_workers_step(tf.constant(self.step, tf.int64)).numpy()
        low, high = int(steps.min()), int(steps.max())
        if low != high:
            raise RuntimeError(f"Workers resumed from different steps ({low} to {high}, this "
                               f"one from {restored}): they must all read {self.checkpoint_dir}.")

    @property
    def step(self):
        return int(self.optimizer.iterations.numpy())

    def _replica_gradients(self, batch):
        """This replica's gradients of its summed weighted losses, the sum and its weight."""
        config, model = self.config, self.model
        variables = model.trainable_variables
        # From the config, not the batch: multi-worker datasets have no static batch size.
        micro = config.batch_size // self.strategy.num_replicas_in_sync // config.accum_steps

        def gradients_of(part):
            with tf.GradientTape() as tape:
                loss_sum, count = step_math.loss_sums(
                    self.objective, model, {name: value[part] for name, value in batch.items()})
            return tape.gradient(loss_sum, variables), loss_sum, count

        return step_math.accumulate([slice(index * micro, (index + 1) * micro)
                                     for index in range(config.accum_steps)], gradients_of)

    def _replica_train_step(self, batch, gradients):
        """One optimizer step on this replica's `batch`; `gradients` is `_replica_gradients`,
        compiled by XLA or not."""
        config, variables = self.config, self.model.trainable_variables
        grads, loss_sum, count = gradients(batch)
        # Sums over the global batch, then the mean: the gradient of the global mean loss,
        # whatever the replicas' shares of the weighted items (corrupted patches vary).
        context = tf.distribute.get_replica_context()
        *grads, loss_sum, count = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                                     grads + [loss_sum, count])
        # Keras' optimizer sums gradients over replicas again: it gets each replica's share of
        # the already reduced (and clipped) gradient, so that sum is the gradient itself.
        grads, grad_norm = step_math.clipped_mean(grads, count, config.grad_clip_norm,
                                                  shares=self.strategy.num_replicas_in_sync)
        self.optimizer.apply(grads, variables)
        averages = step_math.moving_averages(self.ema, variables, config.ema_decay)
        for average, new in zip(self.ema, averages):
            average.assign(new)
        return loss_sum / count, grad_norm

    def _make_train_loop(self):
        strategy, config = self.strategy, self.config
        xla = config.jit_compile and not is_tpu(strategy)  # (on TPU, XLA compiles everything)
        several = strategy.num_replicas_in_sync > 1
        gradients = self._replica_gradients
        if xla and several:  # XLA cannot compile the all-reduce here: each replica's passes
            gradients = tf.function(gradients, jit_compile=True)
        replica_step = functools.partial(self._replica_train_step, gradients=gradients)
        if xla and not several:  # the whole step: the update fuses too
            replica_step = tf.function(replica_step, jit_compile=True)

        @tf.function
        def train_loop(iterator, steps):
            loss_sum = tf.constant(0.0)
            grad_norm = tf.constant(0.0)
            for _ in tf.range(steps):
                loss, grad_norm = strategy.run(replica_step, args=(next(iterator),))
                # Every replica holds the global mean loss already.
                loss_sum += strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)
                grad_norm = strategy.reduce(tf.distribute.ReduceOp.MEAN, grad_norm, axis=None)
            return loss_sum / tf.cast(steps, tf.float32), grad_norm

        return train_loop

    def _make_eval_step(self):
        strategy, model, objective = self.strategy, self.model, self.objective

        @tf.function
        def eval_step(batch):
            results = strategy.run(lambda batch: step_math.eval_sums(objective, model, batch),
                                   args=(batch,))
            return [strategy.reduce(tf.distribute.ReduceOp.SUM, r, axis=None) for r in results]

        return eval_step

    def train_steps(self, steps):
        """Runs `steps` optimizer steps in one host call; the mean loss and the last gradient
        norm."""
        loss, grad_norm = self.train_loop(self._train_iterator, tf.constant(steps))
        return float(loss), float(grad_norm)

    def learning_rate(self):
        return float(self.optimizer.learning_rate)

    def swap_ema(self):
        """Exchanges the model's weights and their moving averages (call twice to undo)."""
        for average, variable in zip(self.ema, self.model.trainable_variables):
            current = tf.identity(variable)
            variable.assign(average)
            average.assign(current)

    @contextlib.contextmanager
    def exported_weights(self):
        """The model, holding its EMA weights (if enabled) while the block runs."""
        if self.ema:
            self.swap_ema()
        try:
            yield self.model
        finally:
            if self.ema:
                self.swap_ema()

    def evaluate(self):
        """Top-1 accuracy (None for a target without classes) and mean loss over the whole
        eval split (EMA weights if enabled): of the examples, or of their corrupted patches."""
        if self.ema:
            self.swap_ema()
        try:
            return step_math.eval_results((self.eval_step(batch) for batch in self.data.eval),
                                     self.eval_examples, self.objective.has_accuracy)
        finally:
            if self.ema:
                self.swap_ema()

    def save(self):
        """Saves a checkpoint at the current step (on every worker; see the module doc)."""
        step = self.step
        if step == self.saved_step:
            return  # the same decision on every worker: they all save, or none does
        if self.is_chief:
            tf_checkpoints.save(self.manager, step)
        else:  # into a local directory of its own, removed again
            with tempfile.TemporaryDirectory(prefix="keras_vit_ckpt_") as directory:
                tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=1).save(
                    checkpoint_number=step)
        self.saved_step = step

    def preemption_watcher(self, save):
        return PreemptionWatcher(self.strategy, save)

    def close(self):
        """Nothing to release: tf.data and the checkpoint manager end with the process."""


def train_and_evaluate(config, workdir, strategy, start=None):
    """Trains (or resumes) per `config` in `workdir` from `start` (train.run.starting_point;
    None: `config.pretrained` as it is) and exports at the end if asked.

    Raises `run_config.ConfigMismatchError` before anything is written when `workdir` holds a
    run with another config, and `train.engines.preemption.Stopped` when stopped by SIGTERM.
    """
    from ..run import loop

    metrics = loop.train_and_evaluate(
        lambda config: TFEngine(config, workdir, strategy, start), config, workdir)
    _wait_for_every_worker(strategy)
    return metrics


def _wait_for_every_worker(strategy):
    """Returns once every worker got here: a worker that exits while the chief still exports
    makes the chief's runtime log that a task crashed."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        tf.function(lambda: strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None))()
