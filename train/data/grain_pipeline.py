"""Input without TensorFlow, for the JAX engine on machines that have JAX and no TensorFlow:
Grain over TFDS datasets stored as ArrayRecord (`file_format="array_record"`) and over the
offline default's arrays, decoded with Pillow and augmented in NumPy.

The stream is the tf.data pipeline's (train.data.tf_pipeline): global batch s is positions
[s * B, (s + 1) * B), each host reads only its share (train.data.input_plan), and position p
reads the record and gets the crop and flip that train.data.stream computes from (config.seed,
p) for both pipelines: the same examples at every step on either, for any number of hosts, and a
start at any step reads nothing before it.

Record ids: the record number in the split, as train.data.records numbers them for ArrayRecord
datasets; for the offline default, the image's index in its IDX file.

With `config.native` (train.data.native_input), each image keeps its aspect ratio as tf.data's
train.data.tf_native cuts it: train.data.grain_native makes the same arrays in NumPy.
"""

import functools
import io

import numpy as np

from . import input_plan, sources, stream


def choose(config, engine, saved_choice=None):
    """The input pipeline of a run on `engine` ("jax" or "tensorflow"): `config.input_pipeline`,
    where "auto" is the saved run's choice (`saved_choice`, None for a new run) or, for a new
    run, "grain" where Grain can read the data for this engine, else "tf.data".
    Raises ValueError when the pipeline asked for cannot be used, saying why and what to do."""
    from ..console import cli

    asked = config.input_pipeline
    if asked == "auto" and saved_choice is not None:
        asked = saved_choice
    if asked != "tf.data":  # "grain" or a new run's "auto": can Grain read the data?
        problem = unavailable(config, engine)
        if asked == "grain" and problem:
            raise ValueError(f"config.input_pipeline='grain' cannot be used: {problem}. Use "
                             "--config.input_pipeline=tf.data.")
        asked = "tf.data" if problem else "grain"
    if asked == "tf.data" and config.input_workers:
        raise ValueError(f"config.input_workers={config.input_workers} is for the Grain "
                         "pipeline; tf.data runs its own threads: leave it 0.")
    if asked == "tf.data" and not cli.tensorflow_installed():
        problem = unavailable(config, engine)
        raise ValueError(
            "config.input_pipeline='tf.data' needs TensorFlow, which is not installed: "
            + (f"pip install tensorflow ({problem})." if problem else
               "pip install tensorflow, or use --config.input_pipeline=grain."))
    return asked


def unavailable(config, engine):
    """Why Grain cannot read `config`'s data for `engine` ("jax" or "tensorflow"), or "" when
    it can."""
    if engine != "jax":
        return "the Grain pipeline feeds the JAX engine (KERAS_BACKEND=jax)"
    from . import augmentation

    if augmentation.of(config).active:
        return ("RandAugment, Mixup, CutMix and random erasing are TensorFlow ops "
                "(train/data/randaugment.py, train/data/mixing.py)")
    if config.objective != "classification":
        return (f"config.objective={config.objective!r} draws its patch corruption with "
                "TensorFlow ops (train.data.masking)")
    from . import settings

    # (A native run evaluates each image at its budget, with no eval_* resize on either pipeline.)
    if config.native == "none" and (
            settings.eval_preprocessing(config) != settings.EvalPreprocessing()):
        return ("the evaluation resize of config.eval_* (a checkpoint's crop or filter) is "
                "TensorFlow's (keras_vit.preprocessing.resize); Grain's is a plain bilinear "
                "resize")
    return sources.of(config).grain_problem()


def open_split(config, field):
    """The source of the split `config[field]` (train_split or eval_split) of
    `config.dataset`; raises ValueError when the split is missing or empty."""
    split = config[field]
    try:
        source = sources.of(config).grain_split(split)
    except (KeyError, ValueError, AssertionError) as error:  # TFDS' words for a bad split
        raise ValueError(f"config.{field}={split!r} of dataset {config.dataset!r}: "
                         f"{error}".rstrip(".") + ".") from error
    if not len(source):
        raise ValueError(f"config.{field}={split!r}: the split of dataset {config.dataset!r} "
                         "has no examples.")
    return source


