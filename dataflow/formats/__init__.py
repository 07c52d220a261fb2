"""The on-disk format: the manifest, the shard formats (`shard_format(name)`), their writer and readers."""

from dataflow.formats.shard_formats import ShardFormat, shard_format

__all__ = ["ShardFormat", "shard_format"]
