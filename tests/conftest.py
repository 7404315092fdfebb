import os, sys

# Test oracles (megatron_reference.py) are imported as plain modules.
sys.path.insert(0, os.path.dirname(__file__))
