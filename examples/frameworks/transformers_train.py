"""A Hugging Face Transformers `Trainer` under Ray Train, written as Ray Train's Transformers guide writes it
(RayTrainReportCallback, prepare_trainer), and run by `raytrain run transformers.yaml` unchanged. The model is
built from a config (a 2-layer BERT, random weights: nothing is downloaded) and the data is generated."""

import os

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import ray.train
from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer


class Sequences(Dataset):
    """Random token sequences labelled by whether their first token is in the lower half of the vocabulary:
    generated here, nothing downloaded."""

    def __init__(self, num_samples: int, length: int = 16, vocab: int = 32, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(0, vocab, (num_samples, length), generator=generator)
        self.labels = (self.input_ids[:, 0] < vocab // 2).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {"input_ids": self.input_ids[index], "attention_mask": torch.ones_like(self.input_ids[index]),
                "labels": self.labels[index]}


def train_func(config):
    model_config = BertConfig(vocab_size=32, hidden_size=config.get("hidden", 32), num_hidden_layers=2,
                              num_attention_heads=2, intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(model_config)
    args = TrainingArguments(
        output_dir="hf-output",  # the Trainer's own checkpoints; the callback reports a copy of each
        per_device_train_batch_size=config.get("batch_size", 32),
        num_train_epochs=config.get("epochs", 3),
        learning_rate=config.get("lr", 1e-3),
        save_strategy="epoch",  # each save is reported to Ray Train by the callback, with its checkpoint
        logging_strategy="epoch",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Sequences(config.get("num_samples", 512)),
                      callbacks=[RayTrainReportCallback()])
    trainer = prepare_trainer(trainer)
    checkpoint = ray.train.get_checkpoint()  # the newest one raytrain committed, after any restart or rerun
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            trainer.train(resume_from_checkpoint=os.path.join(checkpoint_dir, RayTrainReportCallback.CHECKPOINT_NAME))
    else:
        trainer.train()


if __name__ == "__main__":  # the same function under plain Ray Train
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    print(TorchTrainer(train_func, train_loop_config={"epochs": 2},
                       scaling_config=ScalingConfig(num_workers=2)).fit().metrics)
