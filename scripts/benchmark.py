"""Benchmark (not a test): training throughput of the course's Transformer and of torch.nn.Transformer
at the same configuration on real Multi30k batches, greedy decoding speed, and BLEU per training minute
of the shipped checkpoint; then stage 7 on the shipped checkpoint: greedy decoding of test_2016_flickr
without and with the key/value cache (speed, and whether all sentences come out identical), and BLEU of
greedy decoding against beam search, the beam size and length penalty chosen on the val split.

    python scripts/benchmark.py --data ../shared/data/multi30k [--steps 20] [--device cpu|cuda]
        [--no-training] [--beam-sizes 2 4 6] [--alphas 0 0.6 1.0]

    python scripts/benchmark.py --data ../shared/data/multi30k --epoch [--epoch-steps 30] [--device cuda]

    python scripts/benchmark.py --data ../shared/data/multi30k --no-training --threads 1 --write
        [--decode-sentences 1000] [--val-sentences 1014]

    python scripts/benchmark.py --data ../shared/data/multi30k --notebook 07_fast_and_better_decoding
        [--quick-only | --full-only]

--write records stage 7's figures (the cache's speed-up, the beam settings chosen on val with their BLEU
grid, test BLEU of greedy and beam search, the sentences where beam search fixes greedy decoding) in
src/transformer_course/reference/fast_decoding_results.py, the file notebook 7 and the README quote,
with the command and the machine. --decode-sentences and --val-sentences take only the first N sentences
of the test and val splits (a smaller setting for a slow machine; the results file says which was used).

--notebook NAME runs the solution notebook of a stage top to bottom in a fresh kernel, as a student's *Run all*
does (torch's default threads, the long demos on their full path, not the grader's short one), once with its
`QUICK = True` setting and once with `QUICK = False` (`--quick-only`, `--full-only`: one of them), and reports the
wall time, the kernel's CPU time, the load average before and after, and the lines its cells print about speed
(the cache's speed-up in notebook 7).

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
import pprint
import sys
import time
from pathlib import Path

import sacrebleu
import torch
from torch import nn

from transformer_course.reference import PositionalEncoding, Transformer, count_parameters
from transformer_course.reference import checkpoint as checkpoint_io
from transformer_course.reference.beam_search import beam_search, sequence_log_probs
from transformer_course.reference.decoding import greedy_decode
from transformer_course.reference.kv_cache import cached_greedy_decode
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


# --- stage 7: the key/value cache and beam search on the shipped checkpoint ------------------------------


def padded_batch(sources: list[list[int]], pad_idx: int, device: torch.device) -> torch.Tensor:
    """(len(sources), longest) source ids, padded at the end."""
    src = torch.full((len(sources), max(len(source) for source in sources)), pad_idx, dtype=torch.long)
    for row, source in enumerate(sources):
        src[row, : len(source)] = torch.tensor(source)
    return src.to(device)


def cache_speed(model: nn.Module, sources: list[list[int]], source_vocab, target_vocab, device: torch.device,
                batch_size: int = 256, max_len: int = 80) -> dict[str, object]:
    """Greedy decoding of every sentence without the cache (stage 6) and with it (stage 7), on the batches
    translate_ids makes (sorted by length, 256 a batch). Each batch is decoded by both, in alternating order,
    so a change of load on a shared machine hits both alike. Returns sentences per second of each, the
    speed-up, the sentences whose token ids differ and the greedy translations (tokens)."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    decoders = [("without_cache", greedy_decode), ("with_cache", cached_greedy_decode)]
    seconds = {name: 0.0 for name, _ in decoders}
    cpu_seconds = {name: 0.0 for name, _ in decoders}
    ids: dict[str, dict[int, list[int]]] = {name: {} for name, _ in decoders}
    for number, start in enumerate(range(0, len(order), batch_size)):
        chunk = order[start:start + batch_size]
        src = padded_batch([sources[i] for i in chunk], source_vocab.pad_idx, device)
        for name, decode in decoders if number % 2 == 0 else decoders[::-1]:
            synchronize(device)
            started, cpu_started = time.perf_counter(), time.process_time()
            ys = decode(model, src, source_vocab.pad_idx, target_vocab.bos_idx, target_vocab.eos_idx, max_len)
            synchronize(device)
            seconds[name] += time.perf_counter() - started
            cpu_seconds[name] += time.process_time() - cpu_started
            for row, index in enumerate(chunk):
                ids[name][index] = [token for token in ys[row].tolist() if token != target_vocab.pad_idx]
    different = [i for i in range(len(sources)) if ids["without_cache"][i] != ids["with_cache"][i]]
    return {"sentences": len(sources),
            "sentences_per_s": {name: round(len(sources) / seconds[name], 1) for name in seconds},
            "seconds": {name: round(seconds[name], 1) for name in seconds},
            "cpu_seconds": {name: round(cpu_seconds[name], 1) for name in cpu_seconds},
            "speedup": round(seconds["without_cache"] / seconds["with_cache"], 2),
            "identical_token_ids": not different, "sentences_that_differ": different,
            "translations": [target_vocab.decode(ids["with_cache"][i]) for i in range(len(sources))]}


