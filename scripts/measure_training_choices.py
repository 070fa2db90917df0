"""Measure what notebook 5 says about its training choices (not a test): label smoothing on and off and
checkpoint averaging before and after, on Multi30k; and the warm-up ablation of the copy task over seeds.

    python scripts/measure_training_choices.py --data ../shared/data/multi30k --threads 1 \
        --work /tmp/stage5-runs [--epochs 10] [--average 3 5] [--seeds 0 1 2 3 4] \
        [--d-model 128 --num-heads 4 --num-layers 2 --d-ff 512] [--write]

Multi30k: notebook 5's training run (its model configuration, or a smaller one given by --d-model,
--num-heads, --num-layers and --d-ff; batches of at most 4,096 tokens, warm-up 400, factor 0.5, clipping
at 1.0, seed 0) trained with the reference `fit` twice, with label smoothing 0.1 (the notebook's) and
0.0; the runs differ in nothing else (same initial weights, batch order and dropout draws). The weights
of every epoch are kept in --work. For each run, the last epoch's weights and the average of the last
N epochs' (each N of --average) are scored: the validation loss without smoothing (and its perplexity),
and greedy BLEU on val and test_2016_flickr (the recipe of `reference.translation`). Then sacreBLEU's
paired bootstrap test (1,000 resamples) on the test set: smoothing 0.1 against 0.0, and each run's
averages against its last epoch. Resumable: rerunning continues each run after its last finished epoch.
`--train-only S` trains only the run with label smoothing S and scores nothing (to train the two runs
in two processes; a run without it then scores both).

Warm-up ablation: the copy task of notebook 5 (512 sentence pairs over 8 words, the toy Transformer, 7
epochs of 16 batches), trained once per seed with three schedules that differ only in the warm-up: the
toy warm-up schedule; the same schedule without its warm-up (its peak rate from step 1 until the
decay, then the same decay); and that times 10. Also the peak rate kept constant (no decay), to show
how much of a comparison with a constant rate is the decay's doing.

With --write the figures replace src/transformer_course/reference/training_results.py, which notebook 5
quotes, with the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import pprint
import sys
import time
from pathlib import Path

import sacrebleu
import torch
from sacrebleu.significance import PairedTest
from train_rnn_baselines import machine  # the same machine line as the stage-0 baselines (scripts/ is on the path)

from transformer_course.reference import Transformer
from transformer_course.reference.training import (
    average_state_dicts,
    collate,
    copy_pairs,
    fit,
    make_criterion,
    make_optimizer,
    noam_learning_rate,
    resume_training,
    save_training_state,
    train_epoch,
)
from transformer_course.reference.translation import make_loader, prepare_data, translate_ids

RESULTS = Path(__file__).resolve().parents[1] / "src" / "transformer_course" / "reference" / "training_results.py"
NOTEBOOK_CONFIG = {"d_model": 256, "num_heads": 8, "num_layers": 3, "d_ff": 512, "max_seq_length": 128,
                   "dropout": 0.1}
CONFIG = dict(NOTEBOOK_CONFIG)  # the model trained; --d-model, --num-heads, --num-layers, --d-ff make it smaller
WARMUP_STEPS, LR_FACTOR, CLIP_NORM, MAX_TOKENS = 400, 0.5, 1.0, 4096
TOY = {"vocab": 12, "d_model": 32, "num_heads": 4, "num_layers": 1, "d_ff": 64, "max_seq_length": 20,
       "pairs": 512, "batch_size": 32, "warmup_steps": 50, "factor": 0.5, "epochs": 7}


# --- label smoothing and checkpoint averaging on Multi30k ---------------------------------------------------


def train_run(data, smoothing: float, epochs: int, work: Path, seed: int) -> list[dict[str, float]]:
    """Notebook 5's run with the given label smoothing, resumable; keeps every epoch's weights in `work`."""
    work.mkdir(parents=True, exist_ok=True)
    pad = data.target_vocab.pad_idx
    torch.manual_seed(seed)
    model = Transformer(len(data.source_vocab), len(data.target_vocab), **CONFIG)
    optimizer, scheduler = make_optimizer(model, CONFIG["d_model"], WARMUP_STEPS, LR_FACTOR)
    history: list[dict[str, float]] = []
    config = {**CONFIG, "label_smoothing": smoothing, "seed": seed}
    state = work / "state.pt"
    finished = resume_training(state, model, optimizer, scheduler, history, config)
    if finished:
        print(f"  resumed after epoch {finished}", flush=True)
    train = make_loader(data.splits["train"], pad, MAX_TOKENS, seed=seed)
    val = make_loader(data.splits["val"], pad, MAX_TOKENS, shuffle=False)

    def after_epoch(history: list[dict[str, float]]) -> None:
        now = time.process_time()
        history[-1]["cpu_seconds"], clock[0] = now - clock[0], now  # this process's CPU time for the epoch
        epoch = history[-1]["epoch"]
        torch.save({name: tensor.detach().clone() for name, tensor in model.state_dict().items()},
                   work / f"weights_{epoch:03d}.pt")
        save_training_state(state, model, optimizer, scheduler, history, config)
        print(f"  epoch {epoch}: {json.dumps({k: round(v, 4) for k, v in history[-1].items()})}", flush=True)

    clock = [time.process_time()]
    fit(model, train, val, make_criterion(pad, smoothing), optimizer, scheduler, epochs, history,
        clip_norm=CLIP_NORM, after_epoch=after_epoch, progress=False)
    return history


def scores(model: Transformer, data, weights: dict[str, torch.Tensor]) -> tuple[dict[str, float], list[str]]:
    """Validation loss (unsmoothed), perplexity and greedy BLEU on val and test; and the test hypotheses."""
    from transformer_course.reference.training import evaluate

    model.load_state_dict(weights)
    model.eval()
    pad = data.target_vocab.pad_idx
    val_loss = evaluate(model, make_loader(data.splits["val"], pad, MAX_TOKENS, shuffle=False),
                        make_criterion(pad, 0.0), progress=False)
    result = {"val_loss": round(val_loss, 4), "val_perplexity": round(math.exp(val_loss), 2)}
    hypotheses = {}
    for split in ("val", "test_2016_flickr"):
        sources = [source for source, _ in data.splits[split]]
        hypotheses[split] = [" ".join(tokens) for tokens in translate_ids(model, sources, data.source_vocab,
                                                                          data.target_vocab)]
        metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)
        result[f"{split}_bleu"] = round(metric.corpus_score(hypotheses[split], [data.references[split]]).score, 2)
    return result, hypotheses["test_2016_flickr"]


def paired(baseline: tuple[str, list[str]], other: tuple[str, list[str]], references: list[str]) -> dict:
    """sacreBLEU's paired bootstrap (1,000 resamples, its default seed): the other system against the baseline."""
    test = PairedTest([baseline, other], {"BLEU": sacrebleu.metrics.BLEU(tokenize="none", force=True)},
                      [references], test_type="bs", n_samples=1000)
    _, results = test()
    base, result = results["BLEU"]
    return {"baseline": baseline[0], "system": other[0], "baseline_bleu": round(base.score, 2),
            "bleu": round(result.score, 2), "difference": round(result.score - base.score, 2),
            "p_value": round(float(result.p_value), 4),
            "bootstrap_mean_95ci": [round(float(result.mean), 2), round(float(result.ci), 2)]}


