"""Every text-generation name of Cloudflare's public Workers AI catalog, served by the closest stand-in.

A script written for Workers AI names a model this runtime does not ship (`@cf/openai/gpt-oss-120b`,
`@cf/meta/llama-3.3-70b-instruct-fp8-fast`); rather than a 5007 for a name that works on Cloudflare,
each listed name is served by the catalog's miniature of the nearest architecture: the MLA
families (Moonshot's Kimi, DeepSeek V2 and later) by the Kimi K2 miniature, every other family
(GQA or MHA: Llama, Mistral, Qwen, Gemma, GLM, gpt-oss, ...) by the GLM-4.5 miniature. Every
answer's `served_by` says so, and `edge dev` warns once per name. A catalog alias with the same
name wins (it says more); `[edge] strict_models = true` serves none of these. A name on no list is
still 5007, with the nearest names.

The text-embedding names (EMBEDDING_MODELS, with each one's documented width) are served by
runtime.ai.embeddings' deterministic stand-in, never by a miniature.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

SOURCE = "@cloudflare/workers-types 5.20261117.1, interface AiModels (text generation), read 2026-12-02"
NAMES = (
    "@cf/meta/llama-2-7b-chat-int8",
    "@cf/mistral/mistral-7b-instruct-v0.1",
    "@cf/meta/llama-2-7b-chat-fp16",
    "@hf/thebloke/llama-2-13b-chat-awq",
    "@hf/thebloke/mistral-7b-instruct-v0.1-awq",
    "@hf/thebloke/zephyr-7b-beta-awq",
    "@hf/thebloke/openhermes-2.5-mistral-7b-awq",
    "@hf/thebloke/neural-chat-7b-v3-1-awq",
    "@hf/thebloke/deepseek-coder-6.7b-base-awq",
    "@hf/thebloke/deepseek-coder-6.7b-instruct-awq",
    "@cf/deepseek-ai/deepseek-math-7b-instruct",
    "@cf/defog/sqlcoder-7b-2",
    "@cf/openchat/openchat-3.5-0106",
    "@cf/tiiuae/falcon-7b-instruct",
    "@cf/thebloke/discolm-german-7b-v1-awq",
    "@cf/qwen/qwen1.5-0.5b-chat",
    "@cf/qwen/qwen1.5-7b-chat-awq",
    "@cf/qwen/qwen1.5-14b-chat-awq",
    "@cf/tinyllama/tinyllama-1.1b-chat-v1.0",
    "@cf/microsoft/phi-2",
    "@cf/qwen/qwen1.5-1.8b-chat",
    "@cf/mistral/mistral-7b-instruct-v0.2-lora",
    "@hf/nousresearch/hermes-2-pro-mistral-7b",
    "@hf/nexusflow/starling-lm-7b-beta",
    "@hf/google/gemma-7b-it",
    "@cf/meta-llama/llama-2-7b-chat-hf-lora",
    "@cf/google/gemma-2b-it-lora",
    "@cf/google/gemma-7b-it-lora",
    "@hf/mistral/mistral-7b-instruct-v0.2",
    "@cf/meta/llama-3-8b-instruct",
    "@cf/fblgit/una-cybertron-7b-v2-bf16",
    "@cf/meta/llama-3-8b-instruct-awq",
    "@cf/meta/llama-3.1-8b-instruct-fp8",
    "@cf/meta/llama-3.1-8b-instruct-awq",
    "@cf/meta/llama-3.2-3b-instruct",
    "@cf/meta/llama-3.2-1b-instruct",
    "@cf/deepseek-ai/deepseek-r1-distill-qwen-32b",
    "@cf/ibm-granite/granite-4.0-h-micro",
    "@cf/meta/llama-3.2-11b-vision-instruct",
    "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
    "@cf/meta/llama-guard-3-8b",
    "@cf/qwen/qwen2.5-coder-32b-instruct",
    "@cf/qwen/qwq-32b",
    "@cf/mistralai/mistral-small-3.1-24b-instruct",
    "@cf/google/gemma-3-12b-it",
    "@cf/meta/llama-4-scout-17b-16e-instruct",
    "@cf/qwen/qwen3-30b-a3b-fp8",
    "@cf/openai/gpt-oss-120b",
    "@cf/openai/gpt-oss-20b",
    "@cf/aisingapore/gemma-sea-lion-v4-27b-it",
    "@cf/zai-org/glm-4.7-flash",
    "@cf/moonshotai/kimi-k2.5",
    "@cf/moonshotai/kimi-k2.6",
    "@cf/nvidia/nemotron-3-120b-a12b",
    "@cf/google/gemma-4-26b-a4b-it",
    "@cf/moonshotai/kimi-k2.7-code",
    "@cf/zai-org/glm-5.2",
    "@cf/deepseek-ai/deepseek-v4-flash-0731",
    "@cf/deepseek-ai/deepseek-v4-pro-0813",
    "@cf/qwen/qwen3.8-27b",
    "@cf/zai-org/glm-5.3",
    "@cf/zai-org/glm-5.3-flash",
)
# names Cloudflare's docs and examples still use that the types above no longer list
EXAMPLE_NAMES = (
    "@cf/meta/llama-3.1-8b-instruct",
    "@cf/meta/llama-3.1-8b-instruct-fast",
    "@cf/meta/llama-3.1-70b-instruct",
)
# the text-embedding names and the width each answers in; runtime.ai.embeddings serves them
EMBEDDING_MODELS: dict[str, int] = {
    "@cf/baai/bge-small-en-v1.5": 384,
    "@cf/baai/bge-base-en-v1.5": 768,
    "@cf/baai/bge-large-en-v1.5": 1024,
    "@cf/baai/bge-m3": 1024,
}
EMBEDDING_SOURCE = "developers.cloudflare.com/workers-ai/models/ (Text Embeddings), read 2026-12-02"
MLA_PREFIXES = ("@cf/moonshotai/", "@cf/deepseek-ai/deepseek-v")  # multi-head latent attention


def stand_in_for(name: str, catalog: Mapping[str, tuple[Any, Path]]) -> str | None:
    """The catalog entry that serves `name`: the Kimi miniature for MLA families, else GLM's."""
    family = "kimi" if name.startswith(MLA_PREFIXES) else "glm"
    for entry_name, (entry, _) in catalog.items():
        target = entry.target.model if entry.target is not None else ""
        if family in entry_name or target.startswith(family):
            return entry_name
    return next(iter(catalog), None)


def stand_ins(
    catalog: Mapping[str, tuple[Any, Path]], served: list[str] | None = None
) -> dict[str, tuple[str, str]]:
    """Each listed name the catalog (entries with `target` and `aliases`) neither ships nor aliases
    -> (its stand-in among the `served` entries, default all; where the name is listed)."""
    taken = set(catalog) | {a.name for entry, _ in catalog.values() for a in entry.aliases}
    serving = {n: catalog[n] for n in (served or catalog) if n in catalog}
    out: dict[str, tuple[str, str]] = {}
    for name in (*NAMES, *EXAMPLE_NAMES):
        target = stand_in_for(name, serving)
        if name not in taken and target is not None:
            out[name] = (target, SOURCE if name in NAMES else "Cloudflare's Workers AI docs and examples")
    return out
