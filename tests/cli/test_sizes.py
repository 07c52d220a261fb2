"""Sizes and counts as people write and read them."""

import pytest

from dataflow.errors import ConfigError
from dataflow.sizes import count, parse_size


def test_counts_agree_in_number():
    assert count(1, "shard") == "1 shard" and count(0, "shard") == "0 shards"
    assert count(12345, "document") == "12,345 documents" and count(2, "copy", "copies") == "2 copies"


@pytest.mark.parametrize("text,value", [("256MB", 256 << 20), ("1.5GiB", int(1.5 * (1 << 30))), ("1048576", 1 << 20),
                                        (" 64 kb ", 64 << 10), (4096, 4096)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["lots", "-1MB", "0", "1e400GB", "nanMB", "infGB", "1e30TB", 0, -5, ""])
def test_bad_sizes_are_one_config_error(text):
    with pytest.raises(ConfigError, match="size"):
        parse_size(text)
