#!/usr/bin/env python3
"""PyTorch reference for the mixture-of-experts models (Mixtral, Qwen3-MoE): the golden side of the MoE parity test.

Reads a model directory with moe.json (the engine's model keys: the shape keys and the MoE keys with Megatron's
names) and model.safetensors (F32, Hugging Face parameter names), and a batch (input_ids, labels); writes the loss
and the gradient of every parameter of

    objective = mean cross-entropy + aux_weight * sum over MoE layers of (aux loss + z-loss)

where aux_weight = tokens / counted tokens (the engine weighs a micro-batch's router losses by its share of the
step's tokens). The routing follows Megatron's TopKRouter: softmax or sigmoid scores, optional grouped selection,
top-k, renormalisation, scaling; the experts are SwiGLU MLPs, written out as a loop over experts. Dropless unless
moe_expert_capacity_factor is set: then each expert keeps ceil(N k / E x factor) of its tokens, those of the largest
routing weights (drop policy probs) or the earliest (position), and the dropped ones contribute nothing (padding to
the capacity adds zero rows, which change nothing here). The balancing loss is the switch aux loss over the batch
(aux_loss) or Megatron's per-sequence form averaged over the batch rows (seq_aux_loss), both counting the router's
choices before any drop. Attention, norms and RoPE are tools/torch_llama.py's.

Exit codes: 0 ok, 2 bad arguments or unsupported config, 3 unreadable or corrupt input file.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama as base  # noqa: E402  (reads safetensors, attention, norms and RoPE)


class MoeConfig:
    """The attention config of torch_llama plus the MoE keys, from moe.json."""

    def __init__(self, path):
        try:
            with open(path, encoding="utf-8") as f:
                c = json.load(f)
        except OSError as e:
            raise base.FileFormatError(f"{path}: cannot read: {e.strerror}") from None
        except ValueError as e:
            raise base.FileFormatError(f"{path}: not valid JSON: {e}") from None
        try:
            self.vocab_size = int(c["vocab_size"])
            self.hidden = int(c["hidden_size"])
            self.ffn = int(c["ffn_hidden_size"])
            self.layers = int(c["num_layers"])
            self.heads = int(c["num_attention_heads"])
            self.kv_heads = int(c["num_query_groups"])
            self.head_dim = int(c["kv_channels"])
            self.eps = float(c["norm_epsilon"])
            self.theta = float(c["rotary_base"])
            self.tied = not bool(c["untie_embeddings_and_output_weights"])
            self.qk_norm = bool(c["qk_layernorm"])
            self.experts = int(c["num_experts"])
            self.topk = int(c["moe_router_topk"])
            self.moe_ffn = int(c["moe_ffn_hidden_size"])
            self.shared = int(c["moe_shared_expert_intermediate_size"])
            self.layer_is_moe = [bool(v) for v in c["moe_layers"]]
            self.sigmoid = c["moe_router_score_function"] == "sigmoid"
            self.pre_softmax = bool(c["moe_router_pre_softmax"])
            self.scaling = float(c["moe_router_topk_scaling_factor"])
            self.aux_coeff = float(c["moe_aux_loss_coeff"])
            self.z_coeff = float(c["moe_z_loss_coeff"])
            self.groups = int(c["moe_router_num_groups"])
            self.group_topk = int(c["moe_router_group_topk"])
            self.capacity_factor = float(c.get("moe_expert_capacity_factor", 0.0))
            self.drop_by_position = c.get("moe_token_drop_policy", "probs") == "position"
            self.seq_aux = c.get("moe_router_load_balancing_type", "aux_loss") == "seq_aux_loss"
        except (KeyError, TypeError, ValueError) as e:
            raise base.UsageError(f"{path}: bad or missing key: {e}") from None
        if len(self.layer_is_moe) != self.layers:
            raise base.UsageError(f"{path}: moe_layers lists {len(self.layer_is_moe)} layers, not {self.layers}")
        self.rope_scaling = None


def moe_names(cfg, pre):
    """(router, [(gate_proj, up_proj, down_proj) per expert], shared prefix) in Hugging Face names."""
    block = pre + ("mlp." if cfg.qk_norm else "block_sparse_moe.")
    if cfg.qk_norm:
        experts = [tuple(f"{block}experts.{e}.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj"))
                   for e in range(cfg.experts)]
    else:
        experts = [tuple(f"{block}experts.{e}.{n}.weight" for n in ("w1", "w3", "w2")) for e in range(cfg.experts)]
    return block + "gate.weight", experts, block + "shared_experts."


def swiglu(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def route(cfg, logits):
    """Scores [N, E], chosen experts [N, k] and their weights [N, k] (Megatron's TopKRouter)."""
    scores = torch.sigmoid(logits) if cfg.sigmoid else torch.softmax(logits, dim=-1)
    ranked = scores.detach().clone()
    n, e = ranked.shape
    if cfg.groups > 1:
        per = e // cfg.groups
        group_scores = ranked.view(n, cfg.groups, per).topk(cfg.topk // cfg.group_topk, dim=-1).values.sum(-1)
        best = group_scores.topk(cfg.group_topk, dim=-1).indices  # [N, group_topk]
        keep = torch.zeros(n, cfg.groups, dtype=torch.bool).scatter(1, best, True)
        ranked = ranked.masked_fill(~keep.unsqueeze(-1).expand(n, cfg.groups, per).reshape(n, e), float("-inf"))
    chosen = ranked.topk(cfg.topk, dim=-1).indices
    weights = scores.gather(1, chosen)
    if cfg.sigmoid or not cfg.pre_softmax:
        weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if cfg.sigmoid else 0.0))
    return scores, chosen, weights * cfg.scaling


