"""Writes the paper's pictures of a model's insides, and its few-shot accuracy, as PNG files.

    # a trained run (its export/model.keras and config.json):
    python -m train.analyze --workdir=/tmp/vit_quickstart --out=/tmp/vit_quickstart/analysis
    # a published checkpoint (the config names the model, weights and dataset):
    python -m train.analyze --config=configs/finetune.py:model=B/16,dataset=cifar10 \
        --config.pretrained=imagenet21k --config.image_size=224 --out=plots/
    # your own images for the attention maps:
    python -m train.analyze --workdir=DIR --images=a.jpg,b.png --out=plots/

Writes into --out: attention_rollout.png, attention_distance.png, position_embeddings.png,
embedding_filters.png, few_shot.png, and analysis.json with the numbers behind them.
"""

import os
import time

from absl import app, flags, logging

from .console import cli
from .run import config_checks, config_flag, model_config

config_flag.define_config_flag("Config (a shipped name or file.py, [:arg]); default: the "
                               "workdir's config.json. Names the dataset, and the model and "
                               "weights when there is no --workdir.")
flags.DEFINE_string("workdir", None, "Training workdir holding export/model.keras.")
flags.DEFINE_string("out", None, "Folder (local or gs://) for the PNG files and analysis.json.")
flags.DEFINE_list("images", [], "Image files (PNG/JPEG/GIF/BMP) for the attention maps; "
                  "default: the first --num_images eval images.")
flags.DEFINE_integer("num_images", 6, "Eval images drawn with attention maps without --images.")
flags.DEFINE_integer("distance_images", 128, "Eval images averaged for the attention distance.")
flags.DEFINE_integer("filters", 28, "Principal components of the pixel filters to draw.")
flags.DEFINE_list("shots", ["1", "5", "10", "25"], "Few-shot k values; 'none' skips few-shot.")
flags.DEFINE_integer("few_shot_train", 10000, "Train examples the k-shot sets are drawn from.")
flags.DEFINE_integer("few_shot_test", 10000, "Eval examples the few-shot accuracy is measured on.")
flags.DEFINE_float("l2_reg", None, "Ridge regularisation of the few-shot linear fit; "
                   "default keras_vit.analysis.DEFAULT_L2_REG.")
flags.DEFINE_integer("draws", 5, "Random k-shot draws averaged per k.")
flags.declare_key_flag("verbose")  # defined in train/console/cli.py; listed by --help
flags.mark_flags_as_required(["out"])
FLAGS = flags.FLAGS


def load_config(workdir):
    import ml_collections

    from .run import run_config

    config = config_flag.loaded_config(FLAGS)
    if config is None:
        saved = workdir and run_config.saved(workdir, fix="restore it, or give --config=FILE")
        if not saved:
            raise app.UsageError("Give --config=FILE (or a --workdir with a config.json): it "
                                 "names the dataset, and the model and weights without "
                                 "--workdir.")
        config = ml_collections.ConfigDict(saved)
    # Only what the analysis reads: the model, its weights and the dataset.
    config_checks.check(config, fields=config_checks.ANALYZE_FIELDS)
    return config


def load_model(config, workdir):
    """The workdir's trained model, or the config's model with its pre-trained weights."""
    import keras

    import keras_vit
    from keras_vit import fileio
    from .run import run_files

    if workdir:
        path = run_files.model_file(workdir)
        if not fileio.exists(path):
            raise app.UsageError(f"No trained model at {path}: train first with "
                                 f"python -m train.main --workdir={workdir} ...")
        return keras.models.load_model(path, safe_mode=True), run_files.read_class_names(workdir)
    if not config.pretrained:
        raise app.UsageError("Nothing to analyze: give --workdir of a trained run, or "
                             "--config.pretrained=<weights name or .npz> for a checkpoint.")
    arrays = keras_vit.weights.checkpoint.read_npz(
        keras_vit.weights.pretrained.resolve_weights(config.pretrained, config.model.variant))
    spec = model_config.model_spec(config, num_classes=1, include_top=False)
    # The paper's few-shot metric reads the pre-logits layer of checkpoints that have one.
    if spec.representation_size is None and "pre_logits/kernel" in arrays:
        spec = spec.replace(representation_size=arrays["pre_logits/kernel"].shape[-1])
    model = keras_vit.vit(spec)
    keras_vit.weights.checkpoint.load_npz(model, arrays)
    return model, None