def smoothing_and_averaging(data, arguments: argparse.Namespace) -> dict:
    runs, outputs = {}, {}
    pad_model = Transformer(len(data.source_vocab), len(data.target_vocab), **CONFIG)
    for smoothing in (0.1, 0.0):
        name = f"label smoothing {smoothing}"
        print(f"\n{name}", flush=True)
        work = arguments.work / f"smoothing_{smoothing}"
        if arguments.train_only is not None and smoothing != arguments.train_only:
            continue
        history = train_run(data, smoothing, arguments.epochs, work, arguments.seed)
        if arguments.train_only is not None:
            continue
        weights = [torch.load(work / f"weights_{epoch:03d}.pt", weights_only=True)
                   for epoch in range(1, arguments.epochs + 1)]
        checkpoints = {"last epoch": weights[-1]}
        for count in arguments.average:
            checkpoints[f"average of the last {count}"] = average_state_dicts(weights[-count:])
        scored = {}
        for label, state in checkpoints.items():
            started = time.process_time()
            scored[label], outputs[(smoothing, label)] = scores(pad_model, data, state)
            print(f"  {label}: {scored[label]} ({time.process_time() - started:.0f} CPU s)", flush=True)
        runs[name] = {"label_smoothing": smoothing,
                      "history": [{key: round(value, 4) for key, value in record.items()} for record in history],
                      "cpu_minutes": round(sum(record["cpu_seconds"] for record in history) / 60, 1),
                      "checkpoints": scored}
    if arguments.train_only is not None:
        return {}
    references = data.references["test_2016_flickr"]
    tests = [paired(("smoothing 0.0, last epoch", outputs[(0.0, "last epoch")]),
                    ("smoothing 0.1, last epoch", outputs[(0.1, "last epoch")]), references)]
    for smoothing in (0.1, 0.0):
        for count in arguments.average:
            label = f"average of the last {count}"
            tests.append(paired((f"smoothing {smoothing}, last epoch", outputs[(smoothing, "last epoch")]),
                                (f"smoothing {smoothing}, {label}", outputs[(smoothing, label)]), references))
    for test in tests:
        print(f"  {test}", flush=True)
    return {"runs": runs, "paired_bootstrap_test": tests}


# --- the warm-up ablation on the copy task -------------------------------------------------------------------


