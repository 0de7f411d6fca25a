"""The Hugging Face `Trainer` of `hf_trainer_slow_data.py`, with its `TrainingArguments` read by
`HfArgumentParser`: from the command line, or from a JSON or YAML file given as the only
argument (as the transformers example scripts do).

What trainadvisor should find: `data-stall`, fixed by `dataloader-workers`. The settings do not
come from a call in the script, so the report names what to pass instead of a diff: the
`--dataloader_num_workers N` flag, or the `dataloader_num_workers` key of the file.

    trainadvisor profile examples/hf_argparser_slow_data.py --output_dir /tmp/out --max_steps 400
    trainadvisor profile examples/hf_argparser_slow_data.py examples/hf_args.json
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from hf_trainer_slow_data import SlowTokens, tiny_bert
from transformers import HfArgumentParser, Trainer, TrainingArguments


@dataclass
class DataArguments:
    samples: int = field(default=20_000, metadata={"help": "samples in the dataset"})
    latency_ms: float = field(default=2.0, metadata={"help": "time to read one sample"})


def main() -> None:
    parser = HfArgumentParser((DataArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        data, training = parser.parse_json_file(json_file=str(Path(sys.argv[1]).resolve()))
    elif len(sys.argv) == 2 and sys.argv[1].endswith((".yaml", ".yml")):
        data, training = parser.parse_yaml_file(yaml_file=str(Path(sys.argv[1]).resolve()))
    else:
        data, training = parser.parse_args_into_dataclasses()
    model = tiny_bert()
    dataset = SlowTokens(data.samples, length=32, vocab=model.config.vocab_size, latency_ms=data.latency_ms)
    Trainer(model=model, args=training, train_dataset=dataset).train()


if __name__ == "__main__":
    main()
