"""Why llguidance: the grammar libraries' compile and mask cost on a miniature's vocabulary.

    python bench/grammar_libs.py [--model models/kimi-k2-mini]

llguidance is a dependency. xgrammar and outlines-core are not (xgrammar 0.2 also needs
apache-tvm-ffi); to compare, install them aside and point PYTHONPATH there:

    pip install --target /tmp/grammar-libs --no-deps xgrammar apache-tvm-ffi outlines-core
    PYTHONPATH=/tmp/grammar-libs python bench/grammar_libs.py

For each library: the tokenizer build, one JSON schema compiled (the schema of the end-to-end test),
and the mask fill plus token advance per token, walking one valid answer. A library that is not
installed, or fails, is reported as such.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["city", "unit", "days", "tags"],
    "additionalProperties": False,
}
ANSWER = '{"city": "Paris", "unit": "celsius", "days": 3, "tags": ["sun", "wind"]}'
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - start) * 1000


def llguidance_costs(tokenizer_json: str, eos: int, ids: list[int], vocab: int) -> tuple[float, float, float]:
    import llguidance
    import llguidance.torch as lt

    tok, build = timed(lambda: llguidance.LLTokenizer(tokenizer_json, eos_token=eos))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=COMPACT)
    matcher, compile_ms = timed(lambda: llguidance.LLMatcher(tok, grammar))
    mask = lt.allocate_token_bitmask(1, vocab)

    def walk():
        for i in ids:
            lt.fill_next_token_bitmask(matcher, mask, 0)
            assert matcher.consume_token(i)

    _, walk_ms = timed(walk)
    return build, compile_ms, walk_ms / len(ids)


def xgrammar_costs(tokenizer_json: str, eos: int, ids: list[int], vocab: int) -> tuple[float, float, float]:
    import json

    import xgrammar as xgr
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    def build():
        hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json))
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
        return xgr.GrammarCompiler(info)

    compiler, build_ms = timed(build)
    schema = json.dumps(SCHEMA)
    compiled, compile_ms = timed(lambda: compiler.compile_json_schema(schema, any_whitespace=False))
    matcher, mask = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, vocab)

    def walk():
        for i in ids:
            matcher.fill_next_token_bitmask(mask)
            assert matcher.accept_token(i)

    _, walk_ms = timed(walk)
    return build_ms, compile_ms, walk_ms / len(ids)


def main() -> None:
    import json

    from tokenizers import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "models" / "kimi-k2-mini"))
    args = parser.parse_args()
    model = Path(args.model)
    tokenizer_json = (model / "tokenizer.json").read_text()
    eos = json.loads((model / "config.json").read_text())["eos_token_id"]
    hf = Tokenizer.from_str(tokenizer_json)
    ids, vocab = hf.encode(ANSWER, add_special_tokens=False).ids, hf.get_vocab_size()
    print(f"{model.name}: vocab {vocab}, one answer of {len(ids)} tokens\n")
    print("| library | tokenizer build ms | schema compile ms | mask + advance ms/token |")
    print("| --- | ---: | ---: | ---: |")
    for name, costs in (("llguidance", llguidance_costs), ("xgrammar", xgrammar_costs)):
        try:
            build, compile_ms, per_token = costs(tokenizer_json, eos, ids, vocab)
        except ImportError as exc:
            print(f"| {name} | not installed ({exc.name}) | | |")
            continue
        print(f"| {name} | {build:.1f} | {compile_ms:.2f} | {per_token:.3f} |")
    print("\noutlines-core: not compared (it builds its index from a Hugging Face hub name or from a")
    print("vocabulary of decoded pieces; with this byte-level vocabulary mapped by hand, its Index")
    print("refused valid tokens).")


if __name__ == "__main__":
    main()