def read_image_files(paths, size):
    """Decoded files resized to the model's `size`: (uint8 pixels, model inputs, names)."""
    import numpy as np
    import tensorflow as tf

    from keras_vit.preprocessing import decode_and_resize

    pixels = []
    for path in paths:
        if not tf.io.gfile.exists(path):
            raise app.UsageError(f"--images: {path} does not exist.")
        with tf.io.gfile.GFile(path, "rb") as handle:
            encoded = handle.read()
        try:
            pixels.append(decode_and_resize(encoded, size).numpy())
        except tf.errors.InvalidArgumentError as error:
            raise app.UsageError(f"--images: {path} is not a PNG, JPEG, GIF or BMP image "
                                 f"({error.message.splitlines()[0]}).") from None
    return _pixels_and_inputs(np.stack(pixels)) + ([os.path.basename(p) for p in paths],)


def _pixels_and_inputs(resized):
    import numpy as np

    from keras_vit.preprocessing import scale_pixels

    pixels = np.clip(np.round(resized), 0, 255).astype(np.uint8)
    return pixels, scale_pixels(resized.astype(np.float32))


def dataset_images(builder, split, size, count):
    """The first `count` examples of `split` resized to `size`: (pixels, inputs, labels)."""
    import numpy as np

    from .data import tf_pipeline

    pairs = list(tf_pipeline.resized_examples(builder, split, size, count).as_numpy_iterator())
    if not pairs:
        raise app.UsageError(f"The {split!r} split of {builder.name} has no examples.")
    resized, labels = zip(*pairs)
    return _pixels_and_inputs(np.stack(resized)) + (np.asarray(labels),)


def check_flags():
    """Rejects bad flag values before any slow work; returns the few-shot k values."""
    if FLAGS.workdir and "://" not in FLAGS.workdir and not os.path.isdir(FLAGS.workdir):
        what = "is not a folder" if os.path.exists(FLAGS.workdir) else "does not exist"
        raise app.UsageError(f"--workdir={FLAGS.workdir} {what}: give the --workdir of a "
                             "training run (it holds export/model.keras).")
    for path in FLAGS.images:
        if "://" not in path and not os.path.isfile(path):
            what = "is not a file" if os.path.exists(path) else "does not exist"
            raise app.UsageError(f"--images: {path} {what}.")
    config_checks.check_output_folder(FLAGS.out, "out")
    for name in ("num_images", "distance_images", "filters", "draws", "few_shot_train",
                 "few_shot_test"):
        if FLAGS[name].value < 1:
            raise app.UsageError(f"--{name} must be at least 1, got {FLAGS[name].value}.")
    if FLAGS.l2_reg is not None and not FLAGS.l2_reg > 0:
        raise app.UsageError(f"--l2_reg must be > 0, got {FLAGS.l2_reg}.")
    if [value.lower() for value in FLAGS.shots] in ([], ["none"]):
        return ()
    try:
        shots = tuple(int(value) for value in FLAGS.shots)
    except ValueError:
        raise app.UsageError(f"--shots={','.join(FLAGS.shots)}: give whole numbers, e.g. "
                             "1,5,10,25, or 'none'.") from None
    if min(shots) < 1:
        raise app.UsageError("--shots must be positive.")
    return shots


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    shots = check_flags()
    import tensorflow as tf

    from keras_vit import analysis
    from .data import tf_pipeline
    from .run import metrics

    config = load_config(FLAGS.workdir)
    model, class_names = load_model(config, FLAGS.workdir)
    layout = analysis.token_layout(model)
    builder = tf_pipeline.get_builder(config, for_training=False)
    if class_names is None and "label" in builder.info.features:
        class_names = builder.info.features["label"].names
    tf.io.gfile.makedirs(FLAGS.out)
    logging.info("Analyzing %s: %dx%d grid of %gx%g-pixel patches, %d prefix token(s).",
                 model.name, *layout.grid, *layout.pixel_pitch, layout.num_prefix_tokens)
    results = {"model": model.name, "grid": list(layout.grid),
               "pixel_pitch": list(layout.pixel_pitch)}
    start = time.time()
    paths = _attention_figures(model, builder, config, class_names, layout.image_size, results)
    logging.info("Attention maps and distances: %.1f s.", time.time() - start)
    paths += _weight_figures(model, results)
    json_path = os.path.join(FLAGS.out, "analysis.json")
    metrics.write_json(json_path, results)  # kept if the slower few-shot evaluation fails
    if shots:
        paths += _few_shot_figure(model, builder, config, layout.image_size, shots, results,
                                  json_path)
    paths.append(json_path)
    metrics.write_json(json_path, results)
    logging.info("Wrote %s in %.1f s.", ", ".join(paths), time.time() - start)