def beam_translate(model: nn.Module, sources: list[list[int]], source_vocab, target_vocab, device: torch.device,
                   beam_size: int, alpha: float) -> tuple[list[list[str]], float, float]:
    """(translations as tokens, seconds, CPU seconds) with beam search, on translate_ids's batches."""
    def decode(*arguments: object) -> torch.Tensor:
        return beam_search(*arguments, beam_size=beam_size, alpha=alpha)

    synchronize(device)
    started, cpu_started = time.perf_counter(), time.process_time()
    translations = translate_ids(model, sources, source_vocab, target_vocab, device, decode=decode)
    synchronize(device)
    return translations, time.perf_counter() - started, time.process_time() - cpu_started


def choose_beam(model: nn.Module, data, source_vocab, target_vocab, device: torch.device, beam_sizes: list[int],
                alphas: list[float]) -> tuple[dict[str, float], tuple[int, float]]:
    """BLEU on the val split for greedy decoding and for every (beam size, alpha); the best pair (the first of
    equals: smaller first)."""
    sources = [source for source, _ in data.splits["val"]]
    references = data.references["val"][: len(sources)]
    greedy = translate_ids(model, sources, source_vocab, target_vocab, device, decode=cached_greedy_decode)
    grid = {"greedy": round(corpus_bleu([" ".join(t) for t in greedy], references)[0], 2)}
    best, best_bleu = (beam_sizes[0], alphas[0]), -1.0
    for beam_size in beam_sizes:
        for alpha in alphas:
            translations, _, _ = beam_translate(model, sources, source_vocab, target_vocab, device, beam_size, alpha)
            bleu, _ = corpus_bleu([" ".join(t) for t in translations], references)
            grid[f"beam {beam_size}, alpha {alpha}"] = round(bleu, 2)
            print(f"val: beam {beam_size}, alpha {alpha}: BLEU {bleu:.2f}", flush=True)
            if bleu > best_bleu:
                best, best_bleu = (beam_size, alpha), bleu
    return grid, best


def beam_fixes(model: nn.Module, sources: list[list[int]], references: list[str], greedy: list[list[str]],
               beam: list[list[str]], target_vocab, device: torch.device, count: int = 5) -> list[dict[str, object]]:
    """Test sentences where beam search repairs greedy decoding: beam's translation is more probable under the
    model (greedy's choice was a search error) and closer to the reference (sentence BLEU, sacreBLEU with
    effective order). The `count` largest BLEU gains, shorter sentences first among equals."""
    metric = sacrebleu.metrics.BLEU(tokenize="none", effective_order=True)
    pad = target_vocab.pad_idx
    found = []
    for index, (greedy_tokens, beam_tokens) in enumerate(zip(greedy, beam, strict=True)):
        if greedy_tokens == beam_tokens:
            continue
        src = torch.tensor([sources[index]], device=device)
        log_probs = [float(sequence_log_probs(model, src, torch.tensor([target_vocab.encode(tokens)], device=device),
                                              pad)) for tokens in (greedy_tokens, beam_tokens)]
        bleus = [metric.sentence_score(" ".join(tokens), [references[index]]).score
                 for tokens in (greedy_tokens, beam_tokens)]
        if log_probs[1] > log_probs[0] and bleus[1] > bleus[0]:
            found.append({"index": index, "reference": references[index], "greedy": " ".join(greedy_tokens),
                          "beam": " ".join(beam_tokens), "log_prob": [round(v, 2) for v in log_probs],
                          "sentence_bleu": [round(v, 1) for v in bleus], "gain": bleus[1] - bleus[0]})
    found.sort(key=lambda example: (-example["gain"], len(example["reference"])))
    for example in found:
        example["gain"] = round(example["gain"], 1)
    return found[:count]