def kept_entries(cfg, chosen, weights, n):
    """[N, k] bool: the routing entries within their expert's capacity (all of them without one)."""
    keep = torch.ones_like(chosen, dtype=torch.bool)
    if cfg.capacity_factor <= 0:
        return keep
    capacity = math.ceil(n * cfg.topk / cfg.experts * cfg.capacity_factor)
    keep[:] = False
    w = weights.detach()
    for e in range(cfg.experts):
        rows, slot = (chosen == e).nonzero(as_tuple=True)  # tokens ascending
        if cfg.drop_by_position:
            order = torch.arange(rows.numel())
        else:
            order = torch.sort(w[rows, slot], descending=True, stable=True).indices
        order = order[:capacity]
        keep[rows[order], slot[order]] = True
    return keep


def balancing_loss(cfg, scores, chosen, sequences):
    """The aux loss with its coefficient: over all N tokens, or per sequence (Megatron's seq form) averaged."""
    n = scores.shape[0]
    p = scores / (scores.sum(-1, keepdim=True) + 1e-20) if cfg.sigmoid else scores
    if not cfg.seq_aux:
        counts = torch.bincount(chosen.flatten(), minlength=cfg.experts).to(scores.dtype)
        return cfg.aux_coeff * cfg.experts / (cfg.topk * n * n) * (counts * p.sum(0)).sum()
    s = n // sequences
    one_hot = torch.zeros(n, cfg.experts, dtype=scores.dtype).scatter(1, chosen, 1.0)
    counts = one_hot.view(sequences, s, cfg.experts).sum(1)  # [B, E]
    cost = counts / (s * cfg.topk / cfg.experts)
    return cfg.aux_coeff * (cost * p.view(sequences, s, cfg.experts).mean(1)).sum(1).mean()


def moe_block(cfg, params, pre, x):
    """x [B, T, C] -> (the block's output [B, T, C], its aux + z losses)."""
    b, t, c = x.shape
    h = x.reshape(-1, c)
    n = h.shape[0]
    gate, experts, shared = moe_names(cfg, pre)
    logits = h @ params[gate].T  # [N, E]
    scores, chosen, weights = route(cfg, logits)
    keep = kept_entries(cfg, chosen, weights, n)
    out = torch.zeros_like(h)
    for e, (w1, w3, w2) in enumerate(experts):
        rows, slot = ((chosen == e) & keep).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        y = swiglu(h[rows], params[w1], params[w3], params[w2])
        out = out.index_add(0, rows, weights[rows, slot].unsqueeze(-1) * y)
    if cfg.shared > 0:
        out = out + swiglu(h, params[shared + "gate_proj.weight"], params[shared + "up_proj.weight"],
                           params[shared + "down_proj.weight"])
    losses = torch.zeros((), dtype=h.dtype)
    if cfg.aux_coeff > 0:
        losses = losses + balancing_loss(cfg, scores, chosen, b)
    if cfg.z_coeff > 0:
        losses = losses + cfg.z_coeff * torch.logsumexp(logits, dim=-1).pow(2).mean()
    return out.view(b, t, c), losses