def process_input(config, hosts, host):
    """`input_plan.ProcessInput` of host `host` of `hosts` through Grain."""
    train_source = open_split(config, "train_split")
    eval_source = open_split(config, "eval_split")

    def train(start_step, num_patches=None, native=None):
        assert num_patches is None  # masked patch prediction: unavailable() says why
        return iter(train_batches(train_source, config, start_step, hosts, host,
                                  workers=config.input_workers, native=native))

    def evaluate(num_patches=None, native=None):
        assert num_patches is None
        batches = iter(eval_batches(eval_source, config, hosts, host,
                                    workers=config.input_workers, native=native))
        try:
            yield from batches
        finally:  # its worker processes and their shared memory
            batches.close()

    return input_plan.ProcessInput(class_names=train_source.class_names,
                                   eval_examples=len(eval_source), train=train, eval=evaluate)


class Counted:
    """A source that counts the records and image bytes read through it (train.input)."""

    def __init__(self, source):
        self.source, self.records_read, self.bytes_read = source, 0, 0

    def __len__(self):
        return len(self.source)

    def __getitem__(self, index):
        image, label, index = self.source[index]
        self.records_read += 1
        self.bytes_read += len(image) if isinstance(image, bytes) else image.nbytes
        return image, label, index


# ----------------------------------------------------------------------------------------------
# Preprocessing: the NumPy counterparts of train.data.tf_pipeline's preprocess_train and
# preprocess_eval (tests compare them).


def decode(image, record=None):
    """Encoded bytes (PNG, JPEG, ...) or a uint8 array to uint8 RGB [height, width, 3], as
    `keras_vit.preprocessing.decode_image` (grayscale repeated, alpha dropped; JPEG pixels may
    differ by a few levels, Pillow's decoder against TensorFlow's). Bytes that are not an image
    are a ValueError naming `record`."""
    if isinstance(image, bytes):
        from PIL import Image

        try:
            with Image.open(io.BytesIO(image)) as opened:
                image = np.asarray(opened.convert("RGB"))
        except (OSError, ValueError) as error:  # PIL.UnidentifiedImageError is an OSError
            raise ValueError(f"Record {record} is not a readable image ({error}): remove it "
                             "from the dataset or replace it.") from None
    if image.ndim == 2:
        image = image[..., None]
    if image.shape[-1] == 1:
        return np.broadcast_to(image, image.shape[:2] + (3,))
    return image[..., :3]


@functools.lru_cache(maxsize=1024)
def antialiased_weights(size_in, size_out):
    """The float64 [size_out, size_in] matrix of TensorFlow's antialiased bilinear resize along
    one axis (`tf.image.resize(method="bilinear", antialias=True)`, its ScaleAndTranslate
    kernel): half-pixel centres, a triangle as wide as the scale when shrinking (plain bilinear
    when enlarging), each row summing to 1 over the pixels inside the image."""
    scale = size_in / size_out
    support = max(scale, 1.0)
    centres = (np.arange(size_out) + 0.5) * scale - 0.5
    weights = np.maximum(1 - np.abs(np.arange(size_in)[None] - centres[:, None]) / support, 0)
    return weights / weights.sum(axis=1, keepdims=True)


@functools.lru_cache(maxsize=1024)
def _bilinear_weights(size_in, size_out):
    """The [size_out, size_in] matrix of TensorFlow's bilinear resize along one axis (half-pixel
    centres, no antialiasing: `tf.image.resize(method="bilinear")`)."""
    centres = (np.arange(size_out) + 0.5) * (size_in / size_out) - 0.5
    low = np.floor(centres)
    fraction = centres - low
    low_index = np.clip(low, 0, size_in - 1).astype(int)
    high_index = np.clip(low + 1, 0, size_in - 1).astype(int)
    weights = np.zeros((size_out, size_in), np.float32)
    np.add.at(weights, (np.arange(size_out), low_index), 1 - fraction)
    np.add.at(weights, (np.arange(size_out), high_index), fraction)
    return weights