def paired_bootstrap(greedy: list[str], beam: list[str], references: list[str], resamples: int = 1000,
                     seed: int = 12345) -> dict[str, object]:
    """sacreBLEU's paired bootstrap resampling test (`sacrebleu --paired-bs`, the Python API behind it) of beam
    search against greedy decoding, on the course's BLEU recipe (tokenize='none'): both systems' BLEU, the
    bootstrap mean and 95 % confidence half-width of each, and the p-value of beam search's difference from
    greedy decoding. Also, on the same resampled test sets (sacreBLEU draws them with numpy's default_rng(seed)),
    the share in which beam search scores higher and the 2.5 and 97.5 percentiles of the difference (Koehn,
    2004, "Statistical significance tests for machine translation evaluation")."""
    import numpy as np
    from sacrebleu.significance import PairedTest

    os.environ["SACREBLEU_SEED"] = str(seed)
    metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)  # the course's recipe: the text is tokenised
    test = PairedTest([("greedy", greedy), ("beam", beam)], {"BLEU": metric}, [references], test_type="bs",
                      n_samples=resamples)
    signatures, scores = test()
    (_, baseline), (_, system) = [("greedy", scores["BLEU"][0]), ("beam", scores["BLEU"][1])]
    # the same resamples again, for the difference itself (sacreBLEU reports only its p-value)
    indices = np.random.default_rng(seed).choice(len(greedy), size=(resamples, len(greedy)), replace=True)
    statistics = [np.array(metric._extract_corpus_statistics(texts, [references]), dtype="float64")
                  for texts in (greedy, beam)]
    differences = np.array([metric._compute_score_from_stats(statistics[1][sample].sum(0)).score
                            - metric._compute_score_from_stats(statistics[0][sample].sum(0)).score
                            for sample in indices])
    return {"test": "paired bootstrap resampling, sacreBLEU's PairedTest(test_type='bs')",
            "resamples": resamples, "seed": seed, "sentences": len(greedy),
            "greedy": {"bleu": round(baseline.score, 2), "mean": round(float(baseline.mean), 2),
                       "ci95": round(float(baseline.ci), 2)},
            "beam": {"bleu": round(system.score, 2), "mean": round(float(system.mean), 2),
                     "ci95": round(float(system.ci), 2), "p_value": round(float(system.p_value), 4)},
            "beam_higher_share": round(float((differences > 0).mean()), 4),
            "difference_percentiles_2_5_97_5": [round(float(np.percentile(differences, q)), 2) for q in (2.5, 97.5)],
            "signature": str(signatures["BLEU"])}


def stage7(model: nn.Module, data, source_vocab, target_vocab, device: torch.device, beam_sizes: list[int],
           alphas: list[float]) -> dict[str, object]:
    """The cache's speed-up and identity on test_2016_flickr, and greedy against beam search in BLEU."""
    sources = [source for source, _ in data.splits["test_2016_flickr"]]
    references = data.references["test_2016_flickr"][: len(sources)]
    speed = cache_speed(model, sources, source_vocab, target_vocab, device)
    greedy = speed.pop("translations")
    print(f"greedy: {speed['sentences_per_s']} sentences/s, identical: {speed['identical_token_ids']}", flush=True)
    greedy_bleu, signature = corpus_bleu([" ".join(t) for t in greedy], references)
    grid, (beam_size, alpha) = choose_beam(model, data, source_vocab, target_vocab, device, beam_sizes, alphas)
    beam, seconds, cpu_seconds = beam_translate(model, sources, source_vocab, target_vocab, device, beam_size, alpha)
    beam_bleu, _ = corpus_bleu([" ".join(t) for t in beam], references)
    significance = paired_bootstrap([" ".join(t) for t in greedy], [" ".join(t) for t in beam], references)
    print(f"paired bootstrap: {significance}", flush=True)
    return {"greedy_cache": speed,
            "bleu": {"test_greedy": round(greedy_bleu, 2), "test_beam": round(beam_bleu, 2),
                     "gain": round(beam_bleu - greedy_bleu, 2), "beam_size": beam_size, "alpha": alpha,
                     "chosen_on": "val", "val_grid": grid, "signature": signature, "max_len": 80},
            "beam_sentences_per_s": round(len(sources) / seconds, 1),
            "beam_seconds": {"wall": round(seconds, 1), "cpu": round(cpu_seconds, 1)},
            "beam_fixes": beam_fixes(model, sources, references, greedy, beam, target_vocab, device),
            "significance": significance}


