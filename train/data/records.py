"""One split of a dataset as numbered records: record i of a split is always the same example,
read as `{"image": encoded bytes, "label": int64, "id": int64 record number}`.

Three kinds of storage, and what each can do:
- ArrayRecord files (TFDS datasets prepared with `file_format="array_record"`, the offline
  default among them) and folders of images: random access, `read_at` any record numbers, so
  each host reads only its own examples, in any order, starting anywhere.
- TFRecord files (most TFDS datasets): sequential; `read_range` reads a run of records as
  `pieces` of files (TFDS maps record ranges to files and offsets), opening only the files
  that hold it.
"""

import dataclasses
import functools

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from . import input_plan

# How many record numbers one call into Python reads from ArrayRecord files: amortises the
# call, small enough that the first batch of a run does not wait on a large read.
READ_CHUNK = 64


class Split:
    """The records of `split` (any TFDS split expression, e.g. "train[:90%]") of `builder`.

    `observe`, if given, maps every example as it is read (train.input counts reads with it).
    """

    def __init__(self, builder, split, observe=None):
        self.builder, self.split, self.observe = builder, split, observe
        splits = builder.info.splits
        self.ranges = [  # (base split, first, last + 1); TFDS writes None for either end
            (part.splitname, part.from_ or 0,
             splits[part.splitname].num_examples if part.to is None else part.to)
            for part in tfds.core.ReadInstruction.from_spec(split).to_absolute(splits)]
        self.size = sum(stop - start for _, start, stop in self.ranges)
        self.random_access = _is_folder(builder) or _is_array_record(builder)

    def __repr__(self):
        return f"{self.builder.name}:{self.split}"

    def part(self, hosts, host):
        """Host `host`'s consecutive part `[start, stop)` of the records when `hosts` read the
        split between them (see `part_bounds`)."""
        bounds = self.part_bounds(hosts)
        return bounds[host], bounds[host + 1]

    def part_bounds(self, hosts):
        """Where each host's part starts, and the end: equal parts (sizes differing by at most
        one), or on TFRecord storage with at least as many files as hosts, whole files (each
        bound moved to the nearest file start), so that no host reads through another's records
        to reach its own (a TFRecord file is read from its beginning)."""
        bounds = input_plan.equal_bounds(self.size, hosts)
        if self.random_access:
            return bounds
        starts = self._file_starts
        aligned = [int(starts[np.abs(starts - bound).argmin()]) for bound in bounds[:-1]]
        aligned.append(self.size)
        return aligned if all(low < high for low, high in zip(aligned, aligned[1:])) else bounds

    @functools.cached_property
    def _file_starts(self):
        return self.pieces(0, self.size).first_ids

    def read_at(self, indices):
        """The examples at the record numbers of `indices` (a dataset of int64 vectors), one
        example per element, in the order given. Random-access storage only."""
        if _is_folder(self.builder):
            return self._observed(_folder_reader(self)(indices))
        if _is_array_record(self.builder):
            return self._observed(_array_record_reader(self)(indices))
        raise ValueError(f"{self}: TFRecord files cannot be read at random; use read_range.")

    def _observed(self, examples):
        return examples.map(self.observe) if self.observe else examples

    def read_range(self, start, stop):
        """Records [start, stop) of the split, in order, as a dataset of examples."""
        start, stop = max(0, start), min(stop, self.size)
        if self.random_access:
            chunks = tf.data.Dataset.range(start, max(start, stop)).batch(READ_CHUNK)
            return self.read_at(chunks)
        pieces = self.pieces(start, stop)
        return tf.data.Dataset.range(len(pieces.takes)).flat_map(
            lambda piece: self.read_piece(pieces, piece))

    def pieces(self, start, stop):
        """Records [start, stop) of TFRecord storage as pieces of files, in order: consecutive
        records of one file each (whole files in the middle of a long range)."""
        parts, offset = [], 0
        for name, first, last in self.ranges:  # the slice of each base split within [start, stop)
            low, high = max(start - offset, 0), min(stop - offset, last - first)
            if low < high:
                parts.append(f"{name}[{first + low}:{first + high}]")
            offset += last - first
        instructions = (self.builder.info.splits["+".join(parts)].file_instructions
                        if parts else [])
        takes = np.array([piece.take for piece in instructions], np.int64)
        return Pieces(files=tf.constant([piece.filename for piece in instructions] or [""]),
                      skips=tf.constant([piece.skip for piece in instructions] or [0], tf.int64),
                      takes=takes, first_ids=start + np.cumsum(takes) - takes)

    def read_piece(self, pieces, piece):
        """The examples of piece `piece` (a scalar tensor) of `pieces`, in order."""
        take = tf.gather(tf.constant(pieces.takes), piece)
        serialized = tf.data.TFRecordDataset(tf.gather(pieces.files, piece)).skip(
            tf.gather(pieces.skips, piece)).take(take)
        first = tf.gather(tf.constant(pieces.first_ids), piece)
        numbers = tf.data.Dataset.range(first, first + take)
        chunks = tf.data.Dataset.zip(numbers, serialized).batch(READ_CHUNK)
        return self._observed(chunks.map(self._parse_chunk, num_parallel_calls=tf.data.AUTOTUNE,
                                         deterministic=True).unbatch())

    def _parse_chunk(self, numbers, records):
        """Serialized tf.Examples (TFDS' format in both file formats) to examples, the image
        left encoded. The driver reads an `image` and a `label` feature (TFDS' image
        classification datasets); one `parse_example` for the chunk is twice as fast as TFDS'
        parse of one example at a time."""
        features = tf.io.parse_example(records, {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)})
        return _example(features["image"], features["label"], numbers)


