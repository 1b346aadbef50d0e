"""The datasets a run reads, by `config.dataset`: one module per kind of source, each a
`DataSource` that both input pipelines read (tf.data through `builder`, Grain through
`grain_split`).

    folder.py        "folder:/path/to/root": a folder of images, root/<split>/<class>/<files>
    offline.py       "fashion_mnist_local": the offline default, Debian's Fashion-MNIST files
    tfds_catalog.py  any other name: a dataset of the TFDS catalog (cifar10, imagenet2012, ...)

A new kind of source is one new module with a `DataSource` subclass, added to `kinds()`. Importing
this package loads neither TensorFlow nor TFDS: the config checks ask a source about its name before
anything slow starts. """


class DataSource:
    """One dataset, as `config.dataset` and `config.data_dir` name it.

    A subclass says which names it reads (`matches`), what is wrong with the name that can be
    found at once (`problems`), and gives the dataset to each pipeline: a prepared TFDS builder
    (or `tfds.folder_dataset.ImageFolder`) for tf.data, which numbers its records itself
    (train.data.records), and, where it can be read without TensorFlow, a split as numbered
    records for Grain.
    """

    # How the name looks, for the list of choices in an error message.
    described = ""

    def __init__(self, dataset, data_dir=None):
        self.dataset, self.data_dir = dataset, data_dir

    @classmethod
    def matches(cls, dataset):
        """Whether `dataset` (config.dataset) names a dataset of this kind."""
        raise NotImplementedError

    def problems(self):
        """What is wrong with the dataset that shows without TensorFlow (a folder that does
        not exist, ...), as `config.dataset=...: what to do` strings; [] when nothing shows."""
        return []

    def builder(self):
        """The TFDS builder the tf.data pipeline reads, prepared (loads TensorFlow). Raises
        ValueError when there is no such dataset, or it holds no readable images."""
        raise NotImplementedError

    def grain_problem(self):
        """Why the Grain pipeline cannot read the dataset without TensorFlow; "" when it can."""
        return f"dataset {self.dataset!r} is read with TensorFlow"

    def grain_split(self, split):
        """Records of `split` (any TFDS split expression) for Grain: `len()`, `[i]` as
        `(image: encoded bytes or a uint8 array, label, i)`, and `class_names`. Raises
        ValueError (or TFDS' KeyError or AssertionError) for a split the dataset lacks."""
        raise NotImplementedError(self.grain_problem())


def kinds():
    """Every kind of source, in the order names are matched: the catalog takes any name."""
    from . import folder, offline, tfds_catalog

    return (folder.Folder, offline.FashionMnistOffline, tfds_catalog.Catalog)


def get(dataset, data_dir=None):
    """The `DataSource` of `dataset` (config.dataset) in `data_dir` (config.data_dir)."""
    return next(kind for kind in kinds() if kind.matches(dataset))(dataset, data_dir)


def of(config):
    """The `DataSource` of a run's config (`config.dataset`, `config.data_dir`)."""
    return get(config["dataset"], config.get("data_dir"))


def choices():
    """Every kind of name `config.dataset` takes, for error messages."""
    return ", ".join(kind.described for kind in reversed(kinds()))
