"""Text classification data for the RNN preset: AG News-style CSV files (label, title, text; no header, labels
1..num_classes as in the original release, a header row is skipped), an in-package tokenizer and a vocabulary
of at most `vocab_size` entries built from the training file.

The driver builds the vocabulary once per data directory (under a file lock) and stores it beside the data as
vocab-<vocab_size>.json, so every worker encodes with the same one. Offline, `data.synthetic: true` writes a
generated corpus in the same CSV form (each class has its own topic words among shared filler words, so the
classes are learnable) and everything else runs as for the real files.
"""

from __future__ import annotations

import collections
import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import Field

from raytrain.data import DataContext, DataSource, DataUnavailable, check_generated_size, splits, tensor_dataset
from raytrain.rundir import atomicfile

PAD, UNK = 0, 1  # reserved ids; the model's embedding uses PAD as padding_idx
TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


@dataclass
class Text(DataSource):
    data_dir: str = ""  # directory with the CSVs; "" = <storage>/datasets/ag_news
    train_file: str = "train.csv"
    val_file: str = "test.csv"
    num_classes: Annotated[int, Field(ge=2)] = 4
    vocab_size: Annotated[int, Field(ge=3)] = 20000  # most frequent training tokens, incl. reserved <pad> and <unk>
    max_len: Annotated[int, Field(gt=0)] = 128  # tokens kept per document (title + text)
    synthetic: bool = False  # true: a generated corpus with learnable classes (offline, tests)
    synthetic_train: Annotated[int, Field(gt=0)] = 4000
    synthetic_val: Annotated[int, Field(gt=0)] = 800

    def prepare(self, ctx: DataContext) -> None:
        prepare(self, ctx)

    def datasets(self, ctx: DataContext) -> dict:
        return splits(*torch_datasets(self, ctx))

    def check(self, cfg, fail) -> None:
        check(self, cfg, fail)


def tokenize(text: str) -> list[str]:
    return TOKEN.findall(text.lower())


# ----------------------------------------------------------------------------------------------------------
# files


def data_dir(p: Text, ctx) -> Path:
    if p.synthetic:
        return ctx.root / f"text-synthetic-{p.num_classes}c-{p.synthetic_train}-{p.synthetic_val}-seed{ctx.seed}"
    return Path(p.data_dir).expanduser().absolute() if p.data_dir else ctx.root / "ag_news"


def read_csv(path: Path, num_classes: int) -> tuple[list[str], np.ndarray]:
    """(documents, 0-based labels). Errors name the file, the line and the fix."""
    docs, labels = [], []
    with open(path, newline="", encoding="utf-8") as handle:
        for line_no, row in enumerate(csv.reader(handle), start=1):
            if not row:
                continue
            if len(row) < 2:
                raise DataUnavailable(f"{path}:{line_no}: expected label,title,text columns, got {len(row)} column(s). "
                                      f"Fix: write AG News-style CSV rows: label (1..{num_classes}), title, text.")
            try:
                label = int(row[0])
            except ValueError:
                if line_no == 1:  # a header row
                    continue
                raise DataUnavailable(f"{path}:{line_no}: label '{row[0]}' is not an integer. "
                                      f"Fix: use class numbers 1..{num_classes} in the first column.") from None
            if not 1 <= label <= num_classes:
                raise DataUnavailable(f"{path}:{line_no}: label {label} is outside 1..{num_classes}. Fix: number the "
                                      f"classes from 1, or set data.num_classes (and model.num_classes).")
            docs.append(" ".join(row[1:]))
            labels.append(label - 1)
    if not docs:
        raise DataUnavailable(f"{path}: holds no rows. Fix: give a CSV with label,title,text rows.")
    return docs, np.asarray(labels, dtype=np.int64)


def build_vocab(docs: list[str], vocab_size: int) -> dict[str, int]:
    """The vocab_size - 2 most frequent tokens (ties broken alphabetically, so every build agrees)."""
    counts = collections.Counter(token for doc in docs for token in tokenize(doc))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: vocab_size - 2]
    return {"<pad>": PAD, "<unk>": UNK, **{token: i for i, (token, _) in enumerate(ranked, start=2)}}


def encode(docs: list[str], vocab: dict[str, int], max_len: int) -> np.ndarray:
    out = np.zeros((len(docs), max_len), dtype=np.int64)
    for row, doc in enumerate(docs):
        ids = [vocab.get(token, UNK) for token in tokenize(doc)[:max_len]]
        out[row, : len(ids)] = ids
    return out


def vocab_path(p: Text, ctx) -> Path:
    return data_dir(p, ctx) / f"vocab-{p.vocab_size}.json"


