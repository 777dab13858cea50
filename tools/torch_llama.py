#!/usr/bin/env python3
"""PyTorch reference for Llama / Qwen3 training: the golden side of the parity tests.

Reads a Hugging Face model directory (config.json + model.safetensors in F32) and a batch
(input_ids, labels), then writes the loss and every parameter's gradient at the given weights, and the
losses of a few AdamW steps on the same batch. The math follows Hugging Face LlamaForCausalLM and
Qwen3ForCausalLM, written out functionally so that each step is visible. Needs only torch and numpy:
safetensors files are read and written here with json + numpy.

Exit codes: 0 ok, 2 bad arguments or unsupported config, 3 unreadable or corrupt input file.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

# safetensors dtype name -> numpy dtype (BF16 is read as raw uint16 and widened by hand).
_NP_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}
_ST_NAMES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.int64): "I64",
             np.dtype(np.int32): "I32"}
_MAX_HEADER = 100_000_000


class UsageError(Exception):
    """Bad arguments or an unsupported model config (exit 2)."""


class FileFormatError(Exception):
    """Unreadable or corrupt input file (exit 3)."""


# ----------------------------------------------------------------------------------------------- safetensors

def read_safetensors(path):
    """Returns {name: np.ndarray} with the checks of FORMATS.md section 4; BF16 comes back as float32."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise FileFormatError(f"{path}: cannot read: {e.strerror}") from None
    if len(blob) < 8:
        raise FileFormatError(f"{path}: {len(blob)} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > _MAX_HEADER or 8 + n > len(blob):
        raise FileFormatError(f"{path}: header length {n} does not fit in a {len(blob)}-byte file")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FileFormatError(f"{path}: header is not UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise FileFormatError(f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    data = memoryview(blob)[8 + n:]
    spans = []
    out = {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise FileFormatError(f"{path}: tensor '{name}': malformed entry {info!r}") from None
        if dtype not in _NP_DTYPES:
            raise FileFormatError(f"{path}: tensor '{name}': unsupported dtype {dtype}")
        np_dtype = np.dtype(_NP_DTYPES[dtype])
        count = int(np.prod(shape, dtype=np.int64))
        if not (0 <= begin <= end <= len(data)) or end - begin != count * np_dtype.itemsize:
            raise FileFormatError(f"{path}: tensor '{name}': offsets [{begin}, {end}] do not match "
                                  f"{dtype}{shape} in a {len(data)}-byte data section")
        spans.append((begin, end, name))
        arr = np.frombuffer(data[begin:end], dtype=np_dtype).reshape(shape)
        if dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.copy()
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            raise FileFormatError(f"{path}: tensor '{name}' starts at {begin}, expected {pos} (gap or overlap)")
        pos = end
    if pos != len(data):
        raise FileFormatError(f"{path}: data section is {len(data)} bytes but tensors cover {pos}")
    return out


def write_safetensors(path, tensors):
    """Writes {name: np.ndarray}: sorted by dtype size (largest first) then name, header padded to 8 bytes."""
    arrays = {k: np.asarray(v, order="C") for k, v in tensors.items()}  # keeps rank 0
    order = sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k))
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in order:
        a = arrays[name]
        header[name] = {"dtype": _ST_NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in order:
            f.write(arrays[name].astype(arrays[name].dtype.newbyteorder("<"), copy=False).tobytes())


# ------------------------------------------------------------------------------------------------ config

class ModelConfig:
    """The Hugging Face config.json fields the model uses, with Hugging Face defaults."""

    def __init__(self, path):
        try:
            with open(path, encoding="utf-8") as f:
                c = json.load(f)
        except OSError as e:
            raise FileFormatError(f"{path}: cannot read: {e.strerror}") from None
        except ValueError as e:
            raise FileFormatError(f"{path}: not valid JSON: {e}") from None

        def need(key):
            if key not in c:
                raise UsageError(f"{path}: missing key '{key}'")
            return c[key]

        self.model_type = need("model_type")
        if self.model_type not in ("llama", "qwen3"):
            raise UsageError(f"{path}: model_type '{self.model_type}' is not supported (llama, qwen3)")
        try:
            self.vocab_size = int(need("vocab_size"))
            self.hidden = int(need("hidden_size"))
            self.ffn = int(need("intermediate_size"))
            self.layers = int(need("num_hidden_layers"))
            self.heads = int(need("num_attention_heads"))
            self.kv_heads = int(c.get("num_key_value_heads") or self.heads)
            self.head_dim = int(c.get("head_dim") or self.hidden // self.heads)
            self.eps = float(c.get("rms_norm_eps", 1e-6))
            self.theta = float(c.get("rope_theta", 10000.0))
        except (TypeError, ValueError, ZeroDivisionError) as e:
            raise UsageError(f"{path}: bad shape value: {e}") from None
        if min(self.vocab_size, self.hidden, self.ffn, self.layers, self.heads, self.kv_heads, self.head_dim) <= 0:
            raise UsageError(f"{path}: sizes must be positive")
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.qk_norm = self.model_type == "qwen3"
        self.rope_scaling = c.get("rope_scaling")
        if self.heads % self.kv_heads:
            raise UsageError(f"{path}: num_attention_heads {self.heads} is not a multiple of "
                             f"num_key_value_heads {self.kv_heads}")
        if c.get("hidden_act", "silu") != "silu":
            raise UsageError(f"{path}: hidden_act '{c['hidden_act']}' is not supported (silu)")
        for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
            if c.get(key):
                raise UsageError(f"{path}: '{key}: true' is not supported")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in ("llama3", "default"):
                raise UsageError(f"{path}: rope_scaling type '{kind}' is not supported (llama3)")
            if kind == "default":
                self.rope_scaling = None


# ------------------------------------------------------------------------------------------------- model

def param_shapes(cfg):
    """Every parameter's Hugging Face name and shape, in checkpoint order."""
    q_out, kv_out = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (cfg.hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (q_out, cfg.hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, cfg.hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, cfg.hidden)
        shapes[p + "self_attn.o_proj.weight"] = (cfg.hidden, q_out)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (cfg.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (cfg.head_dim,)
        shapes[p + "post_attention_layernorm.weight"] = (cfg.hidden,)
        shapes[p + "mlp.gate_proj.weight"] = (cfg.ffn, cfg.hidden)
        shapes[p + "mlp.up_proj.weight"] = (cfg.ffn, cfg.hidden)
        shapes[p + "mlp.down_proj.weight"] = (cfg.hidden, cfg.ffn)
    shapes["model.norm.weight"] = (cfg.hidden,)
    if not cfg.tied:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden)
    return shapes


def inv_frequencies(cfg):
    """[head_dim / 2] float64: 1 / theta^(2i/D), then Llama 3 scaling as in HF _compute_llama3_parameters."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if cfg.rope_scaling is None:
        return inv_freq
    rs = cfg.rope_scaling
    factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    orig = float(rs["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = orig / low, orig / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(cfg, seq_len, dtype):
    """cos, sin [T, head_dim] in the rotate-half layout; angles computed in float64, then cast."""
    pos = torch.arange(seq_len, dtype=torch.float64)
    freqs = torch.outer(pos, inv_frequencies(cfg))  # [T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def attention(cfg, p, x, cos, sin):
    b, t, _ = x.shape
    q = (x @ p["self_attn.q_proj.weight"].T).view(b, t, cfg.heads, cfg.head_dim)  # [B, T, Hq, D]
    k = (x @ p["self_attn.k_proj.weight"].T).view(b, t, cfg.kv_heads, cfg.head_dim)  # [B, T, Hkv, D]
    v = (x @ p["self_attn.v_proj.weight"].T).view(b, t, cfg.kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q = rms_norm(q, p["self_attn.q_norm.weight"], cfg.eps)
        k = rms_norm(k, p["self_attn.k_norm.weight"], cfg.eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    group = cfg.heads // cfg.kv_heads  # query head h reads kv head h // group
    k = k.repeat_interleave(group, dim=1)  # [B, Hq, T, D]
    v = v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(cfg.head_dim)  # [B, Hq, T, T]
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # [B, Hq, T, D]
    out = out.transpose(1, 2).reshape(b, t, cfg.heads * cfg.head_dim)
    return out @ p["self_attn.o_proj.weight"].T  # [B, T, C]


def mlp(p, x):
    gate = torch.nn.functional.silu(x @ p["mlp.gate_proj.weight"].T)
    return (gate * (x @ p["mlp.up_proj.weight"].T)) @ p["mlp.down_proj.weight"].T


def forward_loss(cfg, params, input_ids, labels):
    """Mean cross-entropy over positions with label >= 0; label[b, t] is the target of position t (no shift)."""
    _, t = input_ids.shape
    dtype = params["model.embed_tokens.weight"].dtype
    cos, sin = rope_tables(cfg, t, dtype)
    x = params["model.embed_tokens.weight"][input_ids]  # [B, T, C]
    for i in range(cfg.layers):
        pre = f"model.layers.{i}."
        p = {k[len(pre):]: v for k, v in params.items() if k.startswith(pre)}
        x = x + attention(cfg, p, rms_norm(x, p["input_layernorm.weight"], cfg.eps), cos, sin)
        x = x + mlp(p, rms_norm(x, p["post_attention_layernorm.weight"], cfg.eps))
    x = rms_norm(x, params["model.norm.weight"], cfg.eps)
    head = params["model.embed_tokens.weight" if cfg.tied else "lm_head.weight"]
    logits = x @ head.T  # [B, T, V]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), labels.reshape(-1),
                                             ignore_index=-100, reduction="mean")


# -------------------------------------------------------------------------------------------------- main

def load_model(model_dir, dtype):
    cfg = ModelConfig(os.path.join(model_dir, "config.json"))
    path = os.path.join(model_dir, "model.safetensors")
    tensors = read_safetensors(path)
    shapes = param_shapes(cfg)
    extra = sorted(set(tensors) - set(shapes))
    if extra:
        hint = " (config.json says tie_word_embeddings: true)" if "lm_head.weight" in extra else ""
        raise FileFormatError(f"{path}: unexpected tensor '{extra[0]}'{hint}")
    params = {}
    for name, shape in shapes.items():
        if name not in tensors:
            raise FileFormatError(f"{path}: missing tensor '{name}'")
        if tuple(tensors[name].shape) != shape:
            raise FileFormatError(f"{path}: tensor '{name}' has shape {list(tensors[name].shape)}, "
                                  f"config.json implies {list(shape)}")
        params[name] = torch.tensor(tensors[name], dtype=dtype, requires_grad=True)
    return cfg, params


def load_batch(path, cfg):
    tensors = read_safetensors(path)
    for key in ("input_ids", "labels"):
        if key not in tensors:
            raise FileFormatError(f"{path}: missing tensor '{key}'")
    ids, labels = tensors["input_ids"], tensors["labels"]
    if ids.ndim != 2 or labels.shape != ids.shape or ids.size == 0:
        raise FileFormatError(f"{path}: input_ids {list(ids.shape)} and labels {list(labels.shape)} "
                              "must be the same non-empty [B, T]")
    if ids.dtype.kind not in "iu" or labels.dtype.kind not in "iu":
        raise FileFormatError(f"{path}: input_ids and labels must be integer tensors (I32)")
    if ids.min() < 0 or ids.max() >= cfg.vocab_size:
        raise FileFormatError(f"{path}: input_ids outside [0, {cfg.vocab_size})")
    if labels.max() >= cfg.vocab_size:
        raise FileFormatError(f"{path}: labels reach {labels.max()}, vocab_size is {cfg.vocab_size}")
    if labels.max() < 0:
        raise FileFormatError(f"{path}: every label is negative (ignored); the loss is undefined")
    labels = np.where(labels < 0, -100, labels)
    return torch.tensor(ids.astype(np.int64)), torch.tensor(labels.astype(np.int64))


def run(args):
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    cfg, params = load_model(args.model_dir, dtype)
    input_ids, labels = load_batch(args.batch, cfg)
    names = list(params)
    decay = [params[n] for n in names if params[n].ndim >= 2]
    no_decay = [params[n] for n in names if params[n].ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    out = {}
    losses = []
    rows = args.micro_batch_size or input_ids.shape[0]
    if input_ids.shape[0] % rows != 0:
        raise UsageError(f"--micro-batch-size {rows} does not divide the batch's {input_ids.shape[0]} rows")
    batches = input_ids.shape[0] // rows
    for step in range(max(args.steps, 1)):
        opt.zero_grad(set_to_none=True)
        first = (step % batches) * rows  # step i trains on micro-batch i mod (rows / micro-batch size)
        loss = forward_loss(cfg, params, input_ids[first:first + rows], labels[first:first + rows])
        loss.backward()
        if step == 0:  # loss and raw (unclipped) gradients at the given weights
            out["loss"] = np.array(loss.item(), dtype=np.float32)
            for n in names:
                out["grad." + n] = params[n].grad.detach().numpy().astype(np.float32)
        if step >= args.steps:
            break
        losses.append(loss.item())
        if args.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_([params[n] for n in names], args.clip_grad)
        opt.step()
    out["losses"] = np.array(losses, dtype=np.float32)
    try:
        write_safetensors(args.out, out)
    except OSError as e:
        raise FileFormatError(f"{args.out}: cannot write: {e.strerror}") from None


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="directory with config.json and model.safetensors (F32)")
    ap.add_argument("--batch", required=True, help="safetensors with input_ids [B,T] and labels [B,T] (I32)")
    ap.add_argument("--out", required=True, help="safetensors to write: loss, grad.<name>, losses")
    ap.add_argument("--steps", type=int, default=10, help="AdamW steps on the batch (default 10)")
    ap.add_argument("--micro-batch-size", type=int, default=0,
                    help="rows per step: step i uses rows [i*N, (i+1)*N) modulo the batch (default: every row)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1, help="applied to parameters with ndim >= 2 only")
    ap.add_argument("--clip-grad", type=float, default=1.0, help="global L2 clip before each step; 0 disables")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="working precision")
    args = ap.parse_args(argv)
    if args.steps < 0:
        ap.error("--steps must be >= 0")
    if args.micro_batch_size < 0:
        ap.error("--micro-batch-size must be >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except UsageError as e:
        print(f"torch_llama: {e}", file=sys.stderr)
        return 2
    except FileFormatError as e:
        print(f"torch_llama: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
