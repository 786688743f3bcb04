"""The error every reader of a prepared dataset raises (a leaf: it imports nothing of ours)."""


class DatasetError(ValueError):
    """A prepared dataset (or one of its files) is missing, truncated, corrupt or of another
    version. The message names the file and the problem on one line."""