@dataclasses.dataclass(frozen=True)
class Pieces:
    """Pieces of TFRecord files: piece i is records skips[i] to skips[i] + takes[i] - 1 of
    files[i], whose record numbers in the split start at first_ids[i]."""

    files: tf.Tensor  # string
    skips: tf.Tensor  # int64
    takes: np.ndarray  # int64
    first_ids: np.ndarray  # int64


def _example(image, label, index):
    return {"image": image, "label": tf.cast(label, tf.int64), "id": tf.cast(index, tf.int64)}


def _is_folder(builder):
    return isinstance(builder, tfds.folder_dataset.ImageFolder)


def _is_array_record(builder):
    return builder.info.file_format == tfds.core.file_adapters.FileFormat.ARRAY_RECORD


def _folder_reader(split):
    """Record i of a folder split is its i-th image in ImageFolder's (fixed) order."""
    examples = [example for name, start, stop in split.ranges
                for example in split.builder._split_examples[name][start:stop]]
    label_of = split.builder.info.features["label"].str2int
    paths = tf.constant([example.image_path for example in examples] or [""])
    labels = tf.constant([label_of(example.label) for example in examples] or [0], tf.int64)

    def read(indices):
        return indices.unbatch().map(
            lambda index: _example(tf.io.read_file(tf.gather(paths, index)),
                                   tf.gather(labels, index), index),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    return read


def _array_record_reader(split):
    """Reads a chunk of record numbers with array_record's reader, one call into Python per
    chunk (TFDS' data source adds a thread pool and a Python step per record: half the speed
    on the offline default), then parses them in TensorFlow, the image left encoded."""
    from array_record.python import array_record_module

    pieces = split.builder.info.splits[split.split].file_instructions
    starts = np.cumsum([0] + [piece.take for piece in pieces])  # first record number of each
    readers = {}

    def reader(index):  # opened once, on first use; reading is thread-safe
        if index not in readers:
            # No read-ahead (the reads are at random), and no 1 MB read of the file's end on
            # opening (each host opens every file): the index alone is read.
            readers[index] = array_record_module.ArrayRecordReader(
                pieces[index].filename, "readahead_buffer_size:0,footer_prefetch_bytes:0")
        return readers[index]

    def serialized(numbers):
        found = np.empty(len(numbers), dtype=object)
        files = np.searchsorted(starts, numbers, side="right") - 1
        for index in np.unique(files):
            chosen = np.flatnonzero(files == index)
            positions = numbers[chosen] - starts[index] + pieces[index].skip
            found[chosen] = reader(index).read(positions.tolist())
        return found

    def read(indices):
        def read_chunk(numbers):
            records = tf.ensure_shape(tf.numpy_function(serialized, [numbers], tf.string),
                                      [None])
            return numbers, records

        chunks = indices.map(read_chunk, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return chunks.map(split._parse_chunk, num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True).unbatch()

    return read