def resize(images, size, out=None, antialias=False):
    """uint8 or float [..., height, width, 3] (one image or a batch) to float32 [..., size[0],
    size[1], 3] (into `out` if given), still in 0..255, as `keras_vit.preprocessing.resize`
    (`antialias`: as `tf.image.resize(..., antialias=True)`, `antialiased_weights`): two
    matrix products, along the width, then along the height."""
    *batch, height, width, _ = images.shape
    if antialias:
        rows, columns = (antialiased_weights(size_in, size_out).astype(np.float32)
                         for size_in, size_out in ((height, size[0]), (width, size[1])))
    else:
        rows, columns = _bilinear_weights(height, size[0]), _bilinear_weights(width, size[1])
    pixels = np.swapaxes(images, -1, -2).astype(np.float32)  # [..., height, 3, width]
    pixels = (pixels.reshape(-1, width) @ columns.T).reshape(*batch, height, 3 * size[1])
    pixels = (rows @ pixels).reshape(*batch, size[0], 3, size[1])
    if out is None:
        return np.ascontiguousarray(np.swapaxes(pixels, -1, -2))
    out[...] = np.swapaxes(pixels, -1, -2)
    return out


def preprocess_train(images, positions, config, records=None):
    """A batch of encoded images (or arrays) to float32 [batch, size, size, 3] in [-1, 1]:
    decode, inception crop, resize to config.image_size, flip, each drawn from (config.seed,
    the image's stream position) by `stream.crop_box`, as the tf.data pipeline draws them.
    `records` (their record numbers) name a bad image."""
    images, flips = cropped(images, positions, config, records)
    batch = _resized(images, config.image_size)
    for index in np.flatnonzero(flips):  # after the resize: one flip of the smaller image
        batch[index] = batch[index, :, ::-1]
    return _scaled(batch)


def cropped(images, positions, config, records=None):
    """`(images, flips)`: encoded images (or arrays) decoded to uint8 and cropped as
    `stream.crop_box` draws them from (config.seed, their stream `positions`), and whether
    each is to be flipped; `records` name a bad image."""
    records = records or [None] * len(positions)
    images = [decode(image, record) for image, record in zip(images, records)]
    flips = [False] * len(images)
    if config.crop_min_area < 1.0 or config.flip:
        for index, draws in enumerate(stream.crop_draws(positions, config.seed)):
            height, width = images[index].shape[:2]
            top, left, height, width, flip = stream.crop_box(height, width, draws,
                                                             config.crop_min_area)
            images[index] = images[index][top:top + height, left:left + width]
            flips[index] = config.flip and flip
    return images, flips


def preprocess_eval(images, image_size, records=None):
    """A batch of encoded images (or arrays) decoded, resized and scaled to [-1, 1]:
    `tf_pipeline.preprocess_eval`. `records` (their record numbers) name a bad image."""
    records = records or [None] * len(images)
    return _scaled(_resized([decode(image, record) for image, record in zip(images, records)],
                            image_size))


def _resized(images, image_size):
    """`images` resized into one float32 batch: one product for the whole batch where they
    have one shape (the offline default's), else one each."""
    size = (image_size, image_size)
    batch = np.empty((len(images),) + size + (3,), np.float32)
    if images and len({image.shape for image in images}) == 1:
        resize(np.stack(images), size, out=batch)
    else:
        for index, image in enumerate(images):
            resize(image, size, out=batch[index])
    return batch


def _scaled(pixels):
    """`keras_vit.preprocessing.scale_pixels` of float32 `pixels`, in place (the same float32
    operations: a batch of 224px images is 38 MB, and a copy costs as much as the resize)."""
    np.subtract(pixels, 127.5, out=pixels)
    return np.multiply(pixels, np.float32(1 / 127.5), out=pixels)


# ----------------------------------------------------------------------------------------------
# The streams.


