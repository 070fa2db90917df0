"""Train the course's pretrained German->English checkpoint on Multi30k with the reference model.

    python scripts/train_checkpoint.py --data ../shared/data/multi30k --work runs/base \
        --out assets/checkpoint/transformer_de_en.pt

Resumable: each epoch's full state is saved in --work; rerunning continues from the last one.
At the end the last --average epochs' weights are averaged, greedy BLEU is measured on val and
test_2016_flickr (recipe in transformer_course.reference.translation), and the float16 checkpoint
with both vocabularies and the scores is written to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from transformer_course.reference import Transformer, count_parameters
from transformer_course.reference import checkpoint as checkpoint_io
from transformer_course.reference.training import evaluate, make_criterion, make_optimizer, train_epoch
from transformer_course.reference.translation import corpus_bleu, make_loader, prepare_data, translate_ids
from transformer_course.runtime import pick_device


def bleu(model, data, split, device, count: int | None = None) -> tuple[float, str]:
    """Greedy corpus BLEU on a split (or its first `count` sentences)."""
    sources = [source for source, _ in data.splits[split]][:count]
    hypotheses = [" ".join(t) for t in translate_ids(model, sources, data.source_vocab, data.target_vocab, device)]
    return corpus_bleu(hypotheses, data.references[split][: len(sources)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="folder with the six Multi30k .gz files (default: cache)")
    parser.add_argument("--work", type=Path, default=Path("runs/base"))
    parser.add_argument("--out", type=Path, default=Path("assets/checkpoint/transformer_de_en.pt"))
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--average", type=int, default=5, help="average the weights of the last N epochs")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--d-ff", type=int, default=512)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=1500)
    parser.add_argument("--lr-factor", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    arguments = parser.parse_args()
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    device = pick_device()
    torch.manual_seed(arguments.seed)
    started = time.time()
    data = prepare_data(arguments.data)
    config = {"d_model": arguments.d_model, "num_heads": arguments.num_heads, "num_layers": arguments.num_layers,
              "d_ff": arguments.d_ff, "max_seq_length": 256, "dropout": arguments.dropout}
    model = Transformer(len(data.source_vocab), len(data.target_vocab), **config).to(device)
    print(f"{count_parameters(model):,} parameters; vocab de {len(data.source_vocab)}, en {len(data.target_vocab)}")
    criterion = make_criterion(data.target_vocab.pad_idx, label_smoothing=0.1)
    plain = make_criterion(data.target_vocab.pad_idx, label_smoothing=0.0)
    optimizer, scheduler = make_optimizer(model, arguments.d_model, arguments.warmup, arguments.lr_factor)
    train = make_loader(data.splits["train"], data.source_vocab.pad_idx, arguments.max_tokens, seed=arguments.seed)
    val = make_loader(data.splits["val"], data.source_vocab.pad_idx, arguments.max_tokens, shuffle=False)
    arguments.work.mkdir(parents=True, exist_ok=True)
    state_path, log_path = arguments.work / "state.pt", arguments.work / "log.jsonl"
    first_epoch, seconds = 0, 0.0
    if state_path.exists():
        state = torch.load(state_path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        first_epoch, seconds = state["epoch"] + 1, state["seconds"]
        print(f"resumed after epoch {state['epoch']} ({seconds / 60:.0f} training minutes so far)")
    for epoch in range(first_epoch, arguments.epochs):
        epoch_started = time.time()
        train.batch_sampler.set_epoch(epoch)
        train_loss = train_epoch(model, train, criterion, optimizer, scheduler, device)
        val_loss = evaluate(model, val, plain, device)
        seconds += time.time() - epoch_started
        record = {"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss, "val_ppl": math.exp(val_loss),
                  "lr": scheduler.get_last_lr()[0], "minutes": seconds / 60}
        print(json.dumps(record), flush=True)
        with open(log_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        torch.save({name: t.detach().cpu().clone() for name, t in model.state_dict().items()},
                   arguments.work / f"weights_{epoch:03d}.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "epoch": epoch, "seconds": seconds}, state_path)
    trained = max(first_epoch, arguments.epochs)  # a resumed run may already hold more epochs than asked for
    kept = sorted(arguments.work.glob("weights_*.pt"))[:trained][-arguments.average:]
    averaged = {name: sum(torch.load(p, weights_only=True)[name].float() for p in kept) / len(kept)
                for name in model.state_dict()}
    # Score exactly what is shipped: the weights rounded to float16, as checkpoint_io.save stores them.
    model.load_state_dict({name: tensor.half().float() if tensor.is_floating_point() else tensor
                           for name, tensor in averaged.items()})
    model.eval()
    val_bleu, signature = bleu(model, data, "val", device)
    test_bleu, _ = bleu(model, data, "test_2016_flickr", device)
    first_100, _ = bleu(model, data, "test_2016_flickr", device, count=100)  # quick to re-check in tests
    metadata = {"val_bleu": round(val_bleu, 2), "test_bleu": round(test_bleu, 2), "bleu_signature": signature,
                "test_bleu_first_100": round(first_100, 2),
                "epochs": trained, "averaged_epochs": [p.stem for p in kept],
                "training_minutes": round(seconds / 60, 1), "device": str(device),
                "threads": torch.get_num_threads(), "torch": str(torch.__version__),
                "command": "python scripts/train_checkpoint.py " + " ".join(
                    f"--{k.replace('_', '-')} {trained if k == 'epochs' else v}" for k, v in vars(arguments).items()
                    if k not in ("data", "work", "out"))}
    checkpoint_io.save(arguments.out, model, config, data.source_vocab, data.target_vocab, metadata)
    print(json.dumps(metadata, indent=1))
    size = arguments.out.stat().st_size / 1e6
    print(f"wrote {arguments.out} ({size:.1f} MB) in {(time.time() - started) / 60:.0f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
