"""GLUE text classification (SST-2, QNLI, MNLI) tokenised once with the model's tokenizer.

Order of preference: the GLUE TSV files under ``<data_root>/<SST-2|QNLI|MNLI>/`` (GLUE's own
layout, e.g. an offline copy, docs/data.md), else Hugging Face ``datasets`` on users'
machines. Evaluation uses GLUE's labelled dev split (``dev.tsv``; MNLI: ``dev_matched.tsv``).
Tokenisation is the pretrained tokenizer's fixed vocabulary, padded/truncated to
``max_length``: nothing is fitted to the private data. CPU presets take a fixed subset
(``train_size``, ``test_size``: the first indices of a permutation fixed by SPLIT_SEED).
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import TaskData, read_failed, resolve_data_root, subset_indices
from dpbench.errors import DataError
from dpbench.utils.pretrained import OFFLINE_DEFAULT, load_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlueSpec:
    folder: str  # GLUE folder name
    hf_name: str  # datasets.load_dataset("glue", hf_name)
    text_columns: tuple[str, ...]  # TSV columns (the HF names are the same, lower-case)
    label_column: str
    labels: tuple[str, ...]  # label strings in the TSV -> class index
    dev_file: str = "dev.tsv"
    hf_dev: str = "validation"
    hf_columns: tuple[str, ...] = ()  # when the HF names differ from the TSV's


GLUE = {
    "sst2": GlueSpec("SST-2", "sst2", ("sentence",), "label", ("0", "1")),
    "qnli": GlueSpec("QNLI", "qnli", ("question", "sentence"), "label",
                     ("entailment", "not_entailment")),
    "mnli": GlueSpec("MNLI", "mnli", ("sentence1", "sentence2"), "gold_label",
                     ("entailment", "neutral", "contradiction"), "dev_matched.tsv",
                     "validation_matched", ("premise", "hypothesis")),
}


def read_tsv(path: Path, spec: GlueSpec) -> tuple[list[tuple[str, ...]], list[int]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        texts = [tuple(r[c].strip() for c in spec.text_columns) for r in rows]
        labels = [spec.labels.index(r[spec.label_column].strip()) for r in rows]
    except (KeyError, ValueError, csv.Error, UnicodeDecodeError, TypeError) as err:
        raise read_failed(path, err) from err
    return texts, labels


def _load_hf(spec: GlueSpec, split: str) -> tuple[list[tuple[str, ...]], list[int]]:
    try:
        import datasets
    except ImportError as err:
        raise DataError(f"GLUE {spec.folder} not found under paths.data_root and the "
                        "`datasets` package is not installed; set paths.data_root to a folder "
                        f"holding {spec.folder}/train.tsv and {spec.dev_file}") from err
    try:
        ds = datasets.load_dataset("glue", spec.hf_name, split=split)
    except Exception as err:  # network, cache: one clear message
        raise DataError(f"cannot load GLUE {spec.hf_name} through `datasets`: {err}") from err
    cols = spec.hf_columns or spec.text_columns
    texts = list(zip(*(ds[c] for c in cols)))
    return texts, list(ds["label"])


def _tokenise(tokenizer, texts: list[tuple[str, ...]], labels: list[int],
              max_length: int) -> TensorDataset:
    columns = list(zip(*texts)) if texts else [[]]
    enc = tokenizer(*[list(c) for c in columns], padding="max_length", truncation=True,
                    max_length=max_length, return_tensors="pt")
    return TensorDataset(enc["input_ids"], enc["attention_mask"],
                         torch.tensor(labels, dtype=torch.long))


def build_glue(task: str, root=None, tokenizer: str = OFFLINE_DEFAULT, max_length: int = 64,
               train_size: int | None = None, test_size: int | None = None) -> TaskData:
    """Return a GLUE task tokenised as (input_ids, attention_mask, label) tensors."""
    spec = GLUE[task]
    if not isinstance(max_length, int) or max_length < 8:
        from dpbench.errors import ConfigError

        raise ConfigError(f"dataset.max_length must be an integer >= 8 (got {max_length!r})")
    base = resolve_data_root(root)
    folder = base / spec.folder if base is not None else None
    notes = []
    if folder is not None and (folder / "train.tsv").is_file():
        train = read_tsv(folder / "train.tsv", spec)
        test = read_tsv(folder / spec.dev_file, spec)
        log.info("GLUE %s TSV from %s; evaluated on %s", spec.folder, folder, spec.dev_file)
    else:
        train, test = _load_hf(spec, "train"), _load_hf(spec, spec.hf_dev)
        log.info("GLUE %s through `datasets`; evaluated on %s", spec.hf_name, spec.hf_dev)
    tok = load_tokenizer(tokenizer)
    parts = []
    for (texts, labels), size in ((train, train_size), (test, test_size)):
        idx = subset_indices(len(labels), size)
        if size is not None and size < len(labels):
            notes.append(f"{spec.folder}: a fixed subset of {len(idx)} of {len(labels)} "
                         f"{'training' if size is train_size else 'dev'} examples")
        parts.append(_tokenise(tok, [texts[i] for i in idx], [labels[i] for i in idx],
                               max_length))
    return TaskData(name=task, task="text_classification", train=parts[0], test=parts[1],
                    num_classes=len(spec.labels), input_shape=(max_length,),
                    class_names=list(spec.labels), notes=notes,
                    extras={"tokenizer": tokenizer})


@register_dataset("sst2", settings_from=build_glue)
def build_sst2(**settings) -> TaskData:
    """Return GLUE SST-2 (binary sentiment): 67349 train / 872 dev sentences at full size."""
    return build_glue("sst2", **settings)


@register_dataset("qnli", settings_from=build_glue)
def build_qnli(**settings) -> TaskData:
    """Return GLUE QNLI (question / sentence entailment, 2 classes)."""
    return build_glue("qnli", **settings)


@register_dataset("mnli", settings_from=build_glue)
def build_mnli(**settings) -> TaskData:
    """Return GLUE MNLI (premise / hypothesis, 3 classes; dev = matched)."""
    return build_glue("mnli", **settings)
