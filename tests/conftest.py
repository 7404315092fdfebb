import os, sys

# Test oracles (megatron_reference.py) are imported as plain modules.
sys.path.insert(0, os.path.dirname(__file__))

import pytest


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory):
    """A fresh RAPIDGPT_CACHE_DIR for the tests that train in this process: the demo corpus is
    built into it once per session."""
    previous = os.environ.get("RAPIDGPT_CACHE_DIR")
    os.environ["RAPIDGPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if previous is None:
        os.environ.pop("RAPIDGPT_CACHE_DIR", None)
    else:
        os.environ["RAPIDGPT_CACHE_DIR"] = previous
