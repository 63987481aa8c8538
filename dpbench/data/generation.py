"""Table-to-text generation data (E2E, DART) and an offline stand-in built from SST-2.

Each example is (source, target): prompt ``"<source> =>"``, then ``" <target><eos>"``. Training
tensors are (input_ids, attention_mask, labels) padded right to max_source_length +
max_target_length + 1, with labels -100 on the prompt and padding (the loss covers the target
only). For decoding, the test prompts are also stored left-padded with their references in
``TaskData.extras["generation"]``. E2E and DART load through Hugging Face ``datasets`` (users'
machines); ``sst2_gen`` (sentence => positive / negative) reads the offline SST-2 copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import TaskData, resolve_data_root, subset_indices
from dpbench.data.text import GLUE, read_tsv
from dpbench.errors import ConfigError, DataError
from dpbench.utils.pretrained import TINY_RANDOM_LM, load_tokenizer

Pairs = list[tuple[str, list[str]]]  # (source, references); training uses the first reference


def _encode(tok, sources: Sequence[str], targets: Sequence[str], max_source: int,
            max_target: int) -> TensorDataset:
    length = max_source + max_target + 1
    ids = torch.full((len(sources), length), tok.pad_token_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, (src, tgt) in enumerate(zip(sources, targets)):
        p = tok(f"{src} =>", add_special_tokens=False)["input_ids"][:max_source]
        t = tok(f" {tgt}", add_special_tokens=False)["input_ids"][:max_target]
        t = t + [tok.eos_token_id]
        ids[i, :len(p) + len(t)] = torch.tensor(p + t)
        labels[i, len(p):len(p) + len(t)] = torch.tensor(t)
        mask[i, :len(p) + len(t)] = 1
    return TensorDataset(ids, mask, labels)


def _prompts(tok, sources: Sequence[str], max_source: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(sources), max_source), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, src in enumerate(sources):  # left padding: decoding continues from the last column
        p = tok(f"{src} =>", add_special_tokens=False)["input_ids"][:max_source]
        ids[i, max_source - len(p):] = torch.tensor(p)
        mask[i, max_source - len(p):] = 1
    return ids, mask


def build_generation(name: str, train: Pairs, test: Pairs, tokenizer: str = TINY_RANDOM_LM,
                     max_source_length: int = 48, max_target_length: int = 32,
                     train_size: int | None = None, test_size: int | None = None) -> TaskData:
    """Return a generation task: training tensors, test tensors, and prompts + references."""
    if max_source_length < 4 or max_target_length < 1:
        raise ConfigError("dataset.max_source_length must be >= 4 and max_target_length >= 1")
    tok = load_tokenizer(tokenizer)
    tr = [train[i] for i in subset_indices(len(train), train_size)]
    te = [test[i] for i in subset_indices(len(test), test_size)]
    notes = [f"{name}: a fixed subset of {len(tr)} of {len(train)} training pairs"
             ] if len(tr) < len(train) else []
    prompt_ids, prompt_mask = _prompts(tok, [s for s, _ in te], max_source_length)
    return TaskData(
        name=name, task="text_generation",
        train=_encode(tok, [s for s, _ in tr], [r[0] for _, r in tr], max_source_length,
                      max_target_length),
        test=_encode(tok, [s for s, _ in te], [r[0] for _, r in te], max_source_length,
                     max_target_length),
        input_shape=(max_source_length + max_target_length + 1,), notes=notes,
        extras={"generation": {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
                               "references": [r for _, r in te],
                               "decode": lambda ids: tok.batch_decode(
                                   ids, skip_special_tokens=True),
                               "max_new_tokens": max_target_length + 1}})


def _hf_pairs(dataset: str, config: str | None, split: str, source, targets) -> Pairs:
    try:
        import datasets
    except ImportError as err:
        raise DataError(f"{dataset} needs the `datasets` package (pip install datasets) and "
                        "network access on first use") from err
    try:
        ds = datasets.load_dataset(dataset, config, split=split)
    except Exception as err:
        raise DataError(f"cannot load {dataset} through `datasets`: {err}") from err
    return [(source(row), targets(row)) for row in ds]


@register_dataset("e2e", settings_from=build_generation)
def build_e2e(**settings) -> TaskData:
    """Return E2E NLG (Novikova et al. 2017): meaning representation -> restaurant text."""
    args = ("e2e_nlg", None)
    src, tgt = (lambda r: r["meaning_representation"]), (lambda r: [r["human_reference"]])
    return build_generation("e2e", _hf_pairs(*args, "train", src, tgt),
                            _hf_pairs(*args, "test", src, tgt), **settings)


@register_dataset("dart", settings_from=build_generation)
def build_dart(**settings) -> TaskData:
    """Return DART (Nan et al. 2021): RDF triples -> text; all references kept for BLEU."""
    def src(r):
        return " | ".join(" : ".join(t) for t in r["tripleset"])

    def tgt(r):
        return list(r["annotations"]["text"]) or [""]

    return build_generation("dart", _hf_pairs("dart", None, "train", src, tgt),
                            _hf_pairs("dart", None, "test", src, tgt), **settings)


@register_dataset("sst2_gen", settings_from=build_generation)
def build_sst2_gen(root=None, **settings) -> TaskData:
    """Return SST-2 as generation (sentence => positive / negative): the offline stand-in."""
    base = resolve_data_root(root)
    folder = base / "SST-2" if base is not None else None
    if folder is None or not (folder / "train.tsv").is_file():
        raise DataError("sst2_gen reads SST-2/train.tsv and dev.tsv under paths.data_root")
    words = ("negative", "positive")
    pairs = []
    for file in ("train.tsv", "dev.tsv"):
        texts, labels = read_tsv(folder / file, GLUE["sst2"])
        pairs.append([(t[0], [words[y]]) for t, y in zip(texts, labels)])
    return build_generation("sst2_gen", pairs[0], pairs[1], **settings)