RESULTS = Path(__file__).resolve().parents[1] / "src" / "transformer_course" / "reference" / "fast_decoding_results.py"


def machine_line(device: torch.device) -> str:
    """The CPU model, the cores this process may use, the load at the end, torch and its threads (one line)."""
    machine = describe_machine(device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    gpu = f", GPU {machine['gpu']}" if "gpu" in machine else ""
    return (f"{machine['cpu']}, {cores} cores, load average {load} at the end; torch {machine['torch']}, "
            f"{machine['torch_threads']} thread(s), device {machine['device']}{gpu}")


def write_stage7(path: Path, command: str, machine: str, settings: dict[str, object], stage: dict) -> None:
    """The results module notebook 7 and the README quote (stage 7 on the shipped checkpoint)."""
    bleu = dict(stage["bleu"])
    choice = {"beam_size": bleu.pop("beam_size"), "alpha": bleu.pop("alpha"), "chosen_on": bleu.pop("chosen_on"),
              "val_bleu": bleu.pop("val_grid")}
    beam = {"beam_size": choice["beam_size"], "alpha": choice["alpha"],
            "sentences_per_s": stage["beam_sentences_per_s"], "seconds": stage["beam_seconds"]}
    constants = {"SETTINGS": settings, "CACHE": stage["greedy_cache"], "CHOICE": choice, "BLEU": bleu,
                 "BEAM": beam, "BEAM_FIXES": stage["beam_fixes"], "SIGNIFICANCE": stage["significance"]}
    text = ('"""Stage 7 results, written by scripts/benchmark.py --write (rerun it; do not edit by hand)."""\n'
            "# ruff: noqa: E501  (generated: the command and the machine stay on one line each)\n\n"
            f"COMMAND = {command!r}\n"
            f"MACHINE = {machine!r}\n")
    for name, value in constants.items():
        text += f"{name} = {pprint.pformat(value, width=110, sort_dicts=False)}\n"
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")


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


def notebook_run(name: str, data: str | None, quick: bool | None) -> dict[str, object]:
    """One *Run all* of solutions/NAME/NAME.ipynb in a fresh kernel (QUICK set as given, None: as written): wall
    seconds, the kernel's CPU seconds, the load average before and after, and the printed lines about speed."""
    import resource

    import nbformat
    from nbclient import NotebookClient

    root = Path(__file__).resolve().parents[1]
    path = root / "solutions" / name / f"{name}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    if quick is not None:
        for cell in notebook.cells:
            if cell.cell_type == "code" and cell.source.startswith("QUICK = "):
                cell.source = cell.source.replace("QUICK = True", f"QUICK = {quick}", 1)
    environment = {"TRANSFORMER_COURSE_SHORT_RUN": "0", "MPLBACKEND": "Agg", "TRANSFORMER_COURSE_STRICT": "1",
                   "PYTHONWARNINGS": "ignore", **({"MULTI30K_DIR": str(Path(data).resolve())} if data else {})}
    previous = dict(os.environ)
    os.environ.update(environment)
    before, load_before = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()
    started = time.perf_counter()
    try:
        NotebookClient(notebook, timeout=3600, kernel_name="python3", allow_errors=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(previous)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the kernel has exited and been waited for
    printed = [line for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
               if output.get("output_type") == "stream" for line in output.get("text", "").splitlines()
               if "×" in line or "sentences/s" in line]
    return {"notebook": name, "quick": quick, "wall_seconds": round(wall, 1),
            "kernel_cpu_seconds": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
            "load_average_before": [round(value, 2) for value in load_before],
            "load_average_after": [round(value, 2) for value in os.getloadavg()], "printed": printed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoint", type=Path, default=Path("assets/checkpoint/transformer_de_en.pt"))
    parser.add_argument("--decode-sentences", type=int, default=1000, help="test sentences decoded (stage 7)")
    parser.add_argument("--val-sentences", type=int, default=None, help="val sentences for the beam grid "
                        "(default: all 1,014)")
    parser.add_argument("--write", action="store_true", help=f"write stage 7's figures to {RESULTS.name}")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-training", action="store_true", help="skip the training throughput measurement")
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[2, 4, 6], help="tried on val (stage 7)")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.6, 1.0], help="tried on val (stage 7)")
    parser.add_argument("--epoch", action="store_true", help="time one epoch of notebook 5's training run")
    parser.add_argument("--epoch-steps", type=int, default=None, help="time only this many batches of it")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--notebook", default=None, help="time Run all of this stage's solution notebook")
    parser.add_argument("--quick-only", action="store_true", help="with --notebook: only QUICK = True")
    parser.add_argument("--full-only", action="store_true", help="with --notebook: only QUICK = False")
    arguments = parser.parse_args()
    if arguments.notebook:
        settings = [True] if arguments.quick_only else [False] if arguments.full_only else [True, False]
        machine = describe_machine(torch.device("cpu"))
        runs = []
        for quick in settings:
            runs.append(notebook_run(arguments.notebook, arguments.data, quick))
            print(json.dumps(runs[-1], indent=1), flush=True)
        results = {"machine": machine, "runs": runs}
        if arguments.json:
            arguments.json.write_text(json.dumps(results, indent=1))
        return 0
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
                                  "config": config, "steps": arguments.steps,
                                  "load_average_at_start": [round(load, 2) for load in os.getloadavg()]}
    if not arguments.no_training:
        ours, theirs = Transformer(*sizes, **config), TorchTransformer(*sizes, **config, pad_idx=pad)
        results["parameters"] = {"course": count_parameters(ours), "torch.nn.Transformer": count_parameters(theirs)}
        results["train_tokens_per_s"] = {
            "course": round(training_throughput(ours, batches, device, pad)),
            "torch.nn.Transformer": round(training_throughput(theirs, batches, device, pad))}
    if arguments.checkpoint.exists():
        model, source_vocab, target_vocab, metadata = checkpoint_io.load(arguments.checkpoint, Transformer, device)
        vocabs = (source_vocab, target_vocab)
        checkpoint_data = prepare_data(arguments.data, splits=("val", "test_2016_flickr"), vocabs=vocabs)
        test = checkpoint_data.splits["test_2016_flickr"]
        checkpoint_data.splits["test_2016_flickr"] = test[: arguments.decode_sentences]
        checkpoint_data.splits["val"] = checkpoint_data.splits["val"][: arguments.val_sentences]
        stage = stage7(model, checkpoint_data, *vocabs, device, arguments.beam_sizes, arguments.alphas)
        if arguments.write:
            settings = {"test_sentences": len(checkpoint_data.splits["test_2016_flickr"]),
                        "val_sentences": len(checkpoint_data.splits["val"]), "batch_size": 256, "max_len": 80,
                        "beam_sizes": arguments.beam_sizes, "alphas": arguments.alphas,
                        "checkpoint": arguments.checkpoint.name}
            write_stage7(RESULTS, "python scripts/benchmark.py " + " ".join(sys.argv[1:]), machine_line(device),
                         settings, stage)
        score, signature = stage["bleu"]["test_greedy"], stage["bleu"]["signature"]
        results["decode_sentences_per_s"] = stage["greedy_cache"]["sentences_per_s"]["without_cache"]
        results["decode_seconds"] = {"wall": stage["greedy_cache"]["seconds"]["without_cache"],  # stage 6's decoder
                                     "cpu": stage["greedy_cache"]["cpu_seconds"]["without_cache"],
                                     "sentences": stage["greedy_cache"]["sentences"]}
        results["checkpoint"] = {"test_bleu_now": score, "signature": signature,
                                 "training_minutes": metadata.get("training_minutes"),
                                 "bleu_per_training_minute": round(score / metadata["training_minutes"], 2)
                                 if metadata.get("training_minutes") else None,
                                 "trained_on": metadata.get("device"), "threads": metadata.get("threads")}
        results["stage7"] = stage
    results["load_average_at_end"] = [round(load, 2) for load in os.getloadavg()]  # 1, 5, 15 minutes
    print(json.dumps(results, indent=1))
    if arguments.json:
        arguments.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
