"""The error every reader of a prepared dataset raises (a leaf: it imports nothing of ours)."""


class DatasetError(ValueError):
    """A prepared dataset (or one of its files) is missing, truncated, corrupt or of another
    version. The message names the file and the problem on one line."""


class NotPrepared(DatasetError):
    """Nothing prepared at `path`: nothing exists there, or a folder without dataset.json.
    `turbotrain.datasets.open_dataset` says what the path is instead (a SOURCE, with the
    commands that prepare it: sources/detect.not_prepared_line); beton/ cannot look."""

    def __init__(self, message: str, path):
        super().__init__(message)
        self.path = path
