"""parse_size(): the one reader of sizes for --shard-size, --cache-limit and
$TURBOTRAIN_CACHE_LIMIT."""
import pytest

from turbotrain.sizes import SizeError, parse_size


@pytest.mark.parametrize("text, nbytes", [
    ("1GB", 10**9), ("512MB", 512 * 10**6), ("50gb", 50 * 10**9), ("1.5g", 1_500_000_000),
    ("64MiB", 64 << 20), ("512mi", 512 << 20), ("2KiB", 2048), (" 1 TB ", 10**12),
    ("268435456", 268435456), ("10b", 10), (4096, 4096),
])
def test_decimal_and_binary_units(text, nbytes):
    assert parse_size(text, "--x") == nbytes


@pytest.mark.parametrize("bad", ["", "0", "0GB", "-1GB", "12 parsecs", "1XB", "1ib", "lots",
                                 True, 0])
def test_refusals_are_one_line_naming_the_flag(bad):
    with pytest.raises(SizeError, match="^--shard-size ") as err:
        parse_size(bad, "--shard-size")
    assert "\n" not in str(err.value)


def test_a_control_character_is_shown_escaped():
    with pytest.raises(SizeError) as err:
        parse_size("1\x1b[2JGB", "--cache-limit")
    assert "\x1b" not in str(err.value) and r"\x1b" in str(err.value)
