"""Trains or fine-tunes a ViT from the command line, on TensorFlow (tf.distribute) or, with
KERAS_BACKEND=jax, on JAX (train.engines.jax_engine); the same configs, workdir and exit codes.

    python -m train.main --config=configs/quickstart.py --workdir=/tmp/vit_quickstart
    python -m train.main --config=configs/finetune.py:model=B/16,dataset=cifar10 \
        --config.pretrained=imagenet21k --workdir=gs://bucket/run --strategy=tpu --tpu=local
    KERAS_BACKEND=jax python -m train.main --config=configs/quickstart.py --workdir=/tmp/vq

Rerunning the same command resumes from the newest checkpoint in the workdir. Exit status: 0
when the run finished; 75 when it was stopped by SIGTERM after saving a checkpoint (rerun the
same command to resume); anything else is a failure.
"""

import sys
import traceback

from .engines import jax_cpu_settings

if __name__ == "__main__":  # before TensorFlow and JAX load (the console script: in run())
    jax_cpu_settings.restart_with_settings()

from absl import app, flags, logging  # noqa: E402

from .console import cli  # noqa: E402
from .run import config_checks, config_flag, run_config, starting_point  # noqa: E402
from .engines import startup  # noqa: E402
from .engines.tf_strategy import STRATEGIES  # noqa: E402

# Missing files, syntax errors and bad file.py:arguments as one line (see config_flag).
config_flag.define_config_flag("Experiment config: a shipped one by name (quickstart, "
                               "finetune, ...) or a file.py; [:arg] after either.")
flags.DEFINE_string("workdir", None, "Directory (local or gs://) for checkpoints, logs, export.")
flags.DEFINE_enum("strategy", "", ["", *STRATEGIES],
                  "Distribution strategy; default: TPU if --tpu, else all GPUs, else CPU.")
flags.DEFINE_string("tpu", "", "TPU name, grpc:// address, or 'local' on a TPU VM.")
flags.DEFINE_integer("cpu_devices", 1, "Split the CPU into this many logical devices.")
flags.DEFINE_string("coordinator_address", "", "JAX: HOST:PORT of process 0 of a run of several "
                    "processes on CPU or GPU machines (a TPU slice finds its hosts itself).")
flags.DEFINE_integer("num_processes", 1, "JAX: processes of the run, with --coordinator_address.")
flags.DEFINE_integer("process_id", 0, "JAX: this process's index, 0 to --num_processes - 1.")
flags.DEFINE_integer("startup_timeout", startup.DEFAULT_TIMEOUT,
                     "Seconds a process of a multi-worker (TF_CONFIG) or multi-process (JAX) run "
                     "waits for the others to start before it gives up, naming them.")
flags.declare_key_flag("verbose")  # defined in train/console/cli.py; listed by --help
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    # Everything the user gave is checked before TensorFlow starts and any slow work.
    config = config_flag.loaded_config(FLAGS)
    # What the run starts from first (a checkpoint's patch size decides which image sizes are
    # valid): read once, its architecture filled into the run's config, its weights kept for
    # the engine.
    config, start = starting_point.resolve(config, run_config.saved(FLAGS.workdir))
    config_checks.check(config)  # the replica count is checked again once it is known
    if FLAGS.cpu_devices < 1:
        raise app.UsageError(f"--cpu_devices={FLAGS.cpu_devices} must be at least 1.")
    if FLAGS.startup_timeout < 1:
        raise app.UsageError(f"--startup_timeout={FLAGS.startup_timeout} must be at least 1 "
                             "(seconds).")
    import keras

    if keras.config.backend() == "jax":
        _train_on_jax(config, start)
    else:
        _train_on_tensorflow(config, start)


def _log_run(config):
    from .run import run_files

    if FLAGS.verbose:
        logging.info("Config:\n%s", config)
    else:  # every field is in config.json; the terminal gets the few that name the run
        logging.info("%s on %s, %d steps of %d; the whole config: %s (--verbose prints it)",
                     config.model.variant, config.dataset, config.total_steps, config.batch_size,
                     run_files.config_file(FLAGS.workdir))


