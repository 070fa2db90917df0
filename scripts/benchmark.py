"""Benchmark (not a test): training throughput of the course's Transformer and of torch.nn.Transformer
at the same configuration on real Multi30k batches, greedy decoding speed, and BLEU per training minute
of the shipped checkpoint; with --epoch, the time of one training epoch of notebook 5 instead.

    python scripts/benchmark.py --data ../shared/data/multi30k [--steps 20] [--device cpu|cuda]
    python scripts/benchmark.py --data ../shared/data/multi30k --epoch [--epoch-steps 30] [--device cuda]

--epoch runs notebook 5's training run for one epoch exactly as the notebook does (its model
configuration, batches of at most 4,096 tokens, train_epoch then evaluate on the validation split)
and reports the seconds it took. With --epoch-steps N it times only the first N batches and
extrapolates to the whole epoch (said so in the output). The machine is described in the output:
CPU model, cores, torch threads, load average before and after, GPU name. On a machine busy with
other work the wall time says little; `--threads 1` then gives a CPU time per epoch that is close to
the wall time on one free core.

Prints the figures as JSON (and writes them with --json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch
from torch import nn

from transformer_course.reference import PositionalEncoding, Transformer, count_parameters
from transformer_course.reference import checkpoint as checkpoint_io
from transformer_course.reference.training import evaluate, make_criterion, make_optimizer, train_epoch
from transformer_course.reference.translation import corpus_bleu, make_loader, prepare_data, translate_ids


class TorchTransformer(nn.Module):
    """torch.nn.Transformer (post-LN, no final norms) wrapped in the same embeddings, PE and output layer."""

    def __init__(self, enc_vocab_size: int, dec_vocab_size: int, d_model: int, num_heads: int, num_layers: int,
                 d_ff: int, max_seq_length: int, dropout: float, pad_idx: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.pad_idx = pad_idx
        self.source_embedding = nn.Embedding(enc_vocab_size, d_model)
        self.target_embedding = nn.Embedding(dec_vocab_size, d_model)
        self.positional_encoding = PositionalEncoding(d_model, max_seq_length, dropout)
        self.transformer = nn.Transformer(d_model, num_heads, num_layers, num_layers, d_ff, dropout, batch_first=True)
        self.transformer.encoder.norm = None
        self.transformer.decoder.norm = None
        self.pred_layer = nn.Linear(d_model, dec_vocab_size)

    def forward(self, enc_in, dec_in, enc_mask, dec_mask):
        """Same call as the course's model; torch's masks mean the opposite (True = may NOT attend)."""
        scale = math.sqrt(self.d_model)
        src = self.positional_encoding(self.source_embedding(enc_in) * scale)  # (batch, src_len, d_model)
        tgt = self.positional_encoding(self.target_embedding(dec_in) * scale)  # (batch, tgt_len, d_model)
        source_padding = ~enc_mask[:, 0, 0]  # (batch, src_len)
        target_padding = dec_in == self.pad_idx  # (batch, tgt_len)
        future = torch.ones(dec_in.size(1), dec_in.size(1), dtype=torch.bool, device=dec_in.device).triu(1)
        out = self.transformer(src, tgt, tgt_mask=future, src_key_padding_mask=source_padding,
                               tgt_key_padding_mask=target_padding, memory_key_padding_mask=source_padding)
        return self.pred_layer(out)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def training_throughput(model: nn.Module, batches: list, device: torch.device, pad_idx: int, warmup: int = 3) -> float:
    """Target tokens per second over forward + backward + Adam step (after a few warm-up steps)."""
    model.to(device).train()
    criterion = make_criterion(pad_idx)
    optimizer, scheduler = make_optimizer(model, 256, 400, 0.5)
    tokens, seconds = 0, 0.0
    for index, batch in enumerate(batches):
        batch = batch.to(device)
        synchronize(device)
        started = time.perf_counter()
        optimizer.zero_grad()
        logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
        loss = criterion(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1))
        loss.backward()
        optimizer.step()
        scheduler.step()
        synchronize(device)
        if index >= warmup:
            seconds += time.perf_counter() - started
            tokens += int((batch.tgt_out != pad_idx).sum())
    return tokens / seconds


NOTEBOOK_CONFIG = {"d_model": 256, "num_heads": 8, "num_layers": 3, "d_ff": 512, "max_seq_length": 128,
                   "dropout": 0.1}  # notebook 5, section 11 (the full run)


def describe_machine(device: torch.device) -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    machine: dict[str, object] = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                  "torch": str(torch.__version__), "device": str(device)}
    if device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(device)
    if hasattr(os, "getloadavg"):
        machine["load_average_before"] = [round(value, 2) for value in os.getloadavg()]
    return machine


def epoch_time(data, device: torch.device, steps: int | None) -> dict[str, object]:
    """One epoch of notebook 5's training run (train_epoch + evaluate), or its first `steps` batches."""
    pad = data.source_vocab.pad_idx
    torch.manual_seed(0)
    model = Transformer(len(data.source_vocab), len(data.target_vocab), **NOTEBOOK_CONFIG).to(device)
    optimizer, scheduler = make_optimizer(model, NOTEBOOK_CONFIG["d_model"], 400, 0.5)
    train_loader = make_loader(data.splits["train"], pad, max_tokens=4096, seed=0)
    val_loader = make_loader(data.splits["val"], pad, max_tokens=4096, shuffle=False)
    train_loader.batch_sampler.set_epoch(1)
    batches = len(train_loader)
    synchronize(device)
    started, cpu_started = time.perf_counter(), time.process_time()
    train_epoch(model, train_loader, make_criterion(pad, 0.1), optimizer, scheduler, device, max_steps=steps,
                progress=False)
    synchronize(device)
    trained, cpu_trained = time.perf_counter() - started, time.process_time() - cpu_started
    cpu_validation_started = time.process_time()
    evaluate(model, val_loader, make_criterion(pad, 0.0), device, progress=False)
    synchronize(device)
    evaluated, cpu_evaluated = time.perf_counter() - started - trained, time.process_time() - cpu_validation_started
    timed = min(steps, batches) if steps else batches
    result: dict[str, object] = {"batches_per_epoch": batches, "batches_timed": timed,
                                 "train_seconds_timed": round(trained, 1), "validation_seconds": round(evaluated, 1),
                                 # CPU time of this process. With --threads 1 on a machine shared with other
                                 # work, it is close to what the run takes on one core it has to itself
                                 # (with more threads, threads waiting for each other inflate it).
                                 "train_cpu_seconds_timed": round(cpu_trained, 1)}
    result["epoch_seconds"] = round(trained * batches / timed + evaluated, 1)
    result["epoch_seconds_is"] = "measured" if timed == batches else f"extrapolated from {timed} batches"
    result["epoch_cpu_seconds"] = round(cpu_trained * batches / timed + cpu_evaluated, 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoint", type=Path, default=Path("assets/checkpoint/transformer_de_en.pt"))
    parser.add_argument("--decode-sentences", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--epoch", action="store_true", help="time one epoch of notebook 5's training run")
    parser.add_argument("--epoch-steps", type=int, default=None, help="time only this many batches of it")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    arguments = parser.parse_args()
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    device = torch.device(arguments.device)
    torch.manual_seed(0)
    data = prepare_data(arguments.data)
    if arguments.epoch:
        results = {"machine": describe_machine(device), "config": NOTEBOOK_CONFIG,
                   "epoch": epoch_time(data, device, arguments.epoch_steps)}
        if hasattr(os, "getloadavg"):
            results["machine"]["load_average_after"] = [round(value, 2) for value in os.getloadavg()]
        print(json.dumps(results, indent=1))
        if arguments.json:
            arguments.json.write_text(json.dumps(results, indent=1))
        return 0
    pad = data.source_vocab.pad_idx
    loader = make_loader(data.splits["train"], pad, max_tokens=4096, seed=0)
    batches = [batch for _, batch in zip(range(arguments.steps + 3), loader, strict=False)]
    config = {"d_model": 256, "num_heads": 8, "num_layers": 3, "d_ff": 512, "max_seq_length": 256, "dropout": 0.1}
    sizes = (len(data.source_vocab), len(data.target_vocab))
    results: dict[str, object] = {"device": str(device), "threads": torch.get_num_threads(),
                                  "torch": str(torch.__version__), "cpu": platform.processor() or platform.machine(),
                                  "config": config, "steps": arguments.steps}
    ours, theirs = Transformer(*sizes, **config), TorchTransformer(*sizes, **config, pad_idx=pad)
    results["parameters"] = {"course": count_parameters(ours), "torch.nn.Transformer": count_parameters(theirs)}
    results["train_tokens_per_s"] = {"course": round(training_throughput(ours, batches, device, pad)),
                                     "torch.nn.Transformer": round(training_throughput(theirs, batches, device, pad))}
    if arguments.checkpoint.exists():
        model, source_vocab, target_vocab, metadata = checkpoint_io.load(arguments.checkpoint, Transformer, device)
        sources = [s for s, _ in data.splits["test_2016_flickr"][: arguments.decode_sentences]]
        synchronize(device)
        started, cpu_started = time.perf_counter(), time.process_time()
        hypotheses = translate_ids(model, sources, source_vocab, target_vocab, device)
        synchronize(device)
        elapsed, cpu_elapsed = time.perf_counter() - started, time.process_time() - cpu_started
        score, signature = corpus_bleu([" ".join(h) for h in hypotheses],
                                       data.references["test_2016_flickr"][: len(sources)])
        results["decode_sentences_per_s"] = round(len(sources) / elapsed, 1)
        results["decode_seconds"] = {"wall": round(elapsed, 1), "cpu": round(cpu_elapsed, 1),
                                     "sentences": len(sources)}
        results["checkpoint"] = {"test_bleu_now": round(score, 2), "signature": signature,
                                 "training_minutes": metadata.get("training_minutes"),
                                 "bleu_per_training_minute": round(score / metadata["training_minutes"], 2)
                                 if metadata.get("training_minutes") else None,
                                 "trained_on": metadata.get("device"), "threads": metadata.get("threads")}
    print(json.dumps(results, indent=1))
    if arguments.json:
        arguments.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
