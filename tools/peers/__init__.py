"""Peer adapters for tools/bench_loader.py and tools/bench_tokenize.py: one small module per tool.

Every adapter runs in its own subprocess (tools/peers/harness.py), so an import conflict or a crash
costs that tool only, and the memory measured is that tool's. Module names end in `_peer` so that
they never shadow the package they wrap.
"""
