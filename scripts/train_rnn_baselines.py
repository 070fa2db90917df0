"""Stage 0's numbers: a GRU encoder-decoder trained with and without attention, BLEU by source length.

    python scripts/train_rnn_baselines.py --data ../shared/data/multi30k --write

Both models get the same data (a random subset of the training pairs), the same sizes, the same number of
epochs and the same seed; they differ only in the context vector the decoder's output layer reads (see
transformer_course.reference.rnn). Each is timed (wall clock and this process's CPU time, which a busy
machine inflates less) and scored with greedy BLEU on the 2,014 held-out sentences of val and
test_2016_flickr, per source-length bucket (transformer_course.reference.bottleneck).

With --write the results replace src/transformer_course/reference/bottleneck_results.py, which the stage-0
notebook quotes beside the student's own run, and are printed as the README's table.
"""

from __future__ import annotations

import argparse
import os
import platform
import pprint
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import torch

from transformer_course.reference.additive_attention import AdditiveAttention
from transformer_course.reference.bottleneck import (
    LENGTH_BUCKETS,
    ExperimentConfig,
    bleu_by_length,
    build_seq2seq,
    prepare_experiment_data,
    train_seq2seq,
    validation_loss,
)
from transformer_course.runtime import pick_device

RESULTS = Path(__file__).resolve().parents[1] / "src" / "transformer_course" / "reference" / "bottleneck_results.py"
MODELS = {"without attention": None, "with attention": AdditiveAttention}


def machine() -> str:
    """The CPU model and the cores this process may use, the load, torch and its threads."""
    name = platform.processor() or platform.machine()
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return (f"{name}, {len(os.sched_getaffinity(0))} cores, load average {load} at the end; torch {torch.__version__}, "
            f"{torch.get_num_threads()} thread(s)")


def run(name: str, data, config: ExperimentConfig, device: torch.device, train_pairs) -> dict:
    torch.manual_seed(config.seed)
    model = build_seq2seq(data, config, MODELS[name]).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"\n{name}: {parameters:,} parameters", flush=True)
    wall, cpu = time.perf_counter(), time.process_time()
    history = train_seq2seq(model, train_pairs, config, device)
    wall, cpu = round((time.perf_counter() - wall) / 60, 2), round((time.process_time() - cpu) / 60, 2)
    for record in history:
        print(f"  epoch {record['epoch']}: train loss {record['train_loss']:.3f} after {record['minutes']:.1f} min")
    val_loss = validation_loss(model, data.splits["val"], device)
    started = time.perf_counter()
    bleu = bleu_by_length(model, data, device, config.max_len)
    print(f"  {wall:.1f} training minutes (wall), {cpu:.1f} CPU minutes; val loss {val_loss:.3f}; "
          f"BLEU {bleu['all']['bleu']:.1f} (decoding and scoring took {time.perf_counter() - started:.0f} s)")
    return {"parameters": parameters, "wall_minutes": wall, "cpu_minutes": cpu,
            "train_loss": [round(record["train_loss"], 4) for record in history], "val_loss": round(val_loss, 4),
            "bleu": {label: {"bleu": round(value["bleu"], 2), "sentences": value["sentences"]}
                     for label, value in bleu.items()}}


def table(runs: dict) -> str:
    """The README's markdown table: BLEU per bucket, both models, and the training time."""
    labels = [label for label, _, _ in LENGTH_BUCKETS] + ["all"]
    counts = next(iter(runs.values()))["bleu"]
    lines = ["| German tokens | " + " | ".join(f"{label} ({counts[label]['sentences']:,})" for label in labels)
             + " | training |", "|---" * (len(labels) + 2) + "|"]
    for name, result in runs.items():
        cells = " | ".join(f"{result['bleu'][label]['bleu']:.1f}" for label in labels)
        lines.append(f"| {name} | {cells} | {result['cpu_minutes']:.1f} CPU min ({result['wall_minutes']:.1f} wall) |")
    return "\n".join(lines)


def write_results(path: Path, command: str, description: str, config: ExperimentConfig, runs: dict) -> None:
    text = (
        '"""Stage 0 results, written by scripts/train_rnn_baselines.py --write (rerun it; do not edit by hand)."""\n'
        "# ruff: noqa: E501  (generated: the command and the machine stay on one line each)\n\n"
        f"COMMAND = {command!r}\n"
        f"MACHINE = {description!r}\n"
        f"CONFIG = {pprint.pformat(config.as_dict(), width=110, sort_dicts=False)}\n"
        f"RUNS = {pprint.pformat(runs, width=110, sort_dicts=False)}\n"
    )
    path.write_text(text, encoding="utf-8")
    print(f"\nwrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="folder with the six Multi30k .gz files (default: cache)")
    for field in fields(ExperimentConfig):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    parser.add_argument("--only", choices=list(MODELS), help="train just one of the two models")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--write", action="store_true", help=f"write the results to {RESULTS.name}")
    arguments = parser.parse_args()
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    config = replace(ExperimentConfig(), **{f.name: getattr(arguments, f.name) for f in fields(ExperimentConfig)})
    device = pick_device()
    data = prepare_experiment_data(config, arguments.data)
    train_pairs = data.splits["train"]
    print(f"{len(train_pairs):,} training pairs; vocab de {len(data.source_vocab):,}, en {len(data.target_vocab):,}")
    runs = {name: run(name, data, config, device, train_pairs) for name in MODELS if arguments.only in (None, name)}
    print("\n" + table(runs))
    if arguments.write:
        command = "python scripts/train_rnn_baselines.py " + " ".join(sys.argv[1:])
        write_results(RESULTS, command, machine(), config, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