def train_batches(source, config, start_step, hosts, host, threads=4, workers=0, native=None):
    """This host's share of every global batch from `start_step` on, as NumPy
    `{"image", "label", "id"}` batches of batch_size / hosts, endless; given `native` (a
    train.data.native_input.Plan), tf.data's native batches and the images' ids
    (train.data.grain_native). A batch is made in one thread, `threads` of them at a time, in
    this process or in each of `workers` processes."""
    import grain

    input_plan.check_host_share(config.train_split, len(source),
                                input_plan.equal_bounds(len(source), hosts), config.batch_size,
                                hosts, host)
    if native is not None and native.mode == "packed" and native.sequences % hosts:
        raise ValueError(f"config.pack_sequences={native.sequences} is not divisible by the "
                         f"{hosts} hosts (input pipelines): make it a multiple of their number.")
    steps = grain.MapDataset.range(start_step, 2**62).map(
        TrainBatch(source, config, hosts, host, native))
    return _made_by(steps, threads, workers)


def eval_batches(source, config, hosts, host, threads=4, workers=0, native=None):
    """This host's part of the eval split, once, in order, as NumPy `{"image", "label", "mask",
    "id"}` batches of eval_batch_size / hosts (given `native`, each image's padded patches at
    the whole budget in place of "image"), padded with `mask` 0 so that every host yields the
    same number of batches (every example counted once, static shapes)."""
    import grain

    bounds = input_plan.equal_bounds(len(source), hosts)
    steps = input_plan.eval_steps(bounds, config.eval_batch_size, hosts)
    batches = grain.MapDataset.range(0, steps).map(EvalBatch(source, config, hosts, host, native))
    return _made_by(batches, threads, workers)


def _made_by(batches, threads, workers):
    """`batches` (a MapDataset) read in order by `threads` threads, in this process or in
    each of `workers` worker processes (Grain's `mp_prefetch`)."""
    import grain

    _one_blas_thread()
    batches = batches.to_iter_dataset(
        grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads))
    if workers:
        batches = batches.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return batches


def _one_blas_thread():
    """NumPy's BLAS limited to one thread of its own per caller, for the rest of the process:
    the pipeline's threads are the parallelism (with BLAS's threads as well, 4 threads on 2
    cores made 224px batches 3x slower). The decoding and the resizing release the GIL."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")


class TrainBatch:
    """Host `host`'s share of global batch `step` (Grain's `map` calls it; pickled into its
    worker processes), native batches given a `native` plan."""

    def __init__(self, source, config, hosts, host, native=None):
        self.source, self.config, self.hosts, self.host = source, config, hosts, host
        self.native = native
        self.threads_limited = False

    def __getstate__(self):
        return dict(self.__dict__, threads_limited=False)

    def __call__(self, step):
        config = self.config
        if not self.threads_limited:  # once in each process
            _one_blas_thread()
            self.threads_limited = True
        first = input_plan.first_position(step, config.batch_size, self.hosts, self.host)
        positions = np.arange(first, first + config.batch_size // self.hosts)
        records = stream.records_at(positions, len(self.source), config.seed)
        images, labels, ids = zip(*(self.source[int(record)] for record in records))
        if self.native is not None:
            from . import grain_native

            return grain_native.train_batch(images, labels, ids, positions, config, self.native)
        return {"image": preprocess_train(images, positions, config, ids),
                "label": np.array(labels, np.int32), "id": np.array(ids, np.int64)}


class EvalBatch:
    """Batch `step` of host `host`'s part of the eval split, padded (as `TrainBatch`)."""

    def __init__(self, source, config, hosts, host, native=None):
        self.source, self.config, self.native = source, config, native
        self.bounds = input_plan.equal_bounds(len(source), hosts)[host:host + 2]
        self.share = config.eval_batch_size // hosts

    def __call__(self, step):
        start, stop = self.bounds
        first = start + step * self.share
        records = [self.source[index] for index in range(first, min(first + self.share, stop))]
        padding = self.share - len(records)
        images = [image for image, _, _ in records]
        ids = [record for _, _, record in records]
        if self.native is not None:
            from . import grain_native

            batch = grain_native.eval_images(images, ids, self.native, padding)
        else:
            pixels = preprocess_eval(images, self.config.image_size, ids)
            batch = {"image": np.concatenate(
                [pixels, np.zeros((padding,) + pixels.shape[1:], np.float32)])}
        return dict(batch,
                    label=np.array([label for _, label, _ in records] + [0] * padding, np.int32),
                    mask=np.array([1.0] * len(records) + [0.0] * padding, np.float32),
                    id=np.array(ids + [-1] * padding, np.int64))
