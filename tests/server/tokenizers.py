"""The tokenizer the server tests speak through: the bundled one, or (before it exists) one trained on a slice of
the standard library."""

import sysconfig
from pathlib import Path

from kestrel.models.registry import BUNDLED


def tokenizer_dir(tmp_path_factory) -> Path | None:
    """None when the bundled tokenizer is there (k3-tiny finds it), else a freshly trained one."""
    if (BUNDLED / "tokenizer.json").exists():
        return None
    from kestrel.train.tokenizer_train import train_tokenizer

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:60]
    return train_tokenizer([f.read_text(errors="replace") for f in files], tmp_path_factory.mktemp("tokenizer"))
