"""A Hugging Face `Trainer` fine-tuning a tiny BERT whose dataset is slow to read.

The model is built from a `BertConfig` (randomly initialised, nothing downloaded); each sample
is "tokenized from storage" with a fixed latency (default 2 ms). `TrainingArguments` leaves
`dataloader_num_workers` at its default of 0, so every step waits while the main process reads
its batch one sample after another.

What trainadvisor should find: `data-stall`, fixed by `dataloader-workers`. The DataLoader is
built inside transformers, so the change is shown where the user sets it: the
`TrainingArguments(...)` call below gains `dataloader_num_workers=N`.

    trainadvisor profile examples/hf_trainer_slow_data.py
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class SlowTokens(Dataset):
    """Synthetic token sequences, deterministic per index, each behind a read latency."""

    def __init__(self, size: int, length: int, vocab: int, latency_ms: float) -> None:
        self.size, self.length, self.vocab = size, length, vocab
        self.latency_s = latency_ms / 1000.0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(self.latency_s)  # reading and tokenizing one sample
        generator = torch.Generator().manual_seed(index)
        ids = torch.randint(5, self.vocab, (self.length,), generator=generator)
        label = index % 2
        ids[0] = 1 + label  # a class-dependent first token to learn
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor(label)}


def tiny_bert() -> BertForSequenceClassification:
    """Two layers of 64 wide, randomly initialised from a config (nothing downloaded)."""
    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=64, num_labels=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--out", default="/tmp/hf-trainer-slow-data")
    args = parser.parse_args()

    model = tiny_bert()
    training_args = TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=16,
        learning_rate=1e-3,
        max_steps=args.steps,
        logging_steps=50,
        save_strategy="no",
        report_to=[],
        seed=0,
    )
    dataset = SlowTokens(args.samples, length=32, vocab=model.config.vocab_size, latency_ms=args.latency_ms)
    Trainer(model=model, args=training_args, train_dataset=dataset).train()


if __name__ == "__main__":
    main()
