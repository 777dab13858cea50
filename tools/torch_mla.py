#!/usr/bin/env python3
"""PyTorch reference for DeepSeek-V2/V3-shaped models: multi-head latent attention (MLA) with optional YaRN RoPE,
dense or mixture-of-experts MLPs. The golden side of the MLA parity test.

Reads a model directory with mla.json (the engine's model keys: the keys tools/torch_moe.py reads, num_experts 0 for
a dense model, and the MLA and YaRN keys with Megatron's names) and model.safetensors (F32, DeepSeek-V2's Hugging Face
parameter names), and a batch (input_ids, labels); writes the loss and the gradient of every parameter of

    objective = mean cross-entropy + aux_weight * sum over MoE layers of (aux loss + z-loss)

as tools/torch_moe.py does, plus, with mtp_num_layers D > 0 in mla.json (multi-token prediction, DeepSeek-V3),
mtp_loss_scaling_factor / D times the sum over depths k = 1..D of module k's mean cross-entropy. Module k
(model.layers.{num_layers + k - 1}.) takes the previous depth's hidden state h (the decoder's, before its final norm,
for k = 1) and the embedding of the tokens k ahead, and computes

    h' = layer(eh_proj([enorm(embed(t[i + k])); hnorm(h)])),   loss_k = CE(lm_head(shared_head.norm(h')), labels[i + k])

with the shared embedding and output layer, the layer of the last decoder layer's kind, and no target (ignored) for
the last k positions of each row, whose tokens k ahead lie past its end (their shifted input is token 0). The attention follows Hugging Face's DeepSeek-V2 modelling as written here from its
math: the RoPE features of q and of the shared key arrive interleaved from the projections and are de-interleaved
before the rotate-half rotation; the softmax scale is 1/sqrt(qk_head_dim + qk_pos_emb_head_dim) times YaRN's
m(mscale_all_dim)^2, and the YaRN cos/sin tables carry m(mscale) / m(mscale_all_dim).

Exit codes: 0 ok, 2 bad arguments or unsupported config, 3 unreadable or corrupt input file.
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama as base  # noqa: E402  (safetensors, norms, rotate_half, batches)
import torch_moe as moe  # noqa: E402  (the MoE block and its losses)


class MlaConfig(moe.MoeConfig):
    """torch_moe's config plus the MLA and YaRN keys of the same file."""

    def __init__(self, path):
        super().__init__(path)
        with open(path, encoding="utf-8") as f:
            c = json.load(f)
        try:
            self.q_rank = int(c["q_lora_rank"])  # 0: a full-rank q_proj
            self.kv_rank = int(c["kv_lora_rank"])
            self.nope = int(c["qk_head_dim"])
            self.rope = int(c["qk_pos_emb_head_dim"])
            self.v_dim = int(c["v_head_dim"])
            self.yarn = bool(c["yarn"])
            self.factor = float(c["rotary_scaling_factor"])
            self.original = int(c["original_max_position_embeddings"])
            self.beta_fast = float(c["beta_fast"])
            self.beta_slow = float(c["beta_slow"])
            self.mscale = float(c["mscale"])
            self.mscale_all_dim = float(c["mscale_all_dim"])
        except (KeyError, TypeError, ValueError) as e:
            raise base.UsageError(f"{path}: bad or missing key: {e}") from None
        # DeepSeek names its MoE layers as Qwen3-MoE does (mlp.gate, mlp.experts.E.gate_proj, ...): torch_moe picks
        # those names by this flag. MLA itself has no per-head q/k norm.
        self.qk_norm = True
        self.mtp_layers = int(c.get("mtp_num_layers", 0))
        self.mtp_scale = float(c.get("mtp_loss_scaling_factor", 0.1))
        if self.rope % 2 != 0:
            raise base.UsageError(f"{path}: qk_pos_emb_head_dim {self.rope} must be even")


def yarn_m(factor, x):
    return 1.0 if factor <= 1.0 else 0.1 * x * math.log(factor) + 1.0


def inv_frequencies(cfg):
    """[Dr/2] float64: plain RoPE, or YaRN's blend of interpolated and kept frequencies."""
    dim = cfg.rope
    extrapolated = 1.0 / cfg.theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if not cfg.yarn:
        return extrapolated
    interpolated = extrapolated / cfg.factor

    def index_of(turns):  # the (fractional) frequency index that turns `turns` times over the original context
        return dim * math.log(cfg.original / (turns * 2 * math.pi)) / (2 * math.log(cfg.theta))

    low = max(math.floor(index_of(cfg.beta_fast)), 0)
    high = min(math.ceil(index_of(cfg.beta_slow)), dim - 1)
    span = 0.001 if high == low else high - low
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / span).clamp(0, 1)  # 1: interpolate
    return interpolated * ramp + extrapolated * (1 - ramp)


