"""The `rapidgpt` console script.

Until the engine lands this only reports the version; flags are parsed by argparse so that
`--help` and `--version` behave as users expect.
"""
import argparse
import sys

from rapidgpt import __version__


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="rapidgpt",
        description="Megatron-style LLM trainer on MindSpore. Training entry points arrive with "
                    "the engine; data tools live in data_tools/.")
    parser.add_argument("--version", action="version", version=f"rapidgpt {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
