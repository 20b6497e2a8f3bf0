"""Train AI Search's embedder (edge/ai-search-embedder-v1): a hashed embedding bag, contrastive.

    python -m bench.ai_search_corpus --write-train /tmp/ais-train.jsonl
    python -m models.recipe.train_embedder --pairs /tmp/ais-train.jsonl --out models/ai-search-embedder
    python bench/ai_search_retrieval.py --embedders-only --record   # writes heldout.json

A text's features are its words, its word pairs and its words' character 3-5-grams (FEATURES), each
counted with 1 + log(tf) times its family's weight and hashed (crc32) into BUCKETS rows of a table of
DIM columns; its vector is the weighted sum of those rows, L2-normalized (runtime/ai/search/
embedder.py computes the same at serve time, in numpy; a unit test compares the two featurizers).
The table is trained with InfoNCE: each question against the chunk that holds its answer, every
other chunk of the batch a negative, plus one other chunk of the same document per question (a
hard negative: same name, same attributes, another fact); the temperature is learned.

The pairs: the training split of bench/ai_search_corpus.py (documents and names never in the
held-out set, but the same lexicon and templates: what the model learns is which surface words
name the same concept, and to weigh a question's words against a chunk's), and --chat-pairs
question/answer pairs from the chat corpus (models/recipe/chat_examples.py, split "train": capitals,
currencies, time zones, languages, docstrings, everyday questions, retrieved passages). 5% of the
training documents (by a stable hash of the key) are kept aside as a validation set, whose chunk
recall is reported in training.json. Seeded; CPU; a few minutes.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import re
import time
import unicodedata
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

NAME = "edge/ai-search-embedder-v1"
BUCKETS, DIM, LEXICAL_DIM, LEXICAL_WEIGHT, LOW_SHARE, FULL_SHARE = 32_768, 96, 512, 0.3, 0.4, 0.75
# the runtime's stop words (runtime.ai.embeddings.STOP_WORDS), written into config.json
STOP_WORDS = sorted(
    "a an and are as at be by can do does for from has have how i in is it its of on or that the this to "
    "was were what when where which who why will with you your".split()
)
FEATURES = {
    "buckets": BUCKETS,
    "weights": {"word": 1.0, "pair": 0.5, "piece": 0.25},
    "char_ngrams": [3, 5],
    "min_piece_word": 4,
    "stop_words": STOP_WORDS,
    "stop_weight": 0.1,
    "salt": "",
    "hash": "crc32(salt + feature, utf-8) mod buckets; features 'w:'+word, 'b:'+word+' '+next, "
    "'c:'+n-gram of '<'+word+'>' (words of 4+ letters, not stop words); words = \\w+ of the NFKC "
    "case-folded text; a bucket's raw weight r = the sum of its features' family weights (a stop "
    "word's word and pair features x stop_weight), used as 1 + log r (r when under 1)",
}
_WORD = re.compile(r"\w+", re.UNICODE)


class Features(NamedTuple):
    learned_ids: np.ndarray  # buckets the learned channel reads (features of known words)
    learned_weights: np.ndarray
    lexical_ids: np.ndarray  # buckets the lexical channel reads (every word and word pair)
    lexical_weights: np.ndarray
    known_share: float  # of the text's non-stop words, the share in the vocabulary


def _weights(raw: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.fromiter(raw.keys(), dtype=np.int64, count=len(raw))
    weights = np.fromiter(
        (1.0 + math.log(r) if r >= 1.0 else r for r in raw.values()), dtype=np.float32, count=len(raw)
    )
    return ids, weights


class Featurizer:
    """A text's hashed features, as config.json's "features" describes them."""

    def __init__(self, spec: dict, vocabulary: frozenset[str] | None = None):
        self.buckets = int(spec["buckets"])
        self.word, self.pair, self.piece = (float(spec["weights"][k]) for k in ("word", "pair", "piece"))
        self.lo, self.hi = (int(n) for n in spec["char_ngrams"])
        self.min_piece_word = int(spec["min_piece_word"])
        self.stop_words = frozenset(spec["stop_words"])
        self.stop_weight = float(spec["stop_weight"])
        self.salt = str(spec.get("salt", ""))
        self.vocabulary = frozenset(spec.get("vocabulary") or ()) if vocabulary is None else vocabulary
        self._word_features = functools.lru_cache(maxsize=1 << 16)(self._word_features_uncached)

    def _slot(self, feature: str) -> int:
        return zlib.crc32((self.salt + feature).encode("utf-8", "surrogatepass")) % self.buckets

    def _word_features_uncached(self, word: str) -> tuple[int, tuple[int, ...]]:
        """The word's bucket and, for a vocabulary word of 4+ letters, its character n-grams'."""
        pieces: list[int] = []
        if word in self.vocabulary and word not in self.stop_words and len(word) >= self.min_piece_word:
            marked = f"<{word}>"
            for n in range(self.lo, self.hi + 1):
                pieces += [self._slot("c:" + marked[j : j + n]) for j in range(len(marked) - n + 1)]
        return self._slot("w:" + word), tuple(pieces)

    def features(self, text: str) -> Features:
        """Each channel's buckets once, a bucket's raw weight r (the sum of its features' family
        weights; a stop word's word and pair features x stop_weight) used as 1 + log r (r under 1).
        The lexical channel reads every word and word pair; the learned one a vocabulary word, its
        character n-grams, and a pair of two vocabulary words."""
        tokens = _WORD.findall(unicodedata.normalize("NFKC", text).casefold())
        learned: dict[int, float] = {}
        lexical: dict[int, float] = {}
        content = known_content = 0
        for i, word in enumerate(tokens):
            stop = word in self.stop_words
            known = word in self.vocabulary
            scale = self.stop_weight if stop else 1.0
            slot, pieces = self._word_features(word)
            lexical[slot] = lexical.get(slot, 0.0) + self.word * scale
            if known:
                learned[slot] = learned.get(slot, 0.0) + self.word * scale
                for piece in pieces:
                    learned[piece] = learned.get(piece, 0.0) + self.piece
            if not stop:
                content += 1
                known_content += known
            if i + 1 < len(tokens):
                pair = self._slot("b:" + word + " " + tokens[i + 1])
                lexical[pair] = lexical.get(pair, 0.0) + self.pair * scale
                if known and tokens[i + 1] in self.vocabulary:
                    learned[pair] = learned.get(pair, 0.0) + self.pair * scale
        share = known_content / content if content else 0.0
        return Features(*_weights(learned), *_weights(lexical), share)


def lexical_vector(ids: np.ndarray, weights: np.ndarray, dimensions: int, idf: np.ndarray) -> np.ndarray:
    """The lexical channel: the word and word-pair buckets, weighted by their idf, sign-hashed into
    `dimensions` (bucket mod dimensions, the sign from the next bit), unit length."""
    vector = np.zeros(dimensions, dtype=np.float32)
    signs = np.where((ids // dimensions) % 2 == 0, 1.0, -1.0).astype(np.float32)
    np.add.at(vector, ids % dimensions, signs * weights * idf[ids])
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def channel_scales(known_share: float, weight: float, shares: tuple[float, float]) -> tuple[float, float]:
    """(learned, lexical) scales of a text, squares summing to 1: the learned channel's share of the
    cosine is (1 - weight) for a text whose non-stop words are vocabulary words in at least
    shares[1], none at or below shares[0] (a text of words the training never saw is read
    lexically, as the stand-in reads it), linear between."""
    low, full = shares
    ramp = min(1.0, max(0.0, (known_share - low) / (full - low))) if full > low else 1.0
    learned = (1.0 - weight) * ramp
    return math.sqrt(learned), math.sqrt(1.0 - learned)


def chat_pairs(n: int, seed: int) -> list[dict]:
    """`n` (question, answer) pairs from the chat corpus's training split."""
    from models.recipe import chat_examples as ex

    kinds = ["capital", "currency", "zone", "language", "docstring", "everyday", "rag"]
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        kind = rng.choice(kinds)
        example = ex.GENERATORS[kind][0](rng, "train")
        messages = example.messages
        question = next(m["content"] for m in messages if m["role"] == "user")
        answer = next(m["content"] for m in messages if m["role"] == "assistant")
        if kind == "rag":  # the retrieved passage that holds the answer, not the answer
            system = messages[0]["content"].split("\n")[1:]
            owner = answer.split("'s ")[0]
            answer = next((line.split("] ", 1)[1] for line in system if f"] {owner} runs" in line), answer)
        out.append(
            {"query": question, "chunk": answer, "negatives": [], "key": f"chat:{kind}", "subset": "chat"}
        )
    return out


class Texts:
    """Every distinct text once, featurized, for building a batch's bags."""

    def __init__(self, featurizer: Featurizer):
        self.featurizer = featurizer
        self.index: dict[str, int] = {}
        self.features: list[Features] = []
        self.idf = np.ones(featurizer.buckets, dtype=np.float32)

    def add(self, text: str) -> int:
        if text not in self.index:
            self.index[text] = len(self.features)
            self.features.append(self.featurizer.features(text))
        return self.index[text]

    def document_frequency(self, groups: dict[str, set[int]]) -> np.ndarray:
        """idf per bucket of the lexical channel over the training documents (a document's texts
        together); returns the buckets the learned channel reads in training (the rest stay zero)."""
        df = np.zeros(self.featurizer.buckets, dtype=np.int64)
        for rows in groups.values():
            df[np.unique(np.concatenate([self.features[r].lexical_ids for r in rows]))] += 1
        self.idf = (np.log((len(groups) + 1) / (df + 1)) + 1.0).astype(np.float32)
        used = np.zeros(self.featurizer.buckets, dtype=bool)
        for f in self.features:
            used[f.learned_ids] = True
        return used

    def bags(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = [self.features[r].learned_ids for r in rows]
        offsets = np.cumsum([0] + [len(i) for i in ids[:-1]])
        return (
            torch.from_numpy(np.concatenate(ids)),
            torch.from_numpy(offsets.astype(np.int64)),
            torch.from_numpy(np.concatenate([self.features[r].learned_weights for r in rows])),
        )

    def lexical_vectors(self, rows: list[int], dimensions: int) -> torch.Tensor:
        vectors = [
            lexical_vector(f.lexical_ids, f.lexical_weights, dimensions, self.idf)
            for f in map(self.features.__getitem__, rows)
        ]
        return torch.from_numpy(np.stack(vectors))


def vocabulary(groups: dict[str, list[str]], min_df: int) -> frozenset[str]:
    """The words (not numbers) of at least `min_df` training documents: those the learned channel
    reads (a name, a number or a word of a few documents stays the lexical channel's, as the
    held-out set's names and numbers are new)."""
    df: dict[str, int] = {}
    for docs in groups.values():
        for word in {w for t in docs for w in _WORD.findall(unicodedata.normalize("NFKC", t).casefold())}:
            df[word] = df.get(word, 0) + 1
    return frozenset(w for w, n in df.items() if n >= min_df and not w.isdigit())


def embed(bag: torch.nn.EmbeddingBag, texts: Texts, rows: list[int], lexical: tuple) -> torch.Tensor:
    """The texts' vectors as the runtime computes them: the learned channel and the lexical one,
    each unit length, scaled by channel_scales."""
    ids, offsets, weights = texts.bags(rows)
    learned = torch.nn.functional.normalize(bag(ids, offsets, per_sample_weights=weights), dim=-1)
    dims, weight, shares = lexical
    if not dims:
        return learned
    scales = torch.tensor([channel_scales(texts.features[r].known_share, weight, shares) for r in rows])
    has = torch.tensor([len(texts.features[r].learned_ids) > 0 for r in rows])
    scales[~has] = torch.tensor([0.0, 1.0])
    return torch.cat([learned * scales[:, :1], texts.lexical_vectors(rows, dims) * scales[:, 1:]], 1)


def recall(
    bag: torch.nn.EmbeddingBag, texts: Texts, pairs: list[dict], subset: str, lexical: tuple
) -> dict[str, float]:
    """Chunk recall@1 and @5 of `subset`'s questions against every chunk of the validation documents."""
    chunks = sorted({texts.add(c) for p in pairs for c in [p["chunk"], *p["negatives"]]})
    asked = [p for p in pairs if p["subset"] == subset]
    if not asked:
        return {}
    with torch.no_grad():
        matrix = embed(bag, texts, chunks, lexical)
        queries = embed(bag, texts, [texts.add(p["query"]) for p in asked], lexical)
        top = torch.topk(queries @ matrix.T, 5, dim=1).indices.numpy()
    where = {row: i for i, row in enumerate(chunks)}
    gold = np.array([where[texts.add(p["chunk"])] for p in asked])
    return {
        "recall@1": float(np.mean(top[:, 0] == gold)),
        "recall@5": float(np.mean((top == gold[:, None]).any(1))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pairs", type=Path, required=True, help="JSON lines from bench.ai_search_corpus --write-train"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "ai-search-embedder"
    )
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dim", type=int, default=DIM)
    parser.add_argument("--buckets", type=int, default=BUCKETS)
    parser.add_argument("--chat-pairs", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=58)
    parser.add_argument(
        "--facts-per-batch", type=int, default=4, help="a batch's corpus questions ask about this many facts"
    )
    parser.add_argument("--chat-share", type=float, default=0.1, help="of each batch, from the chat corpus")
    parser.add_argument("--char-ngrams", default="3,5")
    parser.add_argument(
        "--lexical-dims", type=int, default=LEXICAL_DIM, help="the lexical channel's width (0: none)"
    )
    parser.add_argument(
        "--lexical-weight", type=float, default=LEXICAL_WEIGHT, help="its share of the cosine"
    )
    parser.add_argument(
        "--low-share", type=float, default=LOW_SHARE, help="a text's vocabulary share for no learned weight"
    )
    parser.add_argument(
        "--full-share",
        type=float,
        default=FULL_SHARE,
        help="a text's vocabulary share for the full learned weight",
    )
    parser.add_argument(
        "--min-df",
        type=int,
        default=5,
        help="training documents a word is in for the learned channel to read it",
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    started = time.perf_counter()

    lo, hi = (int(n) for n in args.char_ngrams.split(","))
    spec = dict(FEATURES, buckets=args.buckets, char_ngrams=[lo, hi])
    corpus = [json.loads(line) for line in args.pairs.read_text().splitlines() if line.strip()]
    validation = [p for p in corpus if zlib.crc32(p["key"].encode()) % 20 == 0]
    train = [p for p in corpus if zlib.crc32(p["key"].encode()) % 20 != 0]
    chat = chat_pairs(args.chat_pairs, args.seed) if args.chat_pairs else []
    by_fact: dict[str, list[dict]] = {}
    for p in train:
        by_fact.setdefault(p.get("fact", "?"), []).append(p)
    facts = sorted(by_fact)
    documents: dict[str, list[str]] = {}
    for i, p in enumerate(train + chat):
        key = p["key"] if p["subset"] != "chat" else f"{p['key']}:{i}"  # a chat pair is a document of its own
        documents.setdefault(key, []).extend([p["query"], p["chunk"], *p["negatives"]])
    spec["vocabulary"] = sorted(vocabulary(documents, args.min_df))
    texts = Texts(Featurizer(spec))
    groups = {key: {texts.add(t) for t in docs} for key, docs in documents.items()}
    for p in validation:
        texts.add(p["query"]), texts.add(p["chunk"])
    used = texts.document_frequency(groups)
    print(
        f"vocabulary: {len(spec['vocabulary'])} words in {args.min_df}+ of {len(groups)} documents; "
        f"{int(used.sum())} of {args.buckets} buckets learned"
    )
    print(f"{len(train)} corpus pairs and {len(chat)} chat pairs to train on, {len(validation)} to validate, "
          f"{len(texts.features)} texts featurized in {time.perf_counter() - started:.1f}s")  # fmt: skip

    bag = torch.nn.EmbeddingBag(args.buckets, args.dim, mode="sum", sparse=True)
    torch.nn.init.normal_(bag.weight, std=1.0 / math.sqrt(args.dim))
    log_scale = torch.nn.Parameter(torch.tensor(math.log(20.0)))
    opt_table = torch.optim.SparseAdam(list(bag.parameters()), lr=args.lr)
    opt_scale = torch.optim.Adam([log_scale], lr=args.lr)
    losses = []
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for opt in (opt_table, opt_scale):
            for group in opt.param_groups:
                group["lr"] = lr
        n_chat = int(args.batch * args.chat_share) if chat else 0
        per_fact = (args.batch - n_chat) // args.facts_per_batch
        batch = rng.sample(chat, n_chat)
        for fact in rng.sample(facts, args.facts_per_batch):
            batch += rng.sample(by_fact[fact], per_fact)
        queries = [texts.index[p["query"]] for p in batch]
        positives = [texts.index[p["chunk"]] for p in batch]
        hard = [texts.index[rng.choice(p["negatives"])] for p in batch if p["negatives"]]
        lexical = (args.lexical_dims, args.lexical_weight, (args.low_share, args.full_share))
        q = embed(bag, texts, queries, lexical)
        c = embed(bag, texts, positives + hard, lexical)
        logits = log_scale.exp().clamp(max=100.0) * (q @ c.T)
        # two chunks of the batch may be the same text (two questions about one sentence): not negatives
        same = torch.tensor(positives)[:, None] == torch.tensor(positives + hard)[None, :]
        same.fill_diagonal_(False)
        logits = logits.masked_fill(same, -1e4)
        target = torch.arange(len(batch))
        loss = torch.nn.functional.cross_entropy(logits, target)
        loss = loss + 0.5 * torch.nn.functional.cross_entropy(logits[:, : len(batch)].T, target)
        opt_table.zero_grad(), opt_scale.zero_grad()
        loss.backward()
        opt_table.step(), opt_scale.step()
        losses.append(float(loss.detach()))
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {np.mean(losses[-100:]):.4f}  scale {float(log_scale.exp()):.1f}  "
                  f"{time.perf_counter() - started:.0f}s")  # fmt: skip

    lexical = (args.lexical_dims, args.lexical_weight, (args.low_share, args.full_share))
    reached = {s: recall(bag, texts, validation, s, lexical) for s in ("shared", "paraphrased")}
    print("validation chunk recall:", json.dumps(reached))
    alone = {s: recall(bag, texts, validation, s, (0, 0.0, (0.0, 1.0))) for s in ("shared", "paraphrased")}
    print("validation chunk recall, learned channel alone:", json.dumps(alone))
    args.out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    table = (
        (bag.weight.detach() * torch.from_numpy(used.astype(np.float32))[:, None])
        .to(torch.float16)
        .contiguous()
    )
    idf = torch.from_numpy(texts.idf).to(torch.float16).contiguous()
    save_file({"embedding": table, "idf": idf}, str(args.out / "model.safetensors"), metadata={"name": NAME})
    config = {
        "name": NAME,
        "architecture": "hashed features -> [learned embedding bag (sum) of the vocabulary words' features, "
        "L2-normalized] x a ++ [lexical channel: every word and word pair, idf-weighted, sign-hashed, "
        "L2-normalized] x b; a^2 = (1 - weight) x clip((vocabulary share - low_share) / "
        "(full_share - low_share), 0, 1), b^2 = 1 - a^2",
        "dimensions": args.dim + args.lexical_dims, "learned_dimensions": args.dim,
        "lexical": {
            "dimensions": args.lexical_dims, "weight": args.lexical_weight,
            "low_share": args.low_share, "full_share": args.full_share,
            "idf": "the idf tensor: log((n + 1) / (df + 1)) + 1 over the n training documents",
        },
        "vocabulary_min_df": args.min_df,
        "dtype": "float16", "features": spec,
    }  # fmt: skip
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    flags = [("pairs", "PAIRS")] + [
        (name.replace("_", "-"), getattr(args, name))
        for name in (
            "steps", "batch", "lr", "dim", "buckets", "chat_pairs", "seed", "facts_per_batch", "chat_share",
            "char_ngrams", "lexical_dims", "lexical_weight", "low_share", "full_share", "min_df",
        )
    ]  # fmt: skip
    training = {
        "name": NAME,
        "command": "python -m bench.ai_search_corpus --write-train PAIRS && "
        + "python -m models.recipe.train_embedder "
        + " ".join(f"--{flag} {value}" for flag, value in flags),
        "data": {
            "corpus_pairs": len(train),
            "chat_pairs": len(chat),
            "validation_pairs": len(validation),
            "source": "bench/ai_search_corpus.py training split (TRAIN_SEED, names disjoint from the "
            "held-out set's, the same lexicon and templates) + models/recipe/chat_examples.py (split train)",
        },
        "seed": args.seed, "steps": args.steps, "batch": args.batch, "lr": args.lr,
        "facts_per_batch": args.facts_per_batch, "chat_share": args.chat_share,
        "loss": {"first_100": float(np.mean(losses[:100])), "last_100": float(np.mean(losses[-100:]))},
        "temperature": float(1.0 / log_scale.exp()),
        "vocabulary_words": len(spec["vocabulary"]),
        "learned_buckets": int(used.sum()),
        "validation_chunk_recall": reached,
        "validation_chunk_recall_learned_channel_alone": alone,
        "seconds": round(time.perf_counter() - started, 1),
        "torch": torch.__version__,
    }  # fmt: skip
    (args.out / "training.json").write_text(json.dumps(training, indent=2) + "\n")
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
