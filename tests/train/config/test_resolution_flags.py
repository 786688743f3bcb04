"""The progressive-resizing settings as flags, YAML and saved settings, and their checks."""
from __future__ import annotations

import pytest

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.config.config_files import config_from_namespace, load_yaml, save_yaml
from turbotrain.train.errors import TrainError

from .test_config import parse


def test_the_flags():
    args = parse("--min-res", 160, "--max-res", 192, "--res-ramp", 11, 13, "--progressive")
    assert (args.min_res, args.max_res, args.res_ramp, args.progressive) == (160, 192, [11, 13],
                                                                             True)
    assert parse("--no-progressive").progressive is False
    config = config_from_namespace(parse("--data", "d", "--res-ramp", 11, 13))
    assert config.res_ramp == (11.0, 13.0)


def test_yaml_keys_and_the_saved_config_round_trip(tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("data: d\nmin_res: 160\nmax_res: 192\nres_ramp: [11, 13]\n")
    config = config_from_namespace(parse("--config", yaml_file))
    assert (config.min_res, config.max_res, config.res_ramp) == (160, 192, (11.0, 13.0))
    resolved = config.replace(progressive=True, image_size=192, max_res=None, out=str(tmp_path),
                              config=None)
    save_yaml(resolved, tmp_path / "config.yaml")
    assert TrainConfig(**load_yaml(tmp_path / "config.yaml")) == resolved
    resumed = config_from_namespace(parse("--out", tmp_path, "--resume", "--epochs", "20"))
    assert (resumed.progressive, resumed.min_res, resumed.res_ramp) == (True, 160, (11.0, 13.0))


def test_a_run_saved_before_progressive_resizing_resumes_at_one_size(tmp_path):
    save_yaml(TrainConfig(data="d", image_size=224, out=str(tmp_path)), tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text("".join(
        line for line in text.splitlines(True)
        if not line.startswith(("progressive:", "min-res:", "max-res:", "res-ramp:"))))
    assert config_from_namespace(parse("--out", tmp_path, "--resume")).progressive is False
    assert config_from_namespace(parse("--data", "d")).progressive is None  # a new run decides


@pytest.mark.parametrize("settings, message", [
    (dict(max_res=192, image_size=224), "--max-res 192 and --image-size 224 both set"),
    (dict(min_res=256, max_res=192), "--min-res 256 is above --max-res 192"),
    (dict(min_res=4), "--min-res must be at least 8"),
    (dict(res_ramp=(13.0, 11.0)), "--res-ramp needs epochs 0 <= START <= END"),
    (dict(progressive=False, min_res=160), "--no-progressive turns off"),
])
def test_contradictions_are_one_line(settings, message):
    with pytest.raises(TrainError, match=message.replace("(", r"\(")):
        TrainConfig(data="d", **settings).validate()
