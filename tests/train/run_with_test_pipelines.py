"""`python -m tests.train.run_with_test_pipelines ARGS`: the `train` command with the in-test
pipelines registered, for tests that need a separate process (kill -9, SIGTERM)."""
import sys

from tests.train import memory_pipeline  # noqa: F401  (registers test-memory and test-slow)
from turbotrain.cli import main
from turbotrain.process_end import run_as_process

if __name__ == "__main__":
    run_as_process(main, ["train", *sys.argv[1:]])