def toy_schedules() -> dict[str, object]:
    """The three schedules compared (multipliers of a base rate of 1, per LambdaLR index), and the old constant."""
    d, warmup, factor = TOY["d_model"], TOY["warmup_steps"], TOY["factor"]
    peak = noam_learning_rate(warmup, d, warmup, factor)

    def decay_only(index: int) -> float:  # the same schedule without its warm-up: the peak until the decay
        return factor * d ** -0.5 * max(index + 1, warmup) ** -0.5

    return {"warm-up, then decay": lambda index: noam_learning_rate(index + 1, d, warmup, factor),
            "no warm-up, same decay": decay_only,
            "no warm-up, 10 × that": lambda index: 10 * decay_only(index),
            "constant peak rate (no decay)": lambda index: peak}


def warmup_ablation(seeds: list[int]) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    pad = 3
    results: dict[str, dict[str, list[float]]] = {name: {} for name in toy_schedules()}
    try:
        for seed in seeds:
            pairs = copy_pairs(TOY["pairs"], seed=seed)
            batches = [collate(pairs[start:start + TOY["batch_size"]], pad)
                       for start in range(0, TOY["pairs"], TOY["batch_size"])]
            for name, schedule in toy_schedules().items():
                torch.manual_seed(seed)
                model = Transformer(TOY["vocab"], TOY["vocab"], TOY["d_model"], TOY["num_heads"], TOY["num_layers"],
                                    TOY["d_ff"], TOY["max_seq_length"], 0.0)
                optimizer, _ = make_optimizer(model, TOY["d_model"], TOY["warmup_steps"], TOY["factor"])
                scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
                losses = [train_epoch(model, batches, make_criterion(pad, 0.0), optimizer, scheduler, progress=False)
                          for _ in range(TOY["epochs"])]
                results[name][str(seed)] = [round(loss, 4) for loss in losses]
                print(f"  seed {seed} {name:30s} {[round(loss, 2) for loss in losses]}", flush=True)
    finally:
        torch.set_num_threads(threads)
    return {"settings": TOY, "seeds": seeds, "losses": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="folder with the six Multi30k .gz files (default: cache)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/stage5-runs"))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--average", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--d-model", type=int, default=None, help="a smaller model than the notebook's (256)")
    parser.add_argument("--num-heads", type=int, default=None, help="(the notebook's: 8)")
    parser.add_argument("--num-layers", type=int, default=None, help="(the notebook's: 3)")
    parser.add_argument("--d-ff", type=int, default=None, help="(the notebook's: 512)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds of the warm-up ablation")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--only", choices=("ablation", "smoothing"), default=None)
    parser.add_argument("--train-only", type=float, default=None, metavar="SMOOTHING",
                        help="only train the run with this label smoothing, score nothing (to train the two runs "
                             "in parallel processes; a later run without it scores them)")
    parser.add_argument("--write", action="store_true", help="write reference/training_results.py")
    arguments = parser.parse_args()
    for name in ("d_model", "num_heads", "num_layers", "d_ff"):
        if getattr(arguments, name) is not None:
            CONFIG[name] = getattr(arguments, name)
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    command = "python scripts/measure_training_choices.py " + " ".join(sys.argv[1:])
    wall, cpu = time.perf_counter(), time.process_time()
    arguments.work.mkdir(parents=True, exist_ok=True)
    saved = arguments.work / "results.json"  # a run with --only keeps what an earlier run measured
    results: dict[str, object] = json.loads(saved.read_text()) if saved.exists() else {}
    if arguments.only in (None, "ablation"):
        print("warm-up ablation on the copy task", flush=True)
        results["warmup_ablation"] = warmup_ablation(arguments.seeds)
    if arguments.only in (None, "smoothing"):
        data = prepare_data(arguments.data)
        measured = smoothing_and_averaging(data, arguments)
        if arguments.train_only is not None:
            return 0
        results["smoothing_and_averaging"] = measured
    if arguments.only in (None, "smoothing"):  # the Multi30k runs' settings (the ablation's are in its "settings")
        results["config"] = {**CONFIG, "warmup_steps": WARMUP_STEPS, "lr_factor": LR_FACTOR,
                             "clip_norm": CLIP_NORM, "max_tokens": MAX_TOKENS, "epochs": arguments.epochs,
                             "seed": arguments.seed, "average": arguments.average}
    results.setdefault("minutes", {})[arguments.only or "all"] = {  # type: ignore[union-attr]
        "wall": round((time.perf_counter() - wall) / 60, 1), "cpu": round((time.process_time() - cpu) / 60, 1)}
    description = machine()
    part = arguments.only or "all"  # each part keeps the command and the machine that measured it
    results.setdefault("commands", {})[part] = command  # type: ignore[union-attr]
    results.setdefault("machines", {})[part] = description  # type: ignore[union-attr]
    saved.write_text(json.dumps(results, indent=1))
    print(json.dumps(results["minutes"]), description, flush=True)
    if arguments.write:
        RESULTS.write_text(
            '"""Stage 5 results, written by scripts/measure_training_choices.py --write (rerun it; do not edit by '
            'hand)."""\n# ruff: noqa: E501  (generated: the command and the machine stay on one line each)\n\n'
            f"COMMAND = {command!r}\nMACHINE = {description!r}\n"
            f"RESULTS = {pprint.pformat(results, width=110, sort_dicts=False)}\n")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
