"""Train a miniature Kimi K2 (DeepSeek-V3 layout) or GLM-4.5 on the Python standard library, seeded.

    python -m models.recipe.train --family kimi --out models/kimi-k2-mini
    python -m models.recipe.train --family glm --out models/glm-4.5-mini
    python -m models.recipe.train --family kimi --mtp --out models/kimi-k2-mini  # train_mtp.py

Uses transformers' DeepseekV3ForCausalLM / Glm4MoeForCausalLM (the reference implementations, a
test extra) so each checkpoint is written exactly as the hub layout; nothing here runs at serve time.
Router balance: DeepSeek-V3's auxiliary-loss-free update of e_score_correction_bias after each
step (without it the sigmoid router collapses onto one expert within ~50 steps).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from models.recipe.common import BIAS_UPDATE_RATE, FAMILIES, encode_corpus, lr_at, write_published_config
from models.recipe.mixture import Mixture
from models.recipe.tokenizer import VOCAB_MULTIPLE, extend_tokenizer, write_tokenizer
from models.recipe.train_mtp import train_mtp

GLM_STOP_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
MAIN_DEFAULTS = dict(steps=1600, long_steps=200, lr=3e-3, warmup=100)
MTP_DEFAULTS = dict(steps=400, long_steps=0, lr=2e-3, warmup=30)


@torch.no_grad()
def perplexity(model, tokens: torch.Tensor, seq: int, windows: int) -> float:
    model.eval()
    total, count = 0.0, 0
    stride = max(seq, (len(tokens) - seq - 1) // windows)
    for start in range(0, len(tokens) - seq - 1, stride)[:windows]:
        x = tokens[start : start + seq + 1].long()[None]
        out = model(x[:, :-1], labels=x[:, :-1].clone())
        # HF shifts labels internally; pass inputs as labels to score tokens 1..seq-1.
        total += out.loss.item() * (seq - 1)
        count += seq - 1
    model.train()
    return math.exp(total / count)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", choices=sorted(FAMILIES), default="kimi")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--mtp", action="store_true", help="train only the MTP layer of the checkpoint in --out"
    )
    parser.add_argument("--steps", type=int, default=None, help="1600; with --mtp 400")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    # Then a long-context phase, so the 1,024- and 2,048-token contexts the quality tool measures
    # are in distribution (short windows first, long ones last, as context extension is done).
    parser.add_argument("--long-steps", type=int, default=None, help="200; with --mtp 0")
    parser.add_argument("--long-batch", type=int, default=2)
    parser.add_argument("--long-seq", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=None, help="3e-3; with --mtp 2e-3")
    parser.add_argument("--warmup", type=int, default=None, help="100; with --mtp 30")
    parser.add_argument(
        "--ce-weight", type=float, default=0.0, help="--mtp: weight of CE on x[q+2] beside the KL"
    )
    parser.add_argument("--random-eh-proj", action="store_true", help="--mtp: random eh_proj, not [0 | I]")
    parser.add_argument(
        "--eval-windows", type=int, default=64, help="--mtp: held-out windows of 1,024 tokens"
    )
    parser.add_argument("--dry-run", action="store_true", help="--mtp: train and evaluate, write nothing")
    parser.add_argument(
        "--init-from", type=Path, default=None, help="continue from this checkpoint (new rows for new tokens)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="go on from --out/resume.pt, saved every 100 steps"
    )
    parser.add_argument("--chat-share", type=float, default=0.0, help="share of rows from the chat corpus")
    parser.add_argument("--prose-share", type=float, default=0.0, help="share of rows of English prose")
    parser.add_argument("--chat-examples", type=int, default=40000, help="conversations generated")
    parser.add_argument(
        "--chat-weights", default="", help="kinds' weights over the recipe's own, e.g. tool=40,json=20"
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    defaults = MTP_DEFAULTS if args.mtp else MAIN_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.mtp:
        train_mtp(args)
        return
    for key in ("mtp", "ce_weight", "random_eh_proj", "eval_windows", "dry_run"):
        delattr(args, key)  # MTP-only; keeps the main recipe's record as it was

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    out: Path = args.out
    shape = dict(FAMILIES[args.family])
    if args.init_from is None:
        write_tokenizer(out, shape["vocab_size"], args.family)
    else:
        extend_tokenizer(args.init_from, out, args.family)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    shape["vocab_size"] = padded_vocab(tok.get_vocab_size())
    train_tokens = encode_corpus(out / "tokenizer.json", heldout=False)
    held_tokens = encode_corpus(out / "tokenizer.json", heldout=True)
    print(f"train tokens {len(train_tokens):,}, held-out tokens {len(held_tokens):,}", flush=True)
    mix = Mixture(tok, args, train_tokens)

    eos = json.loads((out / "tokenizer_config.json").read_text())["eos_token"]
    eos_id = tok.token_to_id(eos)
    # GLM-4.5 also ends a turn at the next role marker, as its published config lists.
    stop_ids = [eos_id] if args.family == "kimi" else [tok.token_to_id(t) for t in GLM_STOP_TOKENS]
    config_class, model_class = _hf_classes(args.family)
    if args.init_from is None:
        config = config_class(**shape, bos_token_id=None, eos_token_id=eos_id, pad_token_id=0)
        model = model_class(config)
    else:
        model = model_class.from_pretrained(args.init_from, dtype=torch.float32)
        # the new tokens' rows start at the mean of the old ones (transformers' mean_resizing)
        model.resize_token_embeddings(shape["vocab_size"], mean_resizing=True)
        config = model.config
    model.train()
    params = sum(p.numel() for p in model.parameters())
    print(f"parameters {params:,}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gates = [layer.mlp.gate for layer in model.model.layers[config.first_k_dense_replace :]]
    loads = [torch.zeros(config.n_routed_experts) for _ in gates]

    def count_load(i):
        def hook(_module, _inputs, output):
            loads[i] += torch.bincount(output[2].reshape(-1), minlength=config.n_routed_experts).float()

        return hook

    for i, gate in enumerate(gates):
        gate.register_forward_hook(count_load(i))

    gen = torch.Generator().manual_seed(args.seed)
    started = time.time()
    total = args.steps + args.long_steps
    seen, first = 0, 0
    resume_path = out / "resume.pt"
    if args.resume and resume_path.is_file():
        state = torch.load(resume_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        mix.rng.setstate(state["mix_rng"])
        first, seen = state["step"] + 1, state["seen"]
        started -= state["seconds"]
        print(f"resumed at step {first}", flush=True)
    for step in range(first, total):
        batch, seq = (args.batch, args.seq) if step < args.steps else (args.long_batch, args.long_seq)
        x, labels = mix.batch(batch, seq, gen, long=step >= args.steps)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, args.lr, args.warmup)
        for load in loads:
            load.zero_()
        loss = model(x, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        seen += batch * seq
        with torch.no_grad():  # auxiliary-loss-free balancing (DeepSeek-V3, section 2.1.2)
            for gate, load in zip(gates, loads, strict=True):
                gate.e_score_correction_bias += BIAS_UPDATE_RATE * torch.sign(load.mean() - load)
        if step % 50 == 0 or step == total - 1:
            share = " ".join(f"{float(load.max() / load.sum()):.2f}" for load in loads)
            rate = seen / (time.time() - started)
            print(
                f"step {step:5d} seq {seq} loss {loss.item():.3f} max-expert-share {share} {rate:,.0f} tok/s",
                flush=True,
            )
        if step % 100 == 99:
            state = dict(model=model.state_dict(), opt=opt.state_dict(), gen=gen.get_state())
            state.update(mix_rng=mix.rng.getstate(), step=step, seen=seen, seconds=time.time() - started)
            torch.save(state, resume_path.with_suffix(".tmp"))
            resume_path.with_suffix(".tmp").replace(resume_path)

    ppl = perplexity(model, held_tokens, args.long_seq, 64)
    print(f"held-out perplexity {ppl:.2f} after {time.time() - started:.0f} s", flush=True)
    model.to(torch.bfloat16).save_pretrained(out)
    resume_path.unlink(missing_ok=True)
    write_published_config(out, args.family, stop_ids if len(stop_ids) > 1 else eos_id)
    (out / "training.json").write_text(
        json.dumps(
            {
                "recipe": "python -m models.recipe.train " + recipe_flags(args),
                "parameters": params,
                "train_tokens_seen": seen,
                "heldout_perplexity": round(ppl, 3),
                "heldout_perplexity_context": args.long_seq,
                "heldout_text": "models/eval/heldout.txt (Python standard library asyncio/ sources)",
                "seconds": round(time.time() - started),
                **({"init_from": str(args.init_from), "mix": mix.describe()} if args.init_from else {}),
                **_earlier_stage(args.init_from),
            },
            indent=2,
        )
        + "\n"
    )


def _earlier_stage(init_from: Path | None) -> dict:
    """The record of the checkpoint this run continued, kept under "init_from_training" (without its
    MTP part, which the MTP run replaces), so a staged recipe stays reproducible from one file."""
    record = init_from / "training.json" if init_from else None
    if record is None or not record.is_file():
        return {}
    earlier = json.loads(record.read_text())
    earlier.pop("mtp", None)
    return {"init_from_training": earlier}


def recipe_flags(args) -> str:
    return " ".join(f for k, v in vars(args).items() if k not in ("out", "resume") and (f := _flag(k, v)))


def _flag(key: str, value) -> str:
    flag = f"--{key.replace('_', '-')}"
    if value is False or value is None or value == "":  # not `in`: 0 == False, and --steps 0 is a flag
        return ""
    return flag if value is True else f"{flag} {value}"


def padded_vocab(tokens: int) -> int:
    return -(-tokens // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def _hf_classes(family: str):
    if family == "kimi":
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

        return DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    return Glm4MoeConfig, Glm4MoeForCausalLM


if __name__ == "__main__":
    main()
