"""Train the MTP layer (models/recipe/mtp.py) of a shipped miniature, the main model frozen; `train.py --mtp`.

    python -m models.recipe.train --family kimi --mtp --out models/kimi-k2-mini

The main model is the existing checkpoint in --out (float32, eval, no grad). The target is the main
model itself: the engine keeps a draft iff it equals the main model's own next token, so the loss is
the self-distillation KL(main softmax at q+1 || MTP softmax at q), plus `--ce-weight` times the CE
on the text's x[q+2]. Same corpus and split as the main training, seeded. The checkpoint gains the
MTP tensors in bf16 under `model.layers.N.`; every existing tensor is kept byte-identical (checked).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from models.recipe.common import BIAS_UPDATE_RATE, encode_corpus, lr_at, write_published_config
from models.recipe.mtp import MTPLayer, mtp_logits, mtp_rows

EVAL_WINDOWS = 64
EVAL_SEQ = 1024
EVAL_BATCH = 8


def load_main(out: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.eval()
    model.requires_grad_(False)
    return model


@torch.no_grad()
def evaluate(model, mtp: MTPLayer, tokens: torch.Tensor, seq: int = EVAL_SEQ, windows: int = EVAL_WINDOWS):
    """Held-out first-draft acceptance and MTP CE vs x[q+2], over `windows` windows of `seq` tokens."""
    was_training = mtp.training
    mtp.eval()
    stride = max(seq, (len(tokens) - seq) // windows)
    starts = list(range(0, len(tokens) - seq, stride))[:windows]
    accepted = rows = 0
    ce_total, ce_count = 0.0, 0
    for i in range(0, len(starts), EVAL_BATCH):
        x = torch.stack([tokens[s : s + seq] for s in starts[i : i + EVAL_BATCH]]).long()
        main, logits = mtp_logits(model, mtp, x)
        accepted += int((logits.argmax(-1) == main[:, 1:].argmax(-1)).sum())
        rows += logits.shape[0] * logits.shape[1]
        ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 2:].flatten(), reduction="sum")
        ce_total += float(ce)
        ce_count += x[:, 2:].numel()
    mtp.train(was_training)
    return accepted / rows, ce_total / ce_count


def bf16_rounded(mtp: MTPLayer) -> MTPLayer:
    """The layer as it ships (bf16 weights), in float32 for evaluation."""
    import copy

    shipped = copy.deepcopy(mtp)
    with torch.no_grad():
        for t in list(shipped.parameters()) + list(shipped.buffers()):
            t.copy_(t.to(torch.bfloat16).to(t.dtype))
    return shipped


def write_checkpoint(out: Path, mtp: MTPLayer) -> int:
    """Add the MTP tensors (bf16) to out/model.safetensors; returns how many were added."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    with safe_open(path, "pt") as f:
        metadata = f.metadata() or {"format": "pt"}
    prefix = f"model.layers.{mtp.layer_idx}."
    # A re-run replaces an earlier MTP layer; everything else is kept as it is.
    kept = {k: v for k, v in load_file(path).items() if not k.startswith(prefix)}
    added = mtp.hub_state_dict(torch.bfloat16)
    tmp = path.with_suffix(".tmp")
    save_file({**kept, **added}, tmp, metadata=metadata)
    written = load_file(tmp)
    for name, tensor in kept.items():
        new = written[name]
        if (
            new.dtype != tensor.dtype
            or new.shape != tensor.shape
            or not torch.equal(new.view(torch.uint8), tensor.view(torch.uint8))
        ):
            raise RuntimeError(f"{name} changed while adding the MTP layer")
    os.replace(tmp, path)
    return len(added)


def set_nextn_layers(out: Path, family: str, layers: int) -> None:
    eos = json.loads((out / "config.json").read_text())["eos_token_id"]
    write_published_config(out, family, eos, nextn_predict_layers=layers)