# ----------------------------------------------------------------------------------------------------------
# the generated corpus


def synthetic_rows(n: int, num_classes: int, seed: int) -> list[tuple[int, str, str]]:
    rng = np.random.default_rng(seed)
    filler = [f"w{i}" for i in range(300)]
    topics = [[f"topic{c}x{k}" for k in range(15)] for c in range(num_classes)]
    rows = []
    for _ in range(n):
        label = int(rng.integers(num_classes))
        words = list(rng.choice(filler, size=int(rng.integers(8, 25))))
        for word in rng.choice(topics[label], size=int(rng.integers(2, 5))):
            words.insert(int(rng.integers(len(words) + 1)), str(word))
        rows.append((label + 1, " ".join(words[:4]), " ".join(words[4:])))
    return rows


def write_synthetic(p: Text, ctx, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, n, seed in ((p.train_file, p.synthetic_train, ctx.seed), (p.val_file, p.synthetic_val, ctx.seed + 1)):
        target = directory / name
        if target.exists():
            continue
        def write(tmp: Path, n=n, seed=seed) -> None:
            with open(tmp, "w", newline="", encoding="utf-8") as handle:
                csv.writer(handle).writerows(synthetic_rows(n, p.num_classes, seed))

        atomicfile.write_atomic(target, write)


# ----------------------------------------------------------------------------------------------------------
# what the DataSource hooks call


def prepare(p: Text, ctx) -> None:
    """Driver side: generate the synthetic corpus if asked, check the files, build the vocabulary once."""
    from filelock import FileLock

    directory = data_dir(p, ctx)
    if not p.synthetic:
        missing = [name for name in (p.train_file, p.val_file) if not (directory / name).is_file()]
        if missing:
            raise DataUnavailable(
                f"{', '.join(missing)} not found in {directory}. Fix: put AG News-style CSV files (label,title,text; "
                f"e.g. train.csv and test.csv of the AG News release) there, or point data.data_dir at them (the "
                f"environment file), or set data.synthetic=true for a generated corpus."
            )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with FileLock(str(directory / ".text.lock")):
            if p.synthetic:
                write_synthetic(p, ctx, directory)
            if not vocab_path(p, ctx).is_file():
                docs, _ = read_csv(directory / p.train_file, p.num_classes)
                atomicfile.write_atomic(vocab_path(p, ctx), json.dumps(build_vocab(docs, p.vocab_size)))
    except OSError as err:
        raise DataUnavailable(f"cannot write to {directory} ({err.strerror}). Fix: make the data directory "
                              f"writable: the vocabulary is stored beside the data.") from None


def load_vocab(p: Text, ctx) -> dict[str, int]:
    path = vocab_path(p, ctx)
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    docs, _ = read_csv(data_dir(p, ctx) / p.train_file, p.num_classes)
    return build_vocab(docs, p.vocab_size)


def torch_datasets(p: Text, ctx):
    vocab = load_vocab(p, ctx)

    def split(name: str):
        docs, labels = read_csv(data_dir(p, ctx) / name, p.num_classes)
        return tensor_dataset(encode(docs, vocab, p.max_len), labels)

    return split(p.train_file), split(p.val_file)


def check(p: Text, cfg, fail):
    if p.synthetic:  # each document as data.max_len int64 token ids
        check_generated_size(fail, "data.synthetic_train", p.synthetic_train + p.synthetic_val, 8 * p.max_len,
                             "synthetic documents (training and validation)")
    if p.vocab_size < 3:
        fail("data.vocab_size", f"{p.vocab_size} leaves no room for words next to <pad> and <unk>", "use e.g. 20000")
    if p.max_len < 1:
        fail("data.max_len", f"{p.max_len} must be >= 1", "use e.g. 128")
    if p.num_classes < 2:
        fail("data.num_classes", f"{p.num_classes} is not a classification", "use 4 for AG News")
    if p.synthetic and min(p.synthetic_train, p.synthetic_val) < cfg.scaling.max_workers:
        fail("data.synthetic_train", f"{p.synthetic_train}/{p.synthetic_val} documents are too few for "
             f"{cfg.scaling.max_workers} workers", "generate at least one document per worker in each split")
    model = cfg.model_kwargs
    if model.get("vocab_size", p.vocab_size) < p.vocab_size:
        fail("model.vocab_size", f"{model['vocab_size']} is smaller than data.vocab_size {p.vocab_size}",
             f"set model.vocab_size to at least {p.vocab_size}")
    if model.get("num_classes", p.num_classes) != p.num_classes:
        fail("model.num_classes", f"the data has data.num_classes={p.num_classes} classes",
             f"set model.num_classes={p.num_classes}")
