"""What the loop (train.run.loop) asks of an engine: the contract the TensorFlow engine
(train.engines.tf_engine, tf.distribute) and the JAX engine (train.engines.jax_engine, Keras'
JAX backend) each fulfil. What a step computes is train.run.step_math's; an engine places it on its
devices, compiles it, feeds it and saves what it holds.

Every process of a run runs the same loop, so all take the same decisions at the same steps
(the engines' collectives require it); only the chief writes the shared files.
"""

import abc

from keras_vit.architecture.execution import ATTENTION_IMPLS, REMAT

# The config fields of how an engine runs the steps, and their rules (as train.run.config_checks
# reads them); `check` adds what the devices and the checkpoint need of them.
RULES = {
    "accum_steps": ("int", (1, None)),
    "grad_clip_norm": ("float", (0.0, None, False)),
    "ema_decay": ("float", (0.0, 1.0, False)),
    "jit_compile": ("bool", None),
    "model_parallel": ("int", (1, None)),
    "fsdp": ("bool", None),
    "keep_checkpoints": ("int", (1, None)),
    # How the model runs (keras_vit.architecture.execution): recorded in the run's config.json, not
    # in the model's files.
    "attention_impl": ("choice", ATTENTION_IMPLS),
    "remat": ("choice", REMAT),
}


def check(config, report, num_replicas=None):
    """Adds to `report` (train.run.config_checks) what is wrong with the batches on
    `num_replicas` replicas (None: not known yet)."""
    if (report.ok("attention_impl") and config.attention_impl == "fused" and "model" in config
            and config.model.get("attention_dropout")):
        report.add("attention_impl", f"config.attention_impl={config.attention_impl!r}",
                   "never forms the attention weights that config.model.attention_dropout="
                   f"{config.model.attention_dropout} would drop: use 'auto' (explicit in "
                   "training, fused otherwise) or 'explicit'")
    for field in ("batch_size", "eval_batch_size"):
        if report.ok(field) and num_replicas and config[field] % num_replicas:
            report.add(field, f"config.{field}={config[field]}",
                       f"must be divisible by the {num_replicas} replicas (each gets an equal "
                       "share)")
    if report.ok("batch_size", "accum_steps"):
        per_replica = config.batch_size // (num_replicas or 1)
        if per_replica % config.accum_steps:
            where = (f"the per-replica batch {per_replica} (batch_size {config.batch_size} over "
                     f"{num_replicas} replicas)" if num_replicas and num_replicas > 1
                     else f"config.batch_size={config.batch_size}")
            report.add("accum_steps", f"config.accum_steps={config.accum_steps}",
                       f"must divide {where} into equal micro-batches")


class Engine(abc.ABC):
    """The state of one run on some devices and the compiled work that advances it.

    Attributes an engine sets: `config` and `workdir` (as given), `objective` (train.run.
    objectives), `class_names` (of the dataset, in label order), `eval_examples` (in the eval
    split) and `is_chief` (whether this process writes the run's files).
    """

    config = workdir = objective = class_names = eval_examples = is_chief = None

    @property
    @abc.abstractmethod
    def step(self):
        """Optimizer steps done (restored ones included)."""

    @abc.abstractmethod
    def train_steps(self, steps):
        """Runs `steps` optimizer steps; returns `(mean loss, last gradient norm)` as floats."""

    @abc.abstractmethod
    def learning_rate(self):
        """The learning rate at the current step, as a float."""

    @abc.abstractmethod
    def evaluate(self):
        """`(accuracy or None, mean loss)` over the whole eval split, once (EMA weights where
        the run keeps them): `train.run.step_math.eval_results` of `eval_sums`."""

    @abc.abstractmethod
    def save(self):
        """Saves a checkpoint at the current step (every process takes part; none twice)."""

    @abc.abstractmethod
    def preemption_watcher(self, save):
        """An object whose `check()`, called by every process at the same point of the loop,
        calls `save` and raises `train.run.loop.Stopped` once SIGTERM reached any process, and
        whose `close()` restores the signal handling."""

    @abc.abstractmethod
    def exported_weights(self):
        """A context manager giving a Keras model that holds the weights to export (the EMA
        where the run keeps one); every process enters it."""

    def close(self):
        """Releases what the engine holds beyond the process (input workers, threads)."""
