"""Our shipped miniatures as GGUF f32, converted with the llama.cpp build's own convert_hf_to_gguf.py.

Three facts from the trial conversion (issue 17) are handled here, never by editing llama.cpp's files:
- the converter does not know our tokenizer's pre-tokenizer hash; the tokenizer is byte-level BPE with
  the GPT-2 regex, so the name "gpt-2" is given to it in memory (`python bench/llamacpp_gguf.py` runs
  the converter in this process with that one method wrapped);
- llama.cpp's deepseek2 loader needs `attention.q_lora_rank`, which the converter writes only when
  config.json has a number: `q_lora_rank: null` becomes 0 in a temporary copy of config.json;
- a DeepSeek-V3 config without `scoring_func: sigmoid` converts silently to softmax routing, so a
  config that does not say sigmoid is refused rather than converted wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# the converter's name for the GPT-2 pre-tokenizer regex (llama-vocab.cpp's LLAMA_VOCAB_PRE_TYPE_GPT2)
GPT2_PRE = "gpt-2"


def patched_config(config: dict[str, Any]) -> dict[str, Any]:
    """config.json as llama.cpp's converter and loader need it; the input is left as it was."""
    out = dict(config)
    if "q_lora_rank" in out and out["q_lora_rank"] is None:
        out["q_lora_rank"] = 0  # no query compression: the loader wants the key, 0 means none
    if out.get("n_routed_experts") and out.get("scoring_func", "softmax") != "sigmoid":
        raise ValueError(
            f"scoring_func={out.get('scoring_func')!r}: llama.cpp would route with it while our engine "
            "routes with sigmoid; the comparison would be of different models"
        )
    return out


def is_gpt2_byte_level(tokenizer_json: dict[str, Any]) -> bool:
    """Whether a tokenizer.json pre-tokenizes as GPT-2 does: byte-level, its regex, no prefix space."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    return (
        pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space", False)
        and tokenizer_json.get("normalizer") is None
    )


def stage(model_dir: Path, into: Path) -> Path:
    """A copy of `model_dir` for the converter: every file linked, config.json patched."""
    into.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        if path.is_file() and path.name != "config.json":
            (into / path.name).symlink_to(path.resolve())
    config = json.loads((model_dir / "config.json").read_text())
    (into / "config.json").write_text(json.dumps(patched_config(config), indent=2))
    return into


def gguf_path(cache: Path, model_dir: Path) -> Path:
    return cache / "gguf" / f"{model_dir.name}-f32.gguf"


def convert(model_dir: Path, llama_src: Path, cache: Path) -> Path:
    """The model as GGUF f32 under `cache`, converted once (again when the checkpoint is newer)."""
    out = gguf_path(cache, model_dir)
    newest = max(p.stat().st_mtime for p in model_dir.iterdir() if p.is_file())
    if out.exists() and out.stat().st_mtime > newest:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gguf-stage-") as tmp:
        staged = stage(model_dir, Path(tmp) / model_dir.name)
        subprocess.run(
            [sys.executable, __file__, str(llama_src), str(staged), "--outtype", "f32"]
            + ["--outfile", str(out)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return out


def _run_converter(llama_src: Path, argv: list[str]) -> None:
    """convert_hf_to_gguf.py's main in this process, its pre-tokenizer lookup knowing our tokenizer."""
    import runpy

    sys.path[:0] = [str(llama_src), str(llama_src / "gguf-py")]
    from conversion.base import TextModel  # the sdist's own package, from the line above

    lookup = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        path = Path(self.dir_model) / "tokenizer.json"
        if path.exists() and is_gpt2_byte_level(json.loads(path.read_text())):
            return GPT2_PRE
        return lookup(self, tokenizer)

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(llama_src / "convert_hf_to_gguf.py"), *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    _run_converter(Path(sys.argv[1]), sys.argv[2:])
