"""A `sitecustomize` body that records, in $PANDAS_WATCH, the pid of every process that imports pandas: the
tokenize and loader paths must not pay its import."""

from __future__ import annotations


HOOK = '''
import os, sys
class _Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            open(os.path.join(os.environ["PANDAS_WATCH"], str(os.getpid())), "w").close()
        return None
sys.meta_path.insert(0, _Watch())
'''
