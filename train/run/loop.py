"""What a training run decides, written once for both engines: when to step, log, evaluate,
save, stop and export, and how a rerun resumes.

An engine (train.run.engine.Engine: `TFEngine` on tf.distribute, `JaxEngine` on Keras' JAX
backend, in train/engines/) does it on the devices. Every process runs the same loop, so all
take the same decisions at the same steps (the engines' collectives require it); only the chief
writes the shared files.
"""

import math
import time

from absl import logging

from keras_vit import fileio

from . import export, run_config, run_files
from .metrics import MetricsWriter

# The loop's config fields and their rules (as train.run.config_checks reads them).
RULES = {
    "seed": ("int", (0, 2**31 - 1)),  # the model's initialisation, the data order, augmentation
    "total_steps": ("int", (1, None)),
    "steps_per_loop": ("int", (1, None)),
    "eval_every_steps": ("int", (1, None)),
    "checkpoint_every_steps": ("int", (1, None)),
    "export": ("bool", None),
}

# EX_TEMPFAIL of sysexits.h: "temporary failure, retry". Distinct from success (0) and from
# failures (1, or a signal): the run saved a checkpoint and stopped; the same command resumes.
RESUMABLE_EXIT_CODE = 75


class Stopped(Exception):
    """Raised once the stopping checkpoint is saved: rerun the same command to resume."""


def train_and_evaluate(engine_factory, config, workdir):
    """Trains (or resumes) per `config` in `workdir` with the engine that `engine_factory(the
    run's config)` makes, and exports at the end if asked; returns the final eval metrics.
    The run's config is `config` with the input pipeline chosen (a new config: `config` is left
    as it is).

    Raises `run_config.ConfigMismatchError` before anything is written when `workdir` holds a
    run with another config, and `train.engines.preemption.Stopped` when stopped by SIGTERM.
    """
    from ..data import grain_pipeline

    engine_name = run_files.current_engine()
    run_files.refuse_other_engine(workdir, engine_name)
    saved = run_config.saved(workdir)
    config = run_config.replaced(config, input_pipeline=grain_pipeline.choose(
        config, engine_name, saved and saved["input_pipeline"]))
    run_config.check_resume(config, workdir)
    engine = engine_factory(config)
    if engine.is_chief:
        fileio.makedirs(workdir)
        run_config.write(config, workdir)  # now known to be valid; read back by train.export
    metrics = train(engine)
    if config.export:  # every process: an engine may need them all to gather the weights
        export.export_trained(engine)
    engine.close()
    return metrics


def train(engine):
    """Runs to `config.total_steps`; returns the final eval metrics."""
    config = engine.config
    writer = MetricsWriter(engine.workdir, resume_step=engine.step, active=engine.is_chief)
    watcher = engine.preemption_watcher(engine.save)
    timed_from = None  # (step, time) after the first loop, which compiles the step
    try:
        if (0 < engine.step < config.total_steps
                and engine.step % config.eval_every_steps == 0):
            # Resumed at an evaluation step: its record may have been lost with the run.
            evaluate_and_log(engine, writer)
        while engine.step < config.total_steps:
            step = engine.step
            steps = min(config.steps_per_loop, config.total_steps - step,
                        config.eval_every_steps - step % config.eval_every_steps,
                        config.checkpoint_every_steps - step % config.checkpoint_every_steps)
            loop_start = time.time()
            loss, grad_norm = engine.train_steps(steps)
            elapsed = time.time() - loop_start
            step = engine.step
            if not math.isfinite(loss):
                raise FloatingPointError(f"Loss is {loss} at step {step}; lower the learning "
                                         "rate or check the data.")
            images_per_second = steps * config.batch_size / elapsed
            learning_rate = engine.learning_rate()
            now = time.time()
            if timed_from is None:  # its pace would overstate the time left
                timed_from = (step, now)
                eta = ("after the next loop (this one compiled the step)"
                       if step < config.total_steps else _duration(0))
            else:  # the pace since the first loop, evaluations and checkpoints included
                seconds_per_step = (now - timed_from[1]) / (step - timed_from[0])
                eta = _duration((config.total_steps - step) * seconds_per_step)
            logging.info("step %d/%d  loss %.4f  lr %.3g  %.1f img/s  ETA %s", step,
                         config.total_steps, loss, learning_rate, images_per_second, eta)
            writer.write(step, loss=loss, learning_rate=learning_rate,
                         images_per_second=images_per_second, grad_norm=grad_norm)
            if step % config.checkpoint_every_steps == 0:
                engine.save()
            if step % config.eval_every_steps == 0 and step < config.total_steps:
                evaluate_and_log(engine, writer)
            watcher.check()  # every process, at the same point: may save and stop
        engine.save()
        return evaluate_and_log(engine, writer, final=True)
    except Stopped:
        logging.warning("Stopped at step %d; rerun the same command to resume.", engine.step)
        raise
    finally:
        watcher.close()


def evaluate_and_log(engine, writer, final=False):
    config = engine.config
    accuracy, eval_loss = engine.evaluate()
    results = {"eval_loss": eval_loss}
    if accuracy is not None:
        results["eval_accuracy"] = accuracy
    what = ("" if config.objective == "classification"
            else f" (masked patch prediction, target {config.mpp_target})")
    logging.info("%s (step %d): %s over %d examples%s.", "Final" if final else "Eval",
                 engine.step, "  ".join(f"{name.replace('_', ' ')} {value:.4f}"
                                        for name, value in sorted(results.items())),
                 engine.eval_examples, what)
    writer.write(engine.step, **results)
    return results


def _duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
