"""A Hugging Face Trainer measured by the advisor: the line marked (*) is all it takes.

    advisor recommend --model tiny-cpu --seq 256 --global-batch 4 --gpus 1 --for hf --validate 2 \\
        --script "python examples/hf_trainer.py --model {model} --seq {seq} --deepspeed {ds_config} {training_args}"

For each candidate the advisor writes the DeepSpeed config for the Trainer ("auto" wherever
TrainingArguments sets the value) and fills {training_args} with the layout's TrainingArguments
(--per_device_train_batch_size, --gradient_accumulation_steps, --bf16, --gradient_checkpointing).
The script reads them from its command line, as the Trainer's own examples do (HfArgumentParser),
and hands the config to the Trainer as it is. The model is a random LlamaForCausalLM with the
widths of the advisor's preset or config.json (no download), trained on random tokens, so the
script runs anywhere, the CPU included.
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass

import torch
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from advisor.monitor import AdvisorCallback  # (*)
from models.architecture import load_architecture


@dataclass
class Workload:
    model: str  # an advisor preset name or a config.json path: the widths of the LLaMA built here
    seq: int  # tokens per sample


class RandomTokens(torch.utils.data.Dataset):
    """Samples of `seq` random tokens, the same on every rank and every run."""

    def __init__(self, vocab_size: int, seq: int, samples: int = 1_000_000):
        self.vocab_size, self.seq, self.samples = vocab_size, seq, samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict:
        tokens = torch.randint(0, self.vocab_size, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": tokens, "labels": tokens}


def llama_like(name: str, seq: int) -> LlamaForCausalLM:
    arch = load_architecture(name)
    if arch.vision is not None:
        sys.exit(f"{name} has a vision encoder: this example builds a text decoder only")
    config = LlamaConfig(hidden_size=arch.hidden_size, intermediate_size=arch.intermediate_size,
                         num_hidden_layers=arch.num_layers, num_attention_heads=arch.num_heads,
                         num_key_value_heads=arch.num_kv_heads, head_dim=arch.head_dim, vocab_size=arch.vocab_size,
                         tie_word_embeddings=arch.tie_embeddings, max_position_embeddings=seq)
    return LlamaForCausalLM(config)


def main() -> None:
    parser = HfArgumentParser((Workload, TrainingArguments))
    # The script's own choices; the command line overrides them.
    parser.set_defaults(output_dir=tempfile.mkdtemp(prefix="hf-trainer-"), max_steps=1000, save_strategy="no",
                        report_to="none", logging_steps=10)
    argv = sys.argv[1:]
    if not torch.cuda.is_available():  # bf16 on a CPU needs the Trainer told so
        argv += ["--use_cpu", "true"]
    workload, args = parser.parse_args_into_dataclasses(args=argv)
    trainer = Trainer(model=llama_like(workload.model, workload.seq), args=args,
                      train_dataset=RandomTokens(load_architecture(workload.model).vocab_size, workload.seq),
                      callbacks=[AdvisorCallback()])  # (*) under the advisor, it stops the training once measured
    trainer.train()


if __name__ == "__main__":
    main()
