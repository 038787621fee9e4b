"""training/raytrain/data/text.py and the text-rnn layout: tokenizer, vocabulary, CSV reading, the generated corpus, and
the preset's hyperparameters and environment files (config `include:`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raytrain.data import DataContext, DataUnavailable
from raytrain.data import text
from raytrain.spec.config import ConfigError, load_config


def test_tokenize_lowercases_and_keeps_contractions():
    assert text.tokenize("Wall St. Bears' claw BACK, isn't it? 2024") == [
        "wall", "st", "bears", "claw", "back", "isn't", "it", "2024"]


def test_vocabulary_is_bounded_frequency_ranked_and_reproducible():
    docs = ["b b b a a c", "a b d"]
    vocab = text.build_vocab(docs, vocab_size=4)
    assert vocab == {"<pad>": 0, "<unk>": 1, "b": 2, "a": 3}
    assert text.build_vocab(list(reversed(docs)), 4) == vocab


def test_encode_pads_truncates_and_marks_unknown_words():
    vocab = {"<pad>": 0, "<unk>": 1, "good": 2, "news": 3}
    out = text.encode(["good news", "good unknown news today again"], vocab, max_len=3)
    assert out.tolist() == [[2, 3, 0], [2, 1, 3]]


def write_csv(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def test_read_csv_skips_a_header_and_makes_labels_zero_based(tmp_path):
    path = write_csv(tmp_path / "t.csv", 'Class Index,Title,Description\n3,"Title, with comma",Body\n1,T,B\n')
    docs, labels = text.read_csv(path, 4)
    assert docs == ["Title, with comma Body", "T B"] and labels.tolist() == [2, 0]


@pytest.mark.parametrize("body, where, fix", [
    ("1,t,b\nx,t,b\n", ":2:", "class numbers"),
    ("1,t,b\n5,t,b\n", ":2:", "data.num_classes"),
    ("1\n", ":1:", "label,title,text"),
    ("", "holds no rows", "label,title,text"),
])
def test_bad_csv_rows_name_the_file_line_and_fix(tmp_path, body, where, fix):
    path = write_csv(tmp_path / "bad.csv", body)
    with pytest.raises(DataUnavailable) as err:
        text.read_csv(path, 4)
    assert str(path) in str(err.value) and where in str(err.value) and fix in str(err.value)


def test_synthetic_corpus_classes_are_learnable_from_their_topic_words():
    rows = text.synthetic_rows(300, num_classes=4, seed=0)
    for label, title, body in rows:
        words = text.tokenize(f"{title} {body}")
        topics = {int(w[5]) for w in words if w.startswith("topic")}
        assert topics == {label - 1}


def test_prepare_generates_the_corpus_and_stores_the_vocabulary_once(tmp_path):
    p = text.Text(synthetic=True, synthetic_train=200, synthetic_val=50, vocab_size=100, max_len=16)
    ctx = DataContext(root=tmp_path)
    text.prepare(p, ctx)
    vocab = json.loads(text.vocab_path(p, ctx).read_text())
    assert len(vocab) == 100 and vocab["<pad>"] == 0
    train, val = text.torch_datasets(p, ctx)
    assert (len(train), len(val)) == (200, 50)
    tokens, label = train[0]
    assert tokens.shape == (16,) and 0 <= int(label) < 4 and int(tokens.max()) < 100


def test_missing_real_files_say_where_and_how(tmp_path):
    with pytest.raises(DataUnavailable) as err:
        text.prepare(text.Text(data_dir=str(tmp_path / "ag")), DataContext(root=tmp_path))
    assert "train.csv" in str(err.value) and str(tmp_path / "ag") in str(err.value)
    assert "data.synthetic=true" in str(err.value)


def test_preset_layers_hyperparameters_and_environment_files():
    cfg = load_config("text-rnn")
    assert "hparams.yaml" in cfg.source and "env.yaml" in cfg.source
    model, data = cfg.model.kwargs, cfg.data.kwargs
    assert (model["hidden_dim"], model["n_layers"], model["bidirectional"]) == (256, 2, True)
    assert (data["train_file"], data["val_file"], cfg.run.storage_path) == ("train.csv", "test.csv", "./runs")
    assert cfg.run.name == "text-rnn"
    smoke = load_config("text-rnn", ["train.lr=0.02"], smoke=True)
    assert smoke.data.kwargs["synthetic"] and smoke.model.kwargs["hidden_dim"] == 32 and smoke.train.lr == 0.02


def layout(tmp_path: Path, hparams: str, env: str = "data: {data_dir: /data/ag}\nrun: {storage_path: /runs}\n") -> str:
    (tmp_path / "hparams.yaml").write_text(hparams)
    (tmp_path / "env.yaml").write_text(env)
    job = tmp_path / "job.yaml"
    job.write_text("include: [hparams.yaml, env.yaml]\nmodel: {name: text_rnn}\ndata: {name: text}\n")
    return str(job)


def test_own_layout_the_including_file_wins_and_paths_come_from_the_environment(tmp_path):
    (tmp_path / "hparams.yaml").write_text("model: {hidden_dim: 64}\ntrain: {lr: 0.01}\n")
    (tmp_path / "env.yaml").write_text("data: {data_dir: /data/ag}\nrun: {storage_path: /runs}\n")
    job = tmp_path / "job.yaml"
    job.write_text("include: [hparams.yaml, env.yaml]\nmodel: {name: text_rnn}\ndata: {name: text}\n"
                   "train: {lr: 0.002}\n")
    cfg = load_config(str(job))
    assert (cfg.model.kwargs["hidden_dim"], cfg.train.lr) == (64, 0.002)
    assert (cfg.data.kwargs["data_dir"], cfg.run.storage_path) == ("/data/ag", "/runs")


@pytest.mark.parametrize("hparams, include, expected", [
    ("model: {hiden_dim: 64}\n", None, "did you mean 'hidden_dim'"),
    ("model: {vocab_size: 10}\ndata: {vocab_size: 100}\n", None, "model.vocab_size"),
    ("modle: {hidden_dim: 64}\n", None, "hparams.yaml: unknown modle"),
    ("model: {}\n", "[missing.yaml]", "'missing.yaml' not found"),
    ("model: {}\n", "job.yaml", "includes itself"),
    ("model: {}\n", "{a: 1}", "not a list of file names"),
])
def test_bad_layouts_name_the_file_and_the_fix(tmp_path, hparams, include, expected):
    job = layout(tmp_path, hparams)
    if include is not None:
        Path(job).write_text(f"include: {include}\nmodel: {{name: text_rnn}}\ndata: {{name: text}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(job)
    assert expected in str(err.value) and "Fix:" in str(err.value)
