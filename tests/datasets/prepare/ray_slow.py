"""A Ray worker setup hook for the engine tests: every image takes SECONDS longer to encode, so
a part lasts long enough (~0.4 s for 5 images) to be killed in the middle. Only the Ray
workers of the tests' cluster run it; the local runs they are compared with are not slowed."""
from __future__ import annotations

import time

SECONDS = 0.08


def slow_encoding() -> None:
    # lazy: runs in a Ray worker, where it patches the module the part tasks use
    from turbotrain.datasets.prepare import convert
    encode = convert.encode_sample

    def slowed(*args, **kwargs):
        time.sleep(SECONDS)
        return encode(*args, **kwargs)

    convert.encode_sample = slowed