def _attention_figures(model, builder, config, class_names, size, results):
    """The attention rollout of a few images (--images, or the eval split's) and the mean
    attention distance per layer (of --distance_images eval images); their paths."""
    import numpy as np

    from keras_vit import analysis

    # One read of the eval images serves the attention maps and the distances.

    from keras_vit.analysis import plotting
    eval_pixels, eval_inputs, eval_labels = dataset_images(
        builder, config.eval_split, size, max(FLAGS.num_images, FLAGS.distance_images))
    if FLAGS.images:
        pixels, inputs, captions = read_image_files(FLAGS.images, size)
    else:
        pixels, inputs, labels = (part[:FLAGS.num_images]
                                  for part in (eval_pixels, eval_inputs, eval_labels))
        captions = [f"label: {_name(class_names, label)}" for label in labels]
    if len(model.outputs[0].shape) == 2 and model.layers[-1].name == "head":
        predicted = np.argmax(model.predict_on_batch(inputs), axis=-1)
        captions = [f"{caption}\npredicted: {_name(class_names, index)}"
                    for caption, index in zip(captions, predicted)]
    rollout = analysis.attention_rollout(model, inputs)
    paths = [plotting.plot_rollout(pixels, rollout,
                                   os.path.join(FLAGS.out, "attention_rollout.png"), captions)]
    distance_inputs = eval_inputs[:FLAGS.distance_images]
    distance = analysis.mean_attention_distance(model, distance_inputs)
    results["mean_attention_distance_pixels"] = np.round(distance, 3).tolist()
    results["distance_images"] = len(distance_inputs)
    paths.append(plotting.plot_attention_distance(
        distance, os.path.join(FLAGS.out, "attention_distance.png"), size))
    return paths


def _weight_figures(model, results):
    """The position embeddings' similarity (where the model has learned ones) and the patch
    embedding's principal filters; their paths."""
    from keras_vit import analysis
    from keras_vit.analysis import plotting
    from keras_vit.layers import resnet

    paths = []
    try:
        similarity = analysis.position_embedding_similarity(model)
    except ValueError as error:
        logging.warning("Skipping the position embeddings: %s", error)
    else:
        summary = analysis.position_similarity_summary(similarity)
        results["position_similarity_mean"] = {
            name: None if value is None else round(value, 4) for name, value in summary.items()}
        paths.append(plotting.plot_position_similarity(
            similarity, os.path.join(FLAGS.out, "position_embeddings.png")))
    available = analysis.embedding_filter_count(model)
    count = min(FLAGS.filters, available)
    if count < FLAGS.filters:
        logging.info("The model has %d principal filter components; drawing %d.", available,
                     count)
    hybrid = any(isinstance(layer, resnet.ResNetStem) for layer in model.layers)
    title = (f"ResNet root filters (7x7): first {count} principal components" if hybrid
             else None)
    paths.append(plotting.plot_embedding_filters(
        analysis.embedding_filters(model, n=count),
        os.path.join(FLAGS.out, "embedding_filters.png"), title))
    return paths


def _few_shot_figure(model, builder, config, size, shots, results, json_path):
    """The few-shot linear accuracy of the frozen features (--shots); its figure's path."""
    from keras_vit import analysis
    from keras_vit.analysis import plotting
    from .data import tf_pipeline

    l2_reg = analysis.DEFAULT_L2_REG if FLAGS.l2_reg is None else FLAGS.l2_reg
    logging.info("Few-shot: features of %d train and %d eval examples...",
                 FLAGS.few_shot_train, FLAGS.few_shot_test)
    try:
        accuracy = analysis.few_shot_accuracy(
            model,
            tf_pipeline.labelled_batches(builder, config.train_split, size,
                                         FLAGS.few_shot_train),
            tf_pipeline.labelled_batches(builder, config.eval_split, size,
                                         FLAGS.few_shot_test),
            shots=shots, l2_reg=l2_reg, draws=FLAGS.draws, progress=_log_progress)
    except ValueError as error:
        raise app.UsageError(f"Few-shot evaluation: {error} (--few_shot_train, --shots; "
                             f"the other results are in {json_path})") from None
    for k, value in accuracy.items():
        logging.info("%d-shot linear accuracy: %.2f%%", k, 100 * value)
    results["few_shot"] = {"accuracy": {str(k): v for k, v in accuracy.items()},
                           "l2_reg": l2_reg, "draws": FLAGS.draws, "dataset": config.dataset}
    return [plotting.plot_few_shot(
        accuracy, os.path.join(FLAGS.out, "few_shot.png"),
        f"Few-shot linear accuracy on {config.dataset}\n(frozen features, mean of "
        f"{FLAGS.draws} draws)")]


def _log_progress(done):
    logging.log_every_n_seconds(logging.INFO, "Few-shot features: %d images done.", 10, done)


def _name(class_names, index):
    index = int(index)
    return class_names[index] if class_names and index < len(class_names) else str(index)


def run():
    """The `keras-vit-analyze` command (an installed package's console script)."""
    cli.run(main)


if __name__ == "__main__":
    run()
