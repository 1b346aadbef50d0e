"""Any dataset of the TFDS catalog by name (`config.dataset = "cifar10"`, "imagenet2012", ...),
in `config.data_dir`: prepared by TFDS in the format it has (most in TFRecord files, read in
order), or as ArrayRecord (`tfds build NAME --file_format=array_record`: read at random, and
by Grain without TensorFlow)."""

from . import DataSource, choices


class Catalog(DataSource):
    described = "a TFDS name (e.g. cifar10, imagenet2012)"

    @classmethod
    def matches(cls, dataset):
        return True

    def builder(self):
        import tensorflow_datasets as tfds

        try:
            builder = tfds.builder(self.dataset, data_dir=self.data_dir)
        except tfds.core.registered.DatasetNotFoundError as error:
            raise ValueError(f"Unknown dataset {self.dataset!r}: use {choices()}.") from error
        builder.download_and_prepare()  # a dataset already prepared keeps its format
        return builder

    def grain_problem(self):
        file_format = self._file_format()
        if file_format == "array_record":
            return ""
        if file_format is None:
            return (f"dataset {self.dataset!r} is not prepared in "
                    f"{self.data_dir or 'TFDS data_dir'}, and TFDS prepares datasets with "
                    "TensorFlow: prepare it where TensorFlow is installed, as ArrayRecord "
                    f"(`tfds build {self.dataset} --file_format=array_record`)")
        return (f"dataset {self.dataset!r} is stored as {file_format}, which only TensorFlow "
                f"reads (and not at random): prepare it as ArrayRecord (`tfds build "
                f"{self.dataset} --file_format=array_record`)")

    def _file_format(self):
        """The file format of the prepared dataset; None if it is not prepared."""
        import tensorflow_datasets as tfds

        try:
            builder = tfds.builder(self.dataset, data_dir=self.data_dir)
        except Exception:  # an unknown name: the tf.data pipeline says so, listing the choices
            return None
        return builder.info.file_format.value if builder.is_prepared() else None

    def grain_split(self, split):
        import tensorflow_datasets as tfds

        return ArrayRecords(tfds.builder(self.dataset, data_dir=self.data_dir), split)


class ArrayRecords:
    """`split` of a TFDS dataset (`builder`) prepared as ArrayRecord, through TFDS' data
    source (no TensorFlow): the image left encoded. Pickled as its folder and split, and opened
    again (Grain's worker processes)."""

    def __init__(self, builder, split):
        from ..input_plan import class_names

        self.class_names = class_names(builder.info.features["label"])
        self.directory, self.split = str(builder.data_dir), split
        self._open()

    def _open(self):
        import tensorflow_datasets as tfds

        self.records = tfds.builder_from_directory(self.directory).as_data_source(
            self.split, decoders={"image": tfds.decode.SkipDecoding()})

    def __getstate__(self):
        return {name: value for name, value in self.__dict__.items() if name != "records"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._open()

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        record = self.records[index]
        return record["image"], int(record["label"]), index