def rope_tables(cfg, seq_len):
    """cos, sin [T, Dr] in the rotate-half layout, with YaRN's magnitude."""
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_frequencies(cfg))
    emb = torch.cat([freqs, freqs], dim=-1)
    magnitude = yarn_m(cfg.factor, cfg.mscale) / yarn_m(cfg.factor, cfg.mscale_all_dim) if cfg.yarn else 1.0
    return emb.cos() * magnitude, emb.sin() * magnitude


def rotate(x, cos, sin):
    """x [B, H, T, Dr] as the projection wrote it (pairs interleaved): de-interleave, then rotate half."""
    b, h, t, d = x.shape
    x = x.view(b, h, t, d // 2, 2).transpose(3, 4).reshape(b, h, t, d)
    return x * cos + base.rotate_half(x) * sin


def mla_attention(cfg, p, x, cos, sin):
    b, t, _ = x.shape
    heads, dqk = cfg.heads, cfg.nope + cfg.rope
    if cfg.q_rank > 0:
        q = base.rms_norm(x @ p["self_attn.q_a_proj.weight"].T, p["self_attn.q_a_layernorm.weight"], cfg.eps)
        q = q @ p["self_attn.q_b_proj.weight"].T
    else:
        q = x @ p["self_attn.q_proj.weight"].T
    q = q.view(b, t, heads, dqk).transpose(1, 2)  # [B, H, T, Dn + Dr]
    q_nope, q_pe = q[..., :cfg.nope], q[..., cfg.nope:]
    kv_a = x @ p["self_attn.kv_a_proj_with_mqa.weight"].T  # [B, T, R + Dr]
    compressed, k_pe = kv_a[..., :cfg.kv_rank], kv_a[..., cfg.kv_rank:]
    k_pe = k_pe.view(b, t, 1, cfg.rope).transpose(1, 2)  # [B, 1, T, Dr]
    kv = base.rms_norm(compressed, p["self_attn.kv_a_layernorm.weight"], cfg.eps) @ p["self_attn.kv_b_proj.weight"].T
    kv = kv.view(b, t, heads, cfg.nope + cfg.v_dim).transpose(1, 2)
    k_nope, v = kv[..., :cfg.nope], kv[..., cfg.nope:]
    q_pe, k_pe = rotate(q_pe, cos, sin), rotate(k_pe, cos, sin)
    query = torch.cat([q_nope, q_pe], dim=-1)
    key = torch.cat([k_nope, k_pe.expand(b, heads, t, cfg.rope)], dim=-1)
    scale = dqk ** -0.5 * (yarn_m(cfg.factor, cfg.mscale_all_dim) ** 2 if cfg.yarn else 1.0)
    scores = (query @ key.transpose(-1, -2)) * scale
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # [B, H, T, Dv]
    return out.transpose(1, 2).reshape(b, t, heads * cfg.v_dim) @ p["self_attn.o_proj.weight"].T


def shifted(x, k, fill):
    """x [B, T] moved k positions left within each row, the last k positions set to `fill`."""
    out = torch.full_like(x, fill)
    out[:, :x.shape[1] - k] = x[:, k:]
    return out


def forward(cfg, params, input_ids, labels):
    """(mean cross-entropy, Σ router losses[, weighted multi-token prediction losses]): torch_moe's model with MLA in
    place of its attention, and the multi-token prediction modules when mla.json has them."""
    h, router_losses, (cos, sin) = moe.trunk(cfg, params, input_ids, attention=mla_attention,
                                             rope_tables=lambda c, t, _dtype: rope_tables(c, t))
    ce = moe.output_loss(cfg, params, h, labels)
    if cfg.mtp_layers == 0:
        return ce, router_losses
    mtp_losses = []
    for k in range(1, cfg.mtp_layers + 1):
        pre = f"model.layers.{cfg.layers + k - 1}."
        e = params["model.embed_tokens.weight"][shifted(input_ids, k, 0)]
        joined = torch.cat([base.rms_norm(e, params[pre + "enorm.weight"], cfg.eps),
                            base.rms_norm(h, params[pre + "hnorm.weight"], cfg.eps)], dim=-1)
        h, losses = moe.decoder_layer(cfg, params, pre, cfg.layer_is_moe[cfg.layers - 1],
                                      joined @ params[pre + "eh_proj.weight"].T, cos, sin, mla_attention)
        router_losses = router_losses + losses
        mtp_losses.append(moe.output_loss(cfg, params, h, shifted(labels, k, -100), norm=pre + "shared_head.norm.weight"))
    return ce, router_losses, cfg.mtp_scale / cfg.mtp_layers * sum(mtp_losses)


def main(argv=None):
    return moe.main(argv, name="torch_mla", doc=__doc__, config_file="mla.json", config_class=MlaConfig,
                    forward_fn=forward)


if __name__ == "__main__":
    sys.exit(main())
