"""Stage 0 results, written by scripts/train_rnn_baselines.py --write (rerun it; do not edit by hand)."""
# ruff: noqa: E501  (generated: the command and the machine stay on one line each)

COMMAND = 'python scripts/train_rnn_baselines.py --data ../shared/data/multi30k --threads 1 --write'
MACHINE = 'AMD EPYC, 2 cores, load average 16.5, 17.0, 16.8 at the end; torch 2.13.0+cpu, 1 thread(s)'
CONFIG = {'train_pairs': 12000,
 'epochs': 4,
 'embedding_size': 128,
 'hidden_size': 256,
 'attention_size': 128,
 'dropout': 0.2,
 'learning_rate': 0.002,
 'max_tokens': 1024,
 'clip_norm': 1.0,
 'max_len': 60,
 'seed': 0}
RUNS = {'without attention': {'parameters': 2382593,
                       'wall_minutes': 9.52,
                       'cpu_minutes': 1.55,
                       'train_loss': [4.6773, 3.6191, 3.1841, 2.8994],
                       'val_loss': 2.8236,
                       'bleu': {'1–8': {'bleu': 16.13, 'sentences': 321},
                                '9–11': {'bleu': 15.48, 'sentences': 655},
                                '12–14': {'bleu': 14.35, 'sentences': 516},
                                '15–18': {'bleu': 11.38, 'sentences': 364},
                                '19+': {'bleu': 8.52, 'sentences': 158},
                                'all': {'bleu': 13.41, 'sentences': 2014}}},
 'with attention': {'parameters': 2448257,
                    'wall_minutes': 9.71,
                    'cpu_minutes': 1.71,
                    'train_loss': [4.6002, 3.4004, 2.8687, 2.5245],
                    'val_loss': 2.3463,
                    'bleu': {'1–8': {'bleu': 25.68, 'sentences': 321},
                             '9–11': {'bleu': 27.09, 'sentences': 655},
                             '12–14': {'bleu': 25.49, 'sentences': 516},
                             '15–18': {'bleu': 23.19, 'sentences': 364},
                             '19+': {'bleu': 17.9, 'sentences': 158},
                             'all': {'bleu': 24.38, 'sentences': 2014}}}}