def _train_on_jax(config, start):
    given = [name for name in ("strategy", "tpu") if FLAGS[name].present]
    if given:
        raise app.UsageError(f"--{given[0]} is a TensorFlow flag; the JAX engine uses every "
                             "device it finds (--cpu_devices, and --coordinator_address, "
                             "--num_processes, --process_id for several processes).")
    if FLAGS.num_processes < 1 or not 0 <= FLAGS.process_id < FLAGS.num_processes:
        raise app.UsageError(f"--process_id={FLAGS.process_id} must be in [0, "
                             f"--num_processes={FLAGS.num_processes}).")
    if FLAGS.num_processes > 1 and not FLAGS.coordinator_address:
        raise app.UsageError("--num_processes > 1 needs --coordinator_address=HOST:PORT of "
                             "process 0.")
    if FLAGS.coordinator_address:
        try:
            startup.split_address(FLAGS.coordinator_address)
        except ValueError as error:
            raise app.UsageError(f"--coordinator_address: {error} It must be HOST:PORT, process "
                                 "0's address and a free port (1 to 65535).") from None
    from .engines import jax_engine
    from .run import loop

    several = FLAGS.num_processes > 1
    jax_engine.initialize(FLAGS.cpu_devices, FLAGS.coordinator_address, FLAGS.num_processes,
                          FLAGS.process_id, FLAGS.startup_timeout,
                          guard_stderr=several and not FLAGS.verbose)
    if jax_engine.is_chief_process():  # the others write nothing into the workdir
        config_checks.check_output_folder(FLAGS.workdir, "workdir")
    _log_run(config)
    try:
        loop.train_and_evaluate(
            lambda config: jax_engine.JaxEngine(config, FLAGS.workdir, start=start), config,
            FLAGS.workdir)
    except loop.Stopped:
        sys.exit(loop.RESUMABLE_EXIT_CODE)
    except Exception as error:
        if not (several and jax_engine.lost_peer(error)):
            raise
        if FLAGS.verbose:
            traceback.print_exc()
        reason = " ".join(str(error).split(". ")[0].split())
        # At once: the interpreter's exit would shut JAX's client down, which waits for the
        # lost process and ends in a C++ abort.
        cli.fail(f"lost contact with another process of this run ({reason}). Start all "
                 f"{FLAGS.num_processes} processes again with the same command: the run "
                 "resumes from the newest checkpoint.", now=True)


def _train_on_tensorflow(config, start):
    given = [name for name in ("coordinator_address", "num_processes", "process_id")
             if FLAGS[name].present]
    if given:
        raise app.UsageError(f"--{given[0]} is a flag of the JAX engine (KERAS_BACKEND=jax); "
                             "TensorFlow's workers read TF_CONFIG.")
    if FLAGS.tpu and FLAGS.strategy not in ("", "tpu"):
        raise app.UsageError(f"--tpu={FLAGS.tpu} applies only to --strategy=tpu (or no "
                             f"--strategy), not --strategy={FLAGS.strategy}.")
    from .engines import tf_strategy as strategies

    if strategies.is_chief_task():  # the others write nothing into the workdir
        config_checks.check_output_folder(FLAGS.workdir, "workdir")

    if FLAGS.cpu_devices > 1:
        if FLAGS.strategy == "multi_worker" or (not FLAGS.strategy and
                                                strategies.cluster_size() > 1):
            raise app.UsageError("--cpu_devices does not apply to multi-worker runs: each "
                                 "worker uses its GPUs, or one CPU device.")
        strategies.split_cpu(FLAGS.cpu_devices)
    try:
        strategy = strategies.make_strategy(FLAGS.strategy, FLAGS.tpu, FLAGS.startup_timeout)
    except startup.StartupFailed as failure:
        # Nothing was written; exiting at once spares TensorFlow's interpreter teardown, which
        # took 8 s on a loaded 2-core machine.
        cli.fail(failure, failure.exit_code, now=True)
    import tensorflow as tf

    from .engines import preemption, tf_checkpoints, tf_engine

    _log_run(config)
    try:
        tf_engine.train_and_evaluate(config, FLAGS.workdir, strategy, start)
    except preemption.Stopped:
        sys.exit(preemption.RESUMABLE_EXIT_CODE)
    except (tf_checkpoints.CheckpointWriteError, tf_checkpoints.NoReadableCheckpointError) as error:
        cli.fail(error)
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as error:
        if strategies.cluster_size() < 2:
            raise
        lost = strategies.lost_task(error) or "another worker"
        # At once: the interpreter's exit would shut TensorFlow's coordination agent down, which
        # can wait for the lost worker (CI saw it still waiting 30 s later).
        cli.fail(f"lost contact with {lost} ({type(error).__name__}): it stopped, or the "
                 "network between them failed. Start all workers again with the same command: "
                 "the run resumes from the newest checkpoint.", now=True)


def run():
    """The `keras-vit-train` command (an installed package's console script)."""
    jax_cpu_settings.restart_with_settings()
    cli.run(main)


if __name__ == "__main__":
    run()