def train_mtp(args) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out: Path = args.out
    model = load_main(out)
    config = model.config
    train_tokens = encode_corpus(out / "tokenizer.json", heldout=False)
    held_tokens = encode_corpus(out / "tokenizer.json", heldout=True)
    print(f"train tokens {len(train_tokens):,}, held-out tokens {len(held_tokens):,}", flush=True)

    mtp = MTPLayer.from_main(model, pass_through=not args.random_eh_proj)
    mtp.embed_tokens.requires_grad_(False)  # frozen copies of the main model's embedding and head
    mtp.shared_head.head.requires_grad_(False)
    mtp.train()
    trainable = [p for p in mtp.parameters() if p.requires_grad]
    params = sum(p.numel() for p in mtp.parameters())
    print(f"MTP parameters {params:,} ({sum(p.numel() for p in trainable):,} trained)", flush=True)
    acc0, ce0 = evaluate(model, bf16_rounded(mtp), held_tokens, windows=args.eval_windows)
    print(f"at init: held-out acceptance {acc0:.4f}, MTP CE {ce0:.3f}", flush=True)

    opt = torch.optim.AdamW(
        [
            {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gate = mtp.layer.mlp.gate
    load = torch.zeros(config.n_routed_experts)

    def count_load(_module, _inputs, output):
        load.add_(torch.bincount(output[2].reshape(-1), minlength=config.n_routed_experts).float())

    gate.register_forward_hook(count_load)

    gen = torch.Generator().manual_seed(args.seed)
    started = time.time()
    total = args.steps + args.long_steps
    seen = 0
    for step in range(total):
        batch, seq = (args.batch, args.seq) if step < args.steps else (args.long_batch, args.long_seq)
        # seq + 2 tokens: the main model reads seq + 1, the MTP rows are q = 0..seq-1, CE targets x[q+2].
        starts = torch.randint(0, len(train_tokens) - seq - 2, (batch,), generator=gen)
        w = torch.stack([train_tokens[s : s + seq + 2] for s in starts.tolist()]).long()
        x = w[:, :-1]
        with torch.no_grad():
            hidden = model.model(x).last_hidden_state
            teacher = F.log_softmax(model.lm_head(hidden[:, 1:]), -1).flatten(0, 1)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, args.lr, args.warmup)
        load.zero_()
        logits = mtp_rows(model, mtp, hidden, x).flatten(0, 1)
        logp = F.log_softmax(logits, -1)
        kl = F.kl_div(logp, teacher, log_target=True, reduction="batchmean")
        ce = F.nll_loss(logp, w[:, 2:].flatten())
        loss = kl + args.ce_weight * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        seen += batch * seq
        with torch.no_grad():  # auxiliary-loss-free balancing, as the main training
            gate.e_score_correction_bias += BIAS_UPDATE_RATE * torch.sign(load.mean() - load)
        if step % 25 == 0 or step == total - 1:
            agree = float((logits.argmax(-1) == teacher.argmax(-1)).float().mean())
            rate = seen / (time.time() - started)
            print(
                f"step {step:4d} seq {seq} kl {kl.item():.3f} ce {ce.item():.3f} train-accept {agree:.3f} "
                f"max-expert-share {float(load.max() / load.sum()):.2f} {rate:,.0f} tok/s",
                flush=True,
            )
    seconds = time.time() - started
    acc, ce_held = evaluate(model, bf16_rounded(mtp), held_tokens, windows=args.eval_windows)
    print(f"held-out acceptance {acc:.4f}, MTP CE {ce_held:.3f} after {seconds:.0f} s", flush=True)
    if args.dry_run:
        return
    added = write_checkpoint(out, mtp)
    set_nextn_layers(out, args.family, 1)
    record = json.loads((out / "training.json").read_text())
    record["mtp"] = {
        "recipe": "python -m models.recipe.train " + shlex.join(sys.argv[1:]),
        "arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "loss": f"KL(main softmax at q+1 || MTP softmax at q) + {args.ce_weight} * CE(x[q+2])",
        "init": "decoder layer from layer 3, eh_proj "
        + ("random" if args.random_eh_proj else "[0 | I] (hidden passes through)"),
        "parameters": params,
        "tensors": added,
        "steps": total,
        "train_tokens_seen": seen,
        "seconds": round(seconds),
        "heldout_first_token_acceptance": round(acc, 4),
        "heldout_acceptance_at_init": round(acc0, 4),
        "heldout_mtp_ce": round(ce_held, 4),
        "heldout_mtp_ce_at_init": round(ce0, 4),
        "heldout_eval": f"{args.eval_windows} windows of {EVAL_SEQ} tokens, bf16 MTP weights",
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {added} MTP tensors to {out / 'model.safetensors'}", flush=True)