def decoder_layer(cfg, params, pre, is_moe, x, cos, sin, attention=base.attention):
    """One layer under prefix `pre` ("model.layers.3."): (its output [B, T, C], its router losses)."""
    p = {k[len(pre):]: v for k, v in params.items() if k.startswith(pre)}
    x = x + attention(cfg, p, base.rms_norm(x, p["input_layernorm.weight"], cfg.eps), cos, sin)
    h = base.rms_norm(x, p["post_attention_layernorm.weight"], cfg.eps)
    if is_moe:
        m, losses = moe_block(cfg, params, pre, h)
    else:
        m, losses = base.mlp(p, h), torch.zeros((), dtype=x.dtype)
    return x + m, losses


def output_loss(cfg, params, x, labels, norm="model.norm.weight"):
    """Mean cross-entropy of the shared output layer over x [B, T, C] after the RMSNorm `norm`."""
    x = base.rms_norm(x, params[norm], cfg.eps)
    head = params["model.embed_tokens.weight" if cfg.tied else "lm_head.weight"]
    logits = x @ head.T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), labels.reshape(-1),
                                             ignore_index=-100, reduction="mean")


def trunk(cfg, params, input_ids, attention=base.attention, rope_tables=base.rope_tables):
    """The decoder's last hidden state before the final norm [B, T, C], Σ router losses, and the RoPE tables."""
    _, t = input_ids.shape
    dtype = params["model.embed_tokens.weight"].dtype
    cos, sin = rope_tables(cfg, t, dtype)
    x = params["model.embed_tokens.weight"][input_ids]
    router_losses = torch.zeros((), dtype=dtype)
    for i in range(cfg.layers):
        x, losses = decoder_layer(cfg, params, f"model.layers.{i}.", cfg.layer_is_moe[i], x, cos, sin, attention)
        router_losses = router_losses + losses
    return x, router_losses, (cos, sin)


def forward(cfg, params, input_ids, labels, attention=base.attention, rope_tables=base.rope_tables):
    """(mean cross-entropy, Σ router losses); labels as torch_llama's (no shift, -100 ignored). attention(cfg, p, x,
    cos, sin) and rope_tables(cfg, t, dtype) are torch_llama's unless another model (torch_mla) passes its own."""
    x, router_losses, _ = trunk(cfg, params, input_ids, attention, rope_tables)
    return output_loss(cfg, params, x, labels), router_losses


def run(args, cfg, forward_fn):
    tensors = base.read_safetensors(os.path.join(args.model_dir, "model.safetensors"))
    params = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in tensors.items()}
    input_ids, labels = base.load_batch(args.batch, cfg)
    # A forward may return a third term: further objective (torch_mla's multi-token prediction losses, weighted).
    ce, router_losses, *extra = forward_fn(cfg, params, input_ids, labels)
    aux_weight = labels.numel() / int((labels >= 0).sum())
    (ce + aux_weight * router_losses + sum(extra)).backward()
    out = {"loss": np.array(ce.item(), dtype=np.float32),
           "router_losses": np.array(router_losses.item(), dtype=np.float32)}
    if extra:
        out["extra_objective"] = np.array(sum(extra).item(), dtype=np.float32)
    for n, p in params.items():  # an expert no token chose is not in the graph: its gradient is zero
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        out["grad." + n] = grad.detach().numpy().astype(np.float32)
    base.write_safetensors(args.out, out)


def main(argv=None, name="torch_moe", doc=__doc__, config_file="moe.json", config_class=MoeConfig,
         forward_fn=forward):
    """The command line of this script, and of torch_mla's with its own name, config file, config and forward."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help=f"directory with {config_file} and model.safetensors (F32)")
    ap.add_argument("--batch", required=True, help="safetensors with input_ids [B,T] and labels [B,T] (I32)")
    ap.add_argument("--out", required=True, help="safetensors to write: loss, router_losses, grad.<name>")
    args = ap.parse_args(argv)
    try:
        run(args, config_class(os.path.join(args.model_dir, config_file)), forward_fn)
    except base.UsageError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    except base.FileFormatError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
