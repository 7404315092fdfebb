"""What the Hugging Face conversion tests share (test_hf_gpt2.py, test_hf_bert.py): a converter
script of data_tools/ as a module, and module fixtures for a transformers-written fixture folder."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def conversion_fixtures(folder, script):
    """`(convert, expected, converted)`: data_tools/`script`.py as a module; and two module-scoped
    fixtures: the folder's expected.npz (transformers' outputs) and the folder converted to a
    RapidGPT checkpoint by the script's command line."""
    spec = importlib.util.spec_from_file_location(script, ROOT / "data_tools" / f"{script}.py")
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)

    @pytest.fixture(scope="module")
    def expected():
        return dict(np.load(folder / "expected.npz"))

    @pytest.fixture(scope="module")
    def converted(tmp_path_factory):
        save = tmp_path_factory.mktemp("converted") / "ckpt"
        assert convert.main(["--hf-dir", str(folder), "--save", str(save)]) == 0
        return save

    return convert, expected, converted
