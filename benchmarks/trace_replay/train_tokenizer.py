"""Train the byte-level BPE that the real model shapes use in trace replay (``data/tokenizers/bpe32k-math-en``).

The replayed responses must not be in the training text (a tokenizer fitted to them would cut them into fewer,
longer tokens than a real model's tokenizer, and make speculation look easier). The corpus, in this order:

1. GSM8K train and test (``data/gsm8k``): each problem's question and worked answer (8,792 problems, 4.9 MB);
2. the questions (only) of the replayed traces (``data/traces/qwen25-math-math-cot``);
3. English prose shipped with the installed Python packages: the ``METADATA`` file (package description,
   mostly its README) of every ``*.dist-info`` in the running interpreter's ``site-packages``, sorted by name
   (about 1.6 MB in the project venv). GSM8K alone does not hold enough distinct words for 32,768 tokens.

Model: byte-level BPE (GPT-2 pre-tokenization, every byte in the alphabet, so any text encodes and nothing is
unknown), ``--vocab-size`` 32,768 tokens, no special tokens. Rebuild (same result given the same installed
packages, i.e. ``requirements.txt``)::

    python -m benchmarks.trace_replay.train_tokenizer [--out data/tokenizers/bpe32k-math-en] [--vocab-size 32768]
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "data" / "tokenizers" / "bpe32k-math-en"
GSM8K = REPO / "data" / "gsm8k"
TRACES = REPO / "data" / "traces" / "qwen25-math-math-cot" / "math_cot_50.jsonl"


def package_docs(site_packages: Path | None = None) -> list[Path]:
    """The ``METADATA`` files of the installed distributions, sorted (corpus part 3)."""
    root = Path(site_packages or sysconfig.get_paths()["purelib"])
    return sorted(root.glob("*.dist-info/METADATA"))


def corpus(site_packages: Path | None = None) -> Iterator[str]:
    """The training text, one document at a time (module docstring: GSM8K, trace questions, package docs)."""
    for split in ("train", "test"):
        with open(GSM8K / f"{split}.jsonl") as f:
            for line in f:
                row = json.loads(line)
                yield row["question"] + "\n" + row["answer"]
    with open(TRACES) as f:
        for line in f:
            yield json.loads(line)["question"]
    for path in package_docs(site_packages):
        yield path.read_text(errors="replace")


def train(vocab_size: int = 32768, site_packages: Path | None = None):
    """Train the BPE; returns the ``tokenizers.Tokenizer``. Raises ``RuntimeError`` when the corpus is too
    small for ``vocab_size`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(site_packages), trainer=trainer)
    if tok.get_vocab_size() < vocab_size:
        raise RuntimeError(
            f"the corpus gave {tok.get_vocab_size()} tokens, fewer than {vocab_size}: add text (module docstring)"
        )
    return tok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--vocab-size", type=int, default=32768)
    args = ap.parse_args(argv)
    tok = train(args.vocab_size)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"))
    docs = package_docs()
    print(
        f"{args.out / 'tokenizer.json'}: {tok.get_vocab_size()} tokens ({len(docs)} package METADATA files)"
    )


if __name__ == "__main__":
    main()
