"""What a training run decides, written once for both engines: when to step, log, evaluate,
save, stop and export, and how a rerun resumes.

An engine (`train.tf_engine.Trainer` on tf.distribute, `train.jax_engine.JaxEngine` on Keras'
JAX backend) does it on the devices. It offers:

    step, is_chief, eval_examples, objective, class_names, builder, config, workdir
    train_steps(steps) -> (mean loss, gradient norm)   # `steps` optimizer steps
    learning_rate() -> float                          # at the current step
    evaluate() -> (accuracy or None, mean loss)       # the whole eval split, once
    save()                                            # a checkpoint at the current step
    preemption_watcher(save) -> .check(), .close()    # SIGTERM: save together, then stop
    exported_weights() -> context manager             # the model holds the weights to export
    close()                                           # releases input workers, saving threads

Every process runs the same loop, so all take the same decisions at the same steps (the
engines' collectives require it); only the chief writes the shared files.
"""

import math
import os
import tempfile
import time

from absl import logging

from keras_vit import fileio

from . import run_config, run_files
from .metrics import MetricsWriter

# EX_TEMPFAIL of sysexits.h: "temporary failure, retry". Distinct from success (0) and from
# failures (1, or a signal): the run saved a checkpoint and stopped; the same command resumes.
RESUMABLE_EXIT_CODE = 75


# The TFLite files a run exports besides its SavedModel.
TFLITE_KINDS = ("float32", "int8")


class Stopped(Exception):
    """Raised once the stopping checkpoint is saved: rerun the same command to resume."""


def train_and_evaluate(engine_factory, config, workdir):
    """Trains (or resumes) per `config` in `workdir` with the engine that `engine_factory()`
    makes, and exports at the end if asked; returns the final eval metrics.

    Raises `run_config.ConfigMismatchError` before anything is written when `workdir` holds a
    run with another config, and `train.preemption.Stopped` when stopped by SIGTERM.
    """
    from . import grain_input

    engine_name = run_files.current_engine()
    run_files.refuse_other_engine(workdir, engine_name)
    config.input_pipeline = grain_input.choose(config, engine_name, run_config.saved(workdir))
    run_config.check_resume(config, workdir)
    engine = engine_factory()
    if engine.is_chief:
        fileio.makedirs(workdir)
        run_config.write(config, workdir)  # now known to be valid; read back by train.export
    metrics = train(engine)
    if config.export:
        export(engine)  # every process: an engine may need them all to gather the weights
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


def eval_results(batch_sums, expected_examples, has_accuracy):
    """`(accuracy or None, mean loss)` from each eval batch's summed `(correct, loss, weight,
    examples)`, after checking that every eval example was counted once."""
    correct = loss = count = examples = 0.0
    for sums in batch_sums:
        correct, loss, count, examples = (total + float(value) for total, value in zip(
            (correct, loss, count, examples), sums))
    if int(examples) != expected_examples:
        raise RuntimeError(f"Evaluated {int(examples)} examples, expected {expected_examples}.")
    return (correct / count if has_accuracy else None), loss / count


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


def export(engine):
    """Writes the final model (EMA weights if enabled) into the run's export directory
    (train.run_files). Every process calls it; only the chief writes.

    A classifier: the `.keras` model and class names, a TF Serving SavedModel, and float32
    and int8 TFLite files. A masked-patch-prediction run: its encoder without any head, as
    `model.keras` (returning the pooled representation) and `encoder.npz` (the original
    checkpoint layout), both ready for `--config.pretrained` of a fine-tuning run.
    """
    import keras

    import keras_vit

    from . import export as export_run  # `export` is this function

    workdir, directory = engine.workdir, run_files.export_dir(engine.workdir)
    path = run_files.model_file(workdir)
    with engine.exported_weights() as trained:
        model = engine.objective.encoder(trained)
        if not engine.is_chief:  # only the chief writes into the workdir
            return path
        fileio.makedirs(directory)
        export_run.remove_partial_files(workdir)  # left by an export that was killed
        # Keras writes a .keras file only to a path of that name, so not straight to a
        # temporary name beside `path`: into a local directory first, then copied over.
        with tempfile.TemporaryDirectory(prefix="keras_vit_export_") as local:
            model.save(os.path.join(local, "model.keras"))
            with open(os.path.join(local, "model.keras"), "rb") as handle:
                fileio.write_atomically(path, handle.read())
        if model is not trained:  # a pre-trained encoder: nothing to serve yet
            keras_vit.checkpoint.save_npz(model, run_files.encoder_file(workdir))
        else:
            run_files.write_class_names(workdir, engine.class_names)
            if keras.config.backend() == "tensorflow":
                representative = export_run.calibration_images(
                    engine.builder, engine.config.train_split, engine.config.image_size, 200)
                export_run.export_model(model, workdir, engine.class_names, TFLITE_KINDS,
                                        representative)
    if model is trained and keras.config.backend() != "tensorflow":
        # The serving signatures decode images with TensorFlow ops: a TensorFlow process
        # exports the model.keras just written, as `python -m train.export` does.
        export_run.export_in_tensorflow(workdir, TFLITE_KINDS)
    logging.info("Saved the trained %s to %s.",
                 "model" if model is trained else "encoder", directory)
    return path


def _duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
