"""The tf.distribute engine: model, optimizer, steps on the devices, evaluation, checkpoints.
train.loop decides when each happens; this module does it on TensorFlow.

What is trained, and its loss, is the config's objective (train.objectives): classification, or
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

import keras_vit

from . import (config_checks, input_pipeline, input_plan, loop, objectives, run_files,
               tf_checkpoints)
from .optimizers import build_optimizer
from .preemption import PreemptionWatcher
from .strategy import is_chief, is_tpu


def check_config(config, num_replicas):
    """Rejects values that would fail later (or train nonsense), naming each bad field, its
    value and the valid range: every field of configs/common.py (train.config_checks), and that
    the batches split evenly over `num_replicas`."""
    config_checks.check(config, num_replicas)


class Trainer:
    """Holds the training state and the compiled step functions: train.loop's engine on
    tf.distribute."""

    def __init__(self, config, workdir, strategy):
        check_config(config, strategy.num_replicas_in_sync)
        self.config, self.workdir, self.strategy = config, workdir, strategy
        keras.utils.set_random_seed(input_plan.global_seed(config))
        self.input_dtype = (tf.bfloat16 if is_tpu(strategy) and "bfloat16" in config.dtype_policy
                            else tf.float32)
        self.builder = builder = input_pipeline.get_builder(config)
        self.class_names = input_plan.class_names(builder.info.features["label"])
        self.num_classes = len(self.class_names)
        self.objective = objectives.make(config, self.num_classes)
        with strategy.scope():
            self.model = self.objective.build()
            self.optimizer = build_optimizer(config)
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
        elif config.pretrained:
            path = keras_vit.pretrained.resolve_weights(config.pretrained,
                                                       config.model.variant)
            report = keras_vit.checkpoint.load_npz(self.objective.encoder(self.model), path)
            logging.info("Initialised from %s (%d weights, resized: %s, new head: %s).", path,
                         len(report["loaded"]), report["resized"], report["new_head"])
        self._check_workers_agree(restored)
        self.saved_step = restored
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.checkpoint_dir,
                                                  max_to_keep=config.keep_checkpoints)
        self.data = input_pipeline.get_datasets(config, strategy, start_step=self.step,
                                                dtype=self.input_dtype, builder=builder,
                                                num_patches=self.objective.num_patches)
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
        grads = None
        loss_sum = count = tf.constant(0.0)
        for index in range(config.accum_steps):  # static: unrolled micro-batches
            part = slice(index * micro, (index + 1) * micro)
            with tf.GradientTape() as tape:
                losses, weights, _ = self.objective.item_losses(
                    model, {name: value[part] for name, value in batch.items()}, training=True)
                micro_loss = tf.reduce_sum(losses * weights)
            micro_grads = tape.gradient(micro_loss, variables)
            grads = micro_grads if grads is None else [
                g + d for g, d in zip(grads, micro_grads)]
            loss_sum += micro_loss
            count += tf.reduce_sum(weights)
        return grads, loss_sum, count

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
        # The mean, the clipping and each replica's share in one factor: one pass over the
        # gradients instead of three (each pass reads and writes every weight's gradient).
        grad_norm = tf.linalg.global_norm(grads) / count  # of the mean gradient
        # Keras' optimizer sums gradients over replicas again; give it each replica's share of
        # the already reduced (and clipped) gradient so that sum is the gradient itself.
        scale = 1.0 / (count * self.strategy.num_replicas_in_sync)
        if config.grad_clip_norm:  # as tf.clip_by_global_norm: shrink only when above
            scale *= tf.minimum(1.0, config.grad_clip_norm / grad_norm)
        self.optimizer.apply([g * scale for g in grads], variables)
        for average, variable in zip(self.ema, variables):
            average.assign(config.ema_decay * average + (1.0 - config.ema_decay) * variable)
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

        def replica_eval(batch):
            losses, weights, correct = objective.item_losses(model, batch, training=False)
            mask = batch["mask"]  # 0 for padding examples
            weights = weights * tf.reshape(mask, [-1] + [1] * (len(weights.shape) - 1))
            correct = tf.zeros_like(losses) if correct is None else correct
            return (tf.reduce_sum(correct * weights), tf.reduce_sum(losses * weights),
                    tf.reduce_sum(weights), tf.reduce_sum(mask))

        @tf.function
        def eval_step(batch):
            results = strategy.run(replica_eval, args=(batch,))
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
            return loop.eval_results((self.eval_step(batch) for batch in self.data.eval),
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


def train_and_evaluate(config, workdir, strategy):
    """Trains (or resumes) per `config` in `workdir` and exports at the end if asked.

    Raises `run_config.ConfigMismatchError` before anything is written when `workdir` holds a
    run with another config, and `train.preemption.Stopped` when stopped by SIGTERM.
    """
    metrics = loop.train_and_evaluate(lambda: Trainer(config, workdir, strategy), config,
                                      workdir)
    _wait_for_every_worker(strategy)
    return metrics


def _wait_for_every_worker(strategy):
    """Returns once every worker got here: a worker that exits while the chief still exports
    makes the chief's runtime log that a task crashed."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        tf.function(lambda: strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None))()
