"""The S3 server fixtures (s3_server.py) for every test in tests/datasets."""
from .s3_server import denied_s3_server, s3_server  # noqa: F401
